// Equivalence harness: trains one model in a single process (the reference) and the same
// model sharded over W thread-ranks, and records what must agree between the two: the loss
// and gradient norm of every step, and every parameter after the last step.
//
// The FSDP run's loss is the mean of the ranks' micro-batch losses, which equals the
// reference's mean over the global batch because every micro-batch has the same size.
#pragma once

#include <fsdp/clip_grad.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fsdp::test {

struct TrainCase {
  // Builds the model with deterministic initial values (same on every call). mesh is null for
  // the reference; a builder may shard units while it builds them (deferred initialization).
  std::function<std::shared_ptr<torch::nn::Module>(const DeviceMesh* mesh)> make_model;
  // Applies fully_shard to the units of model, root last.
  std::function<void(const std::shared_ptr<torch::nn::Module>&, const DeviceMesh&)> shard;
  // The loss of model on (inputs, targets); calls the root through fsdp::forward.
  std::function<at::Tensor(const std::shared_ptr<torch::nn::Module>&, const at::Tensor&,
                           const at::Tensor&)>
      loss;
  // The global batch of a step: (inputs, targets), sliced along dim 0 into W micro-batches.
  std::function<std::pair<at::Tensor, at::Tensor>(int64_t step)> batch;
  // Parameters and floating inputs are converted to this dtype before sharding. float64 runs
  // separate algorithmic differences from float32 rounding noise.
  at::ScalarType dtype = at::kFloat;
  int64_t steps = 10;
  double lr = 1e-2;
  double weight_decay = 0.1;
  // AdamW's eps. A larger one keeps an update proportional to a gradient much smaller than it:
  // for models with directions of zero true gradient (an attention key's bias: softmax ignores
  // a shift common to a query's scores), whose gradient is rounding noise that the default
  // would turn into a full-size step with the noise's sign, different in each run.
  // (optional) defaults to AdamW's 1e-8.
  double adam_eps = 1e-8;
  double max_grad_norm = 1.0;
  // Backward passes per optimizer step (micro-batch accumulation without zero_grad).
  int accumulation = 1;
  // Sharded runs: the mesh's replicate dimension (1: a 1-D mesh over all ranks; W: DDP-style).
  int replicate = 1;
  // Sharded runs only: called before each micro-batch's forward (e.g. to switch gradient sync).
  std::function<void(const std::shared_ptr<torch::nn::Module>&, int micro)> before_micro_batch;
};

struct TrainRecord {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  // Reference: full values. FSDP: rank's padded shards, keyed by unique parameter name.
  std::map<std::string, at::Tensor> params;
  std::map<std::string, ShardMetadata> metadata;  // FSDP only
};

TrainRecord train_reference(const TrainCase& c);
// Single-process mixed precision: fp32 master weights and optimizer; each step copies them into
// a param_dtype model, runs forward and backward there, and hands the fp32-cast gradients to
// the master parameters.
TrainRecord train_reference_mixed(const TrainCase& c, at::ScalarType param_dtype);

// Makes every unit under model that reports nowhere report to monitor (train_sharded gives
// each rank's units one), and the stats of the RankMonitor the model's units report to.
void observe_with(const torch::nn::Module& model, const std::shared_ptr<RankMonitor>& monitor);
RankStats& stats_of(const torch::nn::Module& model);

// Per-rank records of a W-rank run.
std::vector<TrainRecord> train_sharded(
    const TrainCase& c, int world,
    std::function<void(int rank, const std::shared_ptr<torch::nn::Module>&, const DeviceMesh&)>
        after_step = nullptr);

// Asserts losses and grad norms within rel_tol and every parameter (the rows each rank owns)
// within abs_tol, and the padding rows zero.
void expect_equivalent(const TrainRecord& reference, const std::vector<TrainRecord>& ranks,
                       double rel_tol, double abs_tol);
// Asserts bit-identical losses, grad norms and parameters (W = 1).
void expect_bit_identical(const TrainRecord& reference, const TrainRecord& rank0);

// A deterministic tensor in [-scale, scale) from its own generator.
at::Tensor seeded_uniform(c10::IntArrayRef shape, uint64_t seed, double scale = 1.0);

}  // namespace fsdp::test
