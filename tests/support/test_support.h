// Helpers shared by the test binaries. Keep this small: a helper belongs here only once two
// test files need it.
#pragma once

#include <fsdp/comm/rendezvous.h>

#include "support/command.h"
#include "support/reference_cache.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::test {

// Group options for tests: a timeout short enough that a broken test fails instead of hanging.
ProcessGroupOptions test_options(std::chrono::milliseconds timeout = std::chrono::seconds(20));

// Runs fn(i) for i in [0, n) on n threads and joins them. Returns, per thread, the message of
// the exception it threw, or "" if it returned normally.
std::vector<std::string> run_threads(int n, const std::function<void(int)>& fn);

// The message of what fn throws, or "" if it returns normally.
std::string error_message(const std::function<void()>& fn);

// A program of this build (fsdp-train, fsdp-estimate, ...): $FSDP_BIN_DIR/name, or ./name
// (ctest runs the test binaries in the build directory, where the programs are).
std::string program_path(const std::string& name);
inline std::string fsdp_train_binary() { return program_path("fsdp-train"); }

// fsdp-train with args (the command line after the program name), as run_command runs it.
inline CommandResult run_fsdp_train(const std::string& args, int limit_s = 240) {
  return run_command(fsdp_train_binary() + " " + args, limit_s);
}

// The python whose torch this build's LibTorch comes from, with the reference packages the
// tests compare against (transformers, tokenizers): $FSDP_PYTHON, else the interpreter CMake
// found (tests/CMakeLists.txt; scripts/run.sh passes the project's .venv). Throws unless the
// path is absolute: ctest runs each test from the build directory, where a path relative to
// the source tree names nothing.
std::string reference_python();

// A global batch of byte tokens for step `step`: (inputs, targets), each [batch, seq_len] int64,
// targets shifted left by one, windows of a fixed English text at offsets drawn from (seed,
// step) alone, so every rank and the single-process reference see the same batch. For the
// runtime's equivalence tests, which need real-looking text but not the trainer.
std::pair<at::Tensor, at::Tensor> text_batch(int64_t step, int64_t batch, int64_t seq_len,
                                             uint64_t seed);

// A path for a test's scratch file: gtest's temp directory, this process's id and name, so that
// suites run at once (ctest -j, several builds on one machine) never share a file.
std::string temp_path(const std::string& name);

// The elements of a model's parameters, a tied tensor counted once (as an optimizer sees them):
// counted here by TensorImpl, independently of fsdp::unique_parameters.
int64_t distinct_numel(const torch::nn::Module& model);

// Every line of a JSON-lines file (fsdp-train's --metrics), parsed.
std::vector<nlohmann::json> read_json_lines(const std::string& path);

// Sets environment variables for its lifetime (nullopt unsets one) and restores the old values
// on destruction. Not thread-safe, like setenv itself: use it only from the test's main thread.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::optional<std::string>>> values);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace fsdp::test
