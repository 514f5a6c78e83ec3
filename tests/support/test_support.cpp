// Shared test helpers; see test_support.h. Nothing here may block without a bound: a helper
// that hangs turns one failing test into a stuck suite.
#include "support/test_support.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <thread>
#include <unordered_set>

namespace fsdp::test {

std::string program_path(const std::string& name) {
  const char* dir = std::getenv("FSDP_BIN_DIR");
  return (dir != nullptr && *dir != '\0' ? std::string(dir) : std::string(".")) + "/" + name;
}

namespace {

// Text the batches are cut from: plain prose with punctuation, digits and line breaks, so that
// a byte-level model has something to learn in a few steps.
constexpr char kText[] =
    "A sharded model keeps one slice of every parameter on each rank. Before a block runs, the\n"
    "ranks gather its slices into the full weights; after it ran, they free them again. In the\n"
    "backward pass the same block is gathered once more, its gradients are computed, and a\n"
    "reduce-scatter leaves each rank with the summed gradient of its own slice. The optimizer\n"
    "then updates only that slice, so 4 ranks hold 1/4 of the weights, 1/4 of the gradients\n"
    "and 1/4 of the optimizer state, at the price of 3 collectives per block and step.\n"
    "Overlap hides most of that price: while block 7 computes, block 8 is already being\n"
    "gathered, and while block 3 runs its backward, the gradients of block 4 travel.\n";

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> text_batch(int64_t step, int64_t batch, int64_t seq_len,
                                             uint64_t seed) {
  const int64_t size = static_cast<int64_t>(sizeof(kText)) - 1;
  TORCH_CHECK(seq_len + 1 <= size, "text_batch: seq_len ", seq_len, " is longer than the text");
  at::Tensor inputs = at::empty({batch, seq_len}, at::kLong);
  at::Tensor targets = at::empty({batch, seq_len}, at::kLong);
  uint64_t state = seed * 0x2545F4914F6CDD1DULL + static_cast<uint64_t>(step);
  auto* in = inputs.data_ptr<int64_t>();
  auto* out = targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t offset = static_cast<int64_t>(splitmix64(state) % (size - seq_len));
    for (int64_t t = 0; t < seq_len; ++t) {
      in[b * seq_len + t] = static_cast<unsigned char>(kText[offset + t]);
      out[b * seq_len + t] = static_cast<unsigned char>(kText[offset + t + 1]);
    }
  }
  return {inputs, targets};
}

std::string temp_path(const std::string& name) {
  std::string base = ::testing::TempDir();
  if (!base.empty() && base.back() != '/') base += '/';
  return base + "fsdp_" + std::to_string(::getpid()) + "_" + name;
}

int64_t distinct_numel(const torch::nn::Module& model) {
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t total = 0;
  for (const auto& p : model.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) total += p.numel();
  }
  return total;
}

std::string reference_python() {
  const char* from_env = std::getenv("FSDP_PYTHON");
  const std::string python = from_env != nullptr && *from_env != '\0' ? from_env : FSDP_PYTHON;
  TORCH_CHECK(!python.empty() && python.front() == '/', "the reference python '", python,
              "' (FSDP_PYTHON, or CMake's -DFSDP_PYTHON) is not an absolute path; ctest runs "
              "tests from the build directory, so give e.g. $PWD/.venv/bin/python3");
  return python;
}

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}
ProcessGroupOptions test_options(std::chrono::milliseconds timeout) {
  ProcessGroupOptions options;
  options.timeout = timeout;
  // Flight records of tests that fail a collective on purpose go to the temp directory, not to
  // the build tree.
  options.flight_recorder_dir = ::testing::TempDir();
  return options;
}

std::vector<std::string> run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        errors[i] = fsdp::error_message(std::current_exception());
        if (errors[i].empty()) {
          errors[i] = "(exception with an empty message)";
        }
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  return errors;
}

std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (...) {
    return fsdp::error_message(std::current_exception());
  }
  return "";
}

ScopedEnv::ScopedEnv(std::vector<std::pair<std::string, std::optional<std::string>>> values) {
  for (auto& [name, value] : values) {
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
}

ScopedEnv::~ScopedEnv() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->second) {
      ::setenv(it->first.c_str(), it->second->c_str(), 1);
    } else {
      ::unsetenv(it->first.c_str());
    }
  }
}

}  // namespace fsdp::test
