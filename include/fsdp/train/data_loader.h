// The loader of a training run: walks a TokenDataset (fsdp/train/token_dataset.h) one step at a
// time and hands each rank its rows of the step's global batch.
//
// A step's batch is a pure function of (data, seed, step, global_batch, seq_len): nothing but
// the step number carries from one batch to the next, so the loader's whole position is the
// next step, and a run that resumes from a checkpoint (state_json() saved with it,
// load_state_json() on resume) trains on exactly the batches of an uninterrupted run. The world
// size only decides which rows a rank keeps: the ranks' rows, concatenated in rank order, are the
// global batch.
#pragma once

#include <fsdp/train/token_dataset.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>

namespace fsdp::train {

struct DataLoaderOptions {
  // Sequences per step over all ranks; world_size must divide it. (optional) defaults to 16.
  TORCH_ARG(int64_t, global_batch) = 16;
  // Tokens per sequence (a window of seq_len + 1 tokens gives inputs and targets).
  // (optional) defaults to 64.
  TORCH_ARG(int64_t, seq_len) = 64;
  // Seed of the window offsets. (optional) defaults to 0.
  TORCH_ARG(uint64_t, seed) = 0;
  // This process's rank and the number of ranks. (optional) default to 0 and 1.
  TORCH_ARG(int64_t, rank) = 0;
  TORCH_ARG(int64_t, world_size) = 1;
  // The first step next() returns. (optional) defaults to 0.
  TORCH_ARG(int64_t, first_step) = 0;
};

// One step's batch: this rank's rows and the whole global batch they come from.
struct Batch {
  int64_t step = 0;    // 0-based
  at::Tensor inputs;   // [global_batch / world_size, seq_len] int64, this rank's rows
  at::Tensor targets;  // same shape: the inputs shifted left by one (labeled data: the labels)
  at::Tensor global_inputs;   // [global_batch, seq_len] int64, every rank's rows
  at::Tensor global_targets;  // [global_batch, seq_len] int64
};

class DataLoader {
 public:
  // Keeps a reference to data, which must outlive the loader. Throws naming the values when
  // rank is outside [0, world_size), world_size does not divide global_batch, or data holds no
  // window of seq_len + 1 tokens.
  DataLoader(const TokenDataset& data, const DataLoaderOptions& options);
  // A temporary data set would be gone before the first batch: keep it in a variable.
  DataLoader(TokenDataset&& data, const DataLoaderOptions& options) = delete;

  // The batch of step(), then advances to the next step.
  Batch next();
  // The batch of any step, without moving. Thread-safe.
  Batch batch_at(int64_t step) const;

  // The step next() returns.
  int64_t step() const { return step_; }
  // Moves to step (>= 0).
  void seek(int64_t step);

  // The position as a JSON object, for a checkpoint's user JSON: {"source", "tokens",
  // "next_step", "seed", "global_batch", "seq_len"}.
  std::string state_json() const;
  // Continues at state_json's "next_step". Throws naming both values when the state was saved
  // over another number of tokens or with another seed, global batch or sequence length (the
  // position would then name other batches), or when it is not such an object.
  void load_state_json(const std::string& state);

  const DataLoaderOptions& options() const { return options_; }
  const TokenDataset& data() const { return data_; }

 private:
  const TokenDataset& data_;
  DataLoaderOptions options_;
  int64_t step_ = 0;
};

}  // namespace fsdp::train
