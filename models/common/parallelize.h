// The part of the families' tensor-parallel plans that only the root's module names tell apart:
// the root of a causal language model (embedding table, final norm, head; GPT-2's positions).
#pragma once

#include <fsdp/tensor_parallel.h>

#include <cstdint>
#include <string>

namespace fsdp::models {

// Whether a vocabulary of vocab entries splits over tp ranks: the root plans below split the
// table and the head then, and the families' memory specs count them so. It need not divide:
// rank r holds tensor_parallel_range(vocab, tp, r) ([Note: an uneven vocabulary]), as long as
// every rank gets some.
inline bool vocabulary_splits(int64_t vocab, int tp) {
  return tp > 1 && tensor_parallel_range(vocab, tp, tp - 1).length >= 1;
}

// Paths, relative to the root, of the modules its plan styles; positions "" when the model has
// no positional embedding.
struct RootModules {
  std::string table;
  std::string head;
  std::string norm;
  std::string positions;
};

// The root's plan over tp ranks: when the vocabulary splits, the table RowwiseParallel and the
// head ColwiseParallel, both over the vocabulary (the table first, so that a head tied to it
// finds it split); under sequence parallelism their outputs and the head's input in sequence
// shards, or, with a whole vocabulary, the table's output scattered and the head's input
// gathered, and the positions scattered, the final norm SequenceParallel. Empty when tp is 1, or
// when the vocabulary does not split without sequence parallelism.
TensorParallelPlan root_tp_plan(const RootModules& modules, int64_t vocab, int tp,
                                bool sequence_parallel);

}  // namespace fsdp::models
