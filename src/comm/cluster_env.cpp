// Launch variables of Slurm and Open MPI, and the transport address of a multi-host run
// (see cluster_env.h).
//
// The transport address matters because gloo binds one address per rank and announces it to
// the others: 127.0.0.1 serves one host only. Asking the kernel which source address it would
// use towards the master (connect() on a UDP socket sends nothing) picks the interface that
// actually routes between the hosts, without naming interfaces per cluster.
#include "cluster_env.h"

#include <c10/util/Exception.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace fsdp::detail {
namespace {

// The variable each launcher sets for a rank's global rank; its presence says which launched us.
constexpr char kSlurmRank[] = "SLURM_PROCID";
constexpr char kOpenMpiRank[] = "OMPI_COMM_WORLD_RANK";

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// The integer in variable name, which the launcher that set `marker` (kSlurmRank for srun,
// kOpenMpiRank for mpirun) also sets.
int env_int(const char* name, const char* marker = kSlurmRank) {
  const auto value = env_value(name);
  TORCH_CHECK(value.has_value(), "fsdp: ", marker, " is set but ", name,
              " is not; launch with srun or mpirun, or set RANK, WORLD_SIZE, LOCAL_RANK, "
              "MASTER_ADDR and MASTER_PORT");
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value->c_str(), &end, 10);
  TORCH_CHECK(!value->empty() && *end == '\0' && errno == 0 && parsed >= 0 && parsed <= 1 << 30,
              "fsdp: environment variable ", name, "='", *value, "' is not a non-negative integer");
  return static_cast<int>(parsed);
}

int slurm_master_port() {
  if (env_value("MASTER_PORT")) return env_int("MASTER_PORT");
  if (env_value("SLURM_JOB_ID")) return 20000 + env_int("SLURM_JOB_ID") % 20000;
  return 29500;
}

// Slurm's tasks per node, "2(x3),1" (two tasks on each of three nodes, then one), as the count
// of its first node: exact for the usual equal split. nullopt when neither variable is set.
std::optional<int> slurm_tasks_on_first_node() {
  const char* name = "SLURM_NTASKS_PER_NODE";
  auto value = env_value(name);
  if (!value) {
    name = "SLURM_TASKS_PER_NODE";
    value = env_value(name);
  }
  if (!value) return std::nullopt;
  const size_t digits = value->find_first_not_of("0123456789");
  const std::string count = value->substr(0, digits);
  TORCH_CHECK(
      !count.empty() && count.size() < 9 &&
          (digits == std::string::npos || (*value)[digits] == '(' || (*value)[digits] == ','),
      "fsdp: environment variable ", name, "='", *value,
      "' is not a Slurm task count (expected e.g. 4, 2(x3) or 2,1)");
  return std::max(1, std::stoi(count));
}

}  // namespace

std::string first_host_of(const std::string& hostlist) {
  const std::string first = hostlist.substr(0, hostlist.find_first_of(",["));
  TORCH_CHECK(!hostlist.empty() && !first.empty(), "fsdp: Slurm host list '", hostlist,
              "' names no host");
  if (hostlist.size() == first.size() || hostlist[first.size()] == ',') return first;
  // "prefix[03-05,9]...": the first entry of the bracket, with its zero padding.
  const size_t close = hostlist.find(']', first.size());
  const std::string range = hostlist.substr(first.size() + 1, close - first.size() - 1);
  const std::string low = range.substr(0, range.find_first_of(",-"));
  TORCH_CHECK(close != std::string::npos && !low.empty() &&
                  low.find_first_not_of("0123456789") == std::string::npos,
              "fsdp: Slurm host list '", hostlist, "' is malformed (expected e.g. node[01-04])");
  return first + low;
}

std::optional<LaunchEnv> launch_env_from_slurm() {
  if (!env_value(kSlurmRank)) return std::nullopt;
  LaunchEnv env;
  env.rank = env_int(kSlurmRank);
  env.world_size = env_int("SLURM_NTASKS");
  env.local_rank = env_int("SLURM_LOCALID");
  env.local_world_size = slurm_tasks_on_first_node().value_or(env.world_size);
  if (auto addr = env_value("MASTER_ADDR")) {
    env.master_addr = *addr;
  } else {
    auto nodes = env_value("SLURM_JOB_NODELIST");
    if (!nodes) nodes = env_value("SLURM_NODELIST");
    TORCH_CHECK(nodes.has_value(), "fsdp: SLURM_PROCID is set but neither SLURM_JOB_NODELIST ",
                "nor SLURM_NODELIST (nor MASTER_ADDR) names the master host");
    env.master_addr = first_host_of(*nodes);
  }
  env.master_port = slurm_master_port();
  return env;
}

std::optional<LaunchEnv> launch_env_from_open_mpi() {
  constexpr const char* kMarker = kOpenMpiRank;
  if (!env_value(kMarker)) return std::nullopt;
  LaunchEnv env;
  env.rank = env_int(kMarker, kMarker);
  env.world_size = env_int("OMPI_COMM_WORLD_SIZE", kMarker);
  env.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", kMarker);
  env.local_world_size = env_value("OMPI_COMM_WORLD_LOCAL_SIZE")
                             ? env_int("OMPI_COMM_WORLD_LOCAL_SIZE", kMarker)
                             : env.world_size;
  env.launched_by_mpirun = true;
  env.master_port = env_value("MASTER_PORT") ? env_int("MASTER_PORT", kMarker) : 29500;
  // mpirun names no host for rank 0. Given MASTER_ADDR (mpirun -x MASTER_ADDR=...), as with
  // torch's env:// rendezvous under mpirun, we use it; without, MPI itself carries the address
  // (see bootstrap.h, resolve_master), which a build without MPI cannot do.
  const auto addr = env_value("MASTER_ADDR");
  if (addr && !addr->empty()) {
    env.master_addr = *addr;
  } else {
    env.master_addr.clear();
    env.master_from_mpi = true;
  }
  return env;
}

bool cluster_launcher_present() { return env_value(kSlurmRank) || env_value(kOpenMpiRank); }

std::string transport_address_towards(const std::string& host) {
  if (auto forced = env_value("FSDP_HOSTNAME"); forced && !forced->empty()) return *forced;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  TORCH_CHECK(rc == 0 && found != nullptr, "fsdp: cannot resolve the master host '", host,
              "': ", ::gai_strerror(rc));
  sockaddr_in target{};
  std::memcpy(&target, found->ai_addr, sizeof(target));
  ::freeaddrinfo(found);
  if ((ntohl(target.sin_addr.s_addr) >> 24) == 127) return "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(fd >= 0, "fsdp: socket() failed: ", std::strerror(errno));
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int error = errno;
  ::close(fd);
  TORCH_CHECK(ok, "fsdp: no route from this host to the master '", host,
              "': ", std::strerror(error), " (set FSDP_HOSTNAME to this host's address)");
  char text[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace fsdp::detail
