// Small helpers for the checkpoint tests: models, fresh temporary directories and raw file bytes
// (to truncate and corrupt files on purpose), over support/files.h's POSIX calls (see its
// [Note: no std::filesystem near LibTorch]).
#pragma once

#include <fsdp/checkpoint/safetensors.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <models/gpt2/gpt2.h>

#include "support/files.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fsdp::test {

// GPT-2 of config initialized from seed; with a mesh, every block is sharded as it is built,
// then the root (fsdp-train's setup).
inline models::GPT2LMHead make_gpt2(const models::GPT2Config& config, uint64_t seed,
                                    const DeviceMesh* mesh) {
  models::GPT2Options options(config);
  options.seed(seed);
  if (mesh != nullptr) {
    options.on_block_built(
        [mesh](const std::string&, const std::shared_ptr<torch::nn::Module>& block) {
          fully_shard(block, *mesh);
        });
  }
  models::GPT2LMHead model(options);
  if (mesh != nullptr) fully_shard(model, *mesh);
  return model;
}

// AdamW at the checkpoint tests' learning rate over the model's distinct parameters.
inline torch::optim::AdamW make_adamw(const torch::nn::Module& model) {
  return torch::optim::AdamW(unique_parameters(model), torch::optim::AdamWOptions(3e-3));
}

// The largest absolute difference between same-named tensors of two safetensors files (every
// tensor of a, looked up in b), in float64.
inline double max_abs_difference(const std::string& a, const std::string& b) {
  const checkpoint::SafetensorsReader left(a);
  const checkpoint::SafetensorsReader right(b);
  double worst = 0;
  for (const auto& entry : left.header().entries) {
    const at::Tensor x = left.read(entry.name).to(at::kDouble);
    const at::Tensor y = right.read(entry.name).to(at::kDouble);
    worst = std::max(worst, (x - y).abs().max().item<double>());
  }
  return worst;
}

// The temp_dir()s this process made, removed when it exits (by the process that made them: a
// forked child that exits must not remove its parent's).
struct TempDirs {
  pid_t owner = ::getpid();
  std::vector<std::string> dirs;
  ~TempDirs() {
    if (::getpid() != owner) return;
    for (const auto& dir : dirs) remove_all(dir);
  }
};

inline TempDirs& temp_dirs() {
  static TempDirs made;
  return made;
}

// An empty directory under the test temp dir, unique per name and process, removed with
// everything in it when the process exits.
inline std::string temp_dir(const std::string& name) {
  std::string base = ::testing::TempDir();
  if (!base.empty() && base.back() != '/') base += '/';
  const std::string dir = base + "fsdp_ckpt_" + std::to_string(::getpid()) + "_" + name;
  remove_all(dir);
  ::mkdir(dir.c_str(), 0755);
  temp_dirs().dirs.push_back(dir);
  return dir;
}

// Copies the regular files of a flat directory into a new directory to.
inline void copy_flat_dir(const std::string& from, const std::string& to) {
  ::mkdir(to.c_str(), 0755);
  for (const auto& name : list_dir(from))
    write_bytes(to + "/" + name, read_bytes(from + "/" + name));
}

}  // namespace fsdp::test
