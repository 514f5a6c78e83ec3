// Local rank supervision for fsdp-train --nproc.
//
// The children are plain copies of this executable; they find each other through the c10d
// TCPStore that rank 0 hosts on MASTER_PORT. The parent never joins the group, so a child that
// dies is noticed here by waitpid and the survivors are stopped instead of waiting out their
// collective timeouts.
#include <common/launcher.h>

#include <fsdp/comm/rendezvous.h>

#include <c10/util/Exception.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

namespace fsdp::tools {

std::vector<std::string> strip_flag(const std::vector<std::string>& args, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag) {
      ++i;  // skip the value too
      continue;
    }
    if (args[i].rfind(flag + "=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

namespace {

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "ended";
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// In the child for `rank`: the torchrun-style environment, then exec of this program with args.
[[noreturn]] void exec_rank(int rank, int nproc, int port, int store_fd,
                            const std::vector<std::string>& args) {
  if (rank == 0) {
    ::setenv("FSDP_MASTER_LISTEN_FD", std::to_string(store_fd).c_str(), 1);
  } else {
    ::close(store_fd);
    ::unsetenv("FSDP_MASTER_LISTEN_FD");
  }
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv(kLocalRankMarker, "1", 1);
  std::vector<char*> argv;
  std::string self = "/proc/self/exe";
  argv.push_back(self.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(self.c_str(), argv.data());
  std::fprintf(stderr, "fsdp-train: exec of rank %d failed: %s\n", rank, std::strerror(errno));
  ::_exit(127);
}

void signal_all(const std::vector<pid_t>& pids, int signal) {
  for (pid_t p : pids)
    if (p > 0) ::kill(p, signal);
}

// Waits for every rank. The first to fail sets the result; the others then get SIGTERM, and
// SIGKILL 5 s later if they have not exited.
int wait_for_ranks(std::vector<pid_t>& pids) {
  const int nproc = static_cast<int>(pids.size());
  int result = 0, running = nproc;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    if (pid == 0) {  // stopping, nobody exited yet
      if (std::chrono::steady_clock::now() > stop_deadline) signal_all(pids, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    const int rank = static_cast<int>(it - pids.begin());
    *it = -1;
    --running;
    if (status != 0 && !stopping) {
      std::fprintf(stderr, "fsdp-train: rank %d of %d %s; stopping the other ranks\n", rank, nproc,
                   describe(status).c_str());
      result = exit_code_of(status);
      stopping = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      signal_all(pids, SIGTERM);
    }
  }
  return result;
}

}  // namespace

bool started_by_launch_local_ranks() { return std::getenv(kLocalRankMarker) != nullptr; }

int launch_local_ranks(int nproc, const std::vector<std::string>& args) {
  TORCH_CHECK(nproc >= 1, "--nproc must be at least 1, got ", nproc);
  // Rank 0's store takes over a socket bound here, so no other launcher can take the port
  // between our choosing it and rank 0 binding it (ctest -j runs many of us at once).
  std::optional<LoopbackSocket> store_socket(std::in_place);
  store_socket->inherit_across_exec();
  const int port = store_socket->port();
  std::vector<pid_t> pids(nproc, -1);
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    TORCH_CHECK(pid >= 0, "fork() for rank ", rank, " failed: ", std::strerror(errno));
    if (pid == 0) exec_rank(rank, nproc, port, store_socket->fd(), args);
    pids[rank] = pid;
  }
  store_socket.reset();  // rank 0 holds it now
  return wait_for_ranks(pids);
}

}  // namespace fsdp::tools
