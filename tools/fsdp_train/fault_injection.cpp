// The test-only faults of fault_injection.h. Each reads its environment variable when asked, so
// a run without them pays one getenv per step and changes nothing else.
#include <fsdp_train/fault_injection.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <unistd.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>

namespace fsdp::train {
namespace {

// Whether variable's <step>:<rank> list names (step, rank).
bool injected_at(const char* variable, int64_t step, int rank) {
  const char* value = std::getenv(variable);
  if (value == nullptr) return false;
  std::istringstream specs(value);
  std::string spec;
  while (std::getline(specs, spec, ',')) {
    long long s = 0, r = 0;
    TORCH_CHECK(std::sscanf(spec.c_str(), "%lld:%lld", &s, &r) == 2, variable,
                " entries must be <step>:<rank>, got '", spec, "'");
    if (s == step && r == rank) return true;
  }
  return false;
}

// Crash injection for the restart tests: the marker file makes the crash happen once, so the
// restarted job gets past the step it died at.
void kill_if_asked(int64_t step, int rank) {
  const char* value = std::getenv("FSDP_TRAIN_KILL_AT");
  if (value == nullptr) return;
  std::istringstream specs(value);
  std::string spec;
  while (std::getline(specs, spec, ',')) {
    long long s = 0, r = 0;
    char marker[4096] = {0};
    TORCH_CHECK(std::sscanf(spec.c_str(), "%lld:%lld:%4095s", &s, &r, marker) == 3,
                "FSDP_TRAIN_KILL_AT entries must be <step>:<rank>:<marker file>, got '", spec, "'");
    if (s != step || r != rank || ::access(marker, F_OK) == 0) continue;
    std::ofstream(marker) << "killed at step " << step << "\n";
    ::raise(SIGKILL);
  }
}

// Hang injection for the timeout tests: the rank stays alive but silent, as a rank stuck in a
// deadlock or on a dead NFS mount would; its peers must time out naming it.
void stall_if_asked(int64_t step, int rank) {
  const char* value = std::getenv("FSDP_TRAIN_STALL_AT");
  if (value == nullptr) return;
  long long s = 0, r = 0;
  TORCH_CHECK(std::sscanf(value, "%lld:%lld", &s, &r) == 2,
              "FSDP_TRAIN_STALL_AT must be <step>:<rank>, got '", value, "'");
  if (s != step || r != rank) return;
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

void crash_or_stall_if_asked(int64_t step, int rank) {
  kill_if_asked(step, rank);
  stall_if_asked(step, rank);
}

bool nan_injected_at(int64_t step, int rank) {
  return injected_at("FSDP_TRAIN_NAN_AT", step, rank);
}

bool overflow_injected_at(int64_t step, int rank) {
  return injected_at("FSDP_TRAIN_OVERFLOW_AT", step, rank);
}

void make_a_gradient_inf(const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    at::NoGradGuard no_grad;
    at::Tensor first = g;
    while (first.dim() > 0) first = first.select(0, 0);
    first.fill_(std::numeric_limits<double>::infinity());
    return;
  }
}

}  // namespace fsdp::train
