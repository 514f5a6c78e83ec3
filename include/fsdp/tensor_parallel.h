// Tensor parallelism (Megatron-LM's column and row splits of linear layers, and its sequence
// parallelism) over one mesh dimension, composable with fully_shard over another, as FSDP2's
// parallelize_module with its styles and fully_shard on the dp sub-mesh.
//
// parallelize_module(module, tp_mesh, plan) replaces the weights of the plan's linear layers by
// this rank's slice, in place (the parameters keep their identity, so optimizers and fully_shard
// see the local slices), and marks each planned module with its style. Call it before
// fully_shard: FSDP then shards the local slices over its own mesh (dim 0 of the local tensor,
// FSDP2's composition). The model applies the styles at its call sites: linear layers through
// fsdp::linear, parameters of whole-parameter styles through fsdp::tensor_parallel_parameter,
// and a module's input and output layouts through fsdp::tensor_parallel_input / _output.
//
//   ColwiseParallel: weight [out / T, in] (rows r*out/T.. of the full weight; of each block, for
//     a packed projection), bias [out / T]. Applies to a torch::nn::Linear or any module whose
//     2-D parameter "weight" it multiplies (a head tied to the embeddings, through
//     fsdp::tensor_parallel_linear). Input replicated (or gathered first from sequence shards,
//     for an input layout kSequenceShard); output this rank's slice of the last dimension (for
//     an output projection: logits split over the vocabulary, whose loss is
//     fsdp::vocab_parallel_cross_entropy). Backward: the input's gradient is summed over the
//     group (all-reduce; a reduce-scatter into shards for a gathered input), unless the layer is
//     under a module whose PrepareModuleInput gathers the input from sequence shards: that
//     gather's backward sums the layers' gradients once, for all of them.
//   RowwiseParallel: on a Linear, weight [out, in / T] (columns), bias [out] replicated. Input
//     this rank's slice of the last dimension (a colwise layer's output). Forward: the partial
//     products are summed over the group, then the bias is added: by an all-reduce into a
//     replicated output (Layout::kReplicate, the default) or by a reduce-scatter into this
//     rank's sequence shard (Layout::kSequenceShard, sequence parallelism); backward: nothing,
//     or the gradient's sequence shards gathered (all-gather). On a torch::nn::Embedding (a
//     vocabulary-parallel embedding, called through fsdp::embedding): table rows r*V/T.. (the
//     vocabulary is the input); a token outside them looks up zeros, and the partial lookups
//     are summed the same two ways.
//
//   ReplicateParallel: any module whose parameters stay whole on every rank but which is applied
//     to this rank's slice of an activation (Qwen3's per-head q/k norms, over this rank's heads),
//     so each rank's parameter gradients are partial sums. Forward: nothing; backward: those
//     gradients are summed over the group. The module reads its parameters through
//     fsdp::tensor_parallel_parameter.
//   SequenceParallel: a module with whole parameters applied to this rank's sequence shard
//     (norms between the layers under sequence parallelism): the same gradient sum as
//     ReplicateParallel, over the sequence's parts.
//   PrepareModuleInput(from, to) / PrepareModuleOutput(from, to): move a module's input (or
//     output) between layouts, as the model passes it through fsdp::tensor_parallel_input (or
//     _output). kSequenceShard -> kReplicate gathers the sequence (all-gather); its backward
//     sums the gradient's partial sums into shards (reduce-scatter) when the module holds
//     column layers, whose input gradients are partial, and otherwise keeps this rank's shard
//     of the gradient, the same on every rank. kReplicate -> kSequenceShard keeps this rank's
//     shard; its backward gathers the gradient. PrepareModuleOutput moves to kSequenceShard
//     only (a gathered output's gradient layout is its consumers', unknown here).
//
// A column layer followed by a row layer (attention's q/k/v then o, the MLP's gate/up then down)
// communicates once each way. Under sequence parallelism the activations between them are
// sequence shards: the all-reduce becomes a reduce-scatter after the row layer and an all-gather
// before the column layers (torchtitan's plan), and norms run on 1/T of the tokens. Every
// collective is checked as FSDP's are: one that fails or times out throws naming the layer, the
// mesh dimension, the rank and the operation.
#pragma once

#include <fsdp/device_mesh.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

// Where an activation [batch, seq, ...] lives on the tensor-parallel group: whole on every rank,
// or split along the sequence (dimension 1; FSDP2's Shard(1)), rank r holding positions
// r*seq/T.. of it.
enum class Layout { kReplicate, kSequenceShard };

class ParallelStyle {
 public:
  enum class Kind { kColwise, kRowwise, kReplicate, kSequence, kPrepareInput, kPrepareOutput };
  Kind kind() const { return kind_; }
  // Column styles: the output features are this many equal blocks, each split on its own (a
  // fused projection: GPT-2's c_attn is q, k and v, packed 3), so every rank gets its part of
  // each block, in block order. 1 otherwise.
  int64_t packed() const { return packed_; }
  // The layouts an activation moves between: PrepareModuleInput's and PrepareModuleOutput's
  // (from, to); RowwiseParallel's output is (kReplicate, its output layout). Otherwise both
  // kReplicate.
  Layout from() const { return from_; }
  Layout to() const { return to_; }
  std::string name() const;  // the style's name: "ColwiseParallel", "SequenceParallel", ...

 protected:
  ParallelStyle(Kind kind, int64_t packed, Layout from = Layout::kReplicate,
                Layout to = Layout::kReplicate)
      : kind_(kind), packed_(packed), from_(from), to_(to) {}

 private:
  Kind kind_;
  int64_t packed_;
  Layout from_, to_;
};

struct ColwiseParallel : ParallelStyle {
  // packed: see ParallelStyle::packed. (optional) defaults to 1. input: the layout the input
  // arrives in, kSequenceShard to gather it first. (optional) defaults to kReplicate.
  explicit ColwiseParallel(int64_t packed = 1, Layout input = Layout::kReplicate)
      : ParallelStyle(Kind::kColwise, packed, input, Layout::kReplicate) {}
};

struct RowwiseParallel : ParallelStyle {
  // output: kReplicate (all-reduce) or kSequenceShard (reduce-scatter). (optional) defaults to
  // kReplicate.
  explicit RowwiseParallel(Layout output = Layout::kReplicate)
      : ParallelStyle(Kind::kRowwise, 1, Layout::kReplicate, output) {}
};

struct ReplicateParallel : ParallelStyle {
  ReplicateParallel() : ParallelStyle(Kind::kReplicate, 1) {}
};

struct SequenceParallel : ParallelStyle {
  SequenceParallel()
      : ParallelStyle(Kind::kSequence, 1, Layout::kSequenceShard, Layout::kSequenceShard) {}
};

struct PrepareModuleInput : ParallelStyle {
  PrepareModuleInput(Layout from, Layout to) : ParallelStyle(Kind::kPrepareInput, 1, from, to) {}
};

struct PrepareModuleOutput : ParallelStyle {
  PrepareModuleOutput(Layout from, Layout to) : ParallelStyle(Kind::kPrepareOutput, 1, from, to) {}
};

// Module paths relative to the module given to parallelize_module ("self_attn.q_proj"), each
// with its style. A "*" component matches any one component ("layers.*.mlp.up_proj").
using TensorParallelPlan = std::vector<std::pair<std::string, ParallelStyle>>;

// Applies plan to the modules under module (see the top of this file). Every entry must match at
// least one module, each match must be not yet parallelized or sharded by fully_shard and, for
// the column and row styles, a torch::nn::Linear whose split dimension (out for colwise, in for
// rowwise) divides by the mesh's size; otherwise throws naming the entry, the layer and the
// sizes. An Embedding's vocabulary (RowwiseParallel) and a column split without packed blocks
// need not divide: they split as torch.chunk and DTensor's Shard do ([Note: an uneven
// vocabulary], tensor_parallel_range), each rank holding at least one row. Not collective: every
// rank of tp_mesh slices its own part. tp_mesh must be 1-D. Then, for every module under module
// that gathers its input from sequence shards, the column layers under it leave their input
// gradients to that gather (see ColwiseParallel): such a module must pass its input through
// fsdp::tensor_parallel_input, and every use of it inside the module must be a column layer's.
void parallelize_module(torch::nn::Module& module, const DeviceMesh& tp_mesh,
                        const TensorParallelPlan& plan);

// y = x W^T + b for a linear layer: at::linear, inside fsdp::forward_with (so the layer may be an
// FSDP unit), with the layer's tensor-parallel communication around it when it has a style.
at::Tensor linear(torch::nn::Linear& layer, const at::Tensor& x);

// y = x W^T + b for a layer whose weight another module owns (an output projection tied to the
// embeddings), with layer's tensor-parallel communication around it, as fsdp::linear's. Called
// from the layer's forward (itself called through fsdp::forward when the layer may be a unit).
at::Tensor tensor_parallel_linear(const torch::nn::Module& layer, const at::Tensor& x,
                                  const at::Tensor& weight, const at::Tensor& bias = {});

// The table's rows of ids (at::embedding), inside fsdp::forward_with, vocabulary-parallel when
// the table has RowwiseParallel (see the top of this file). When the table's weight belongs to
// an FSDP unit whose forward is not running (a tied output head sharded as a unit of its own),
// the rows are read from that unit's shards without gathering the table, collectively over its
// mesh, and the backward reduces their gradient itself (docs/strategies.md, "The head as a
// unit").
at::Tensor embedding(torch::nn::Embedding& table, const at::Tensor& ids);

// Whether head (an output projection) leaves its logits split over the vocabulary
// (ColwiseParallel), so that their loss is vocab_parallel_cross_entropy's.
bool splits_vocabulary(const torch::nn::Module& head);

// The cross-entropy of each row of logits [N, V_r] (this rank's vocabulary columns as head's
// ColwiseParallel split them: tensor_parallel_range(V, T, r)) against targets [N] (global ids),
// computed in float32 as at::cross_entropy_loss without reduction computes it over the whole
// vocabulary, without gathering the logits: float32 [N], 0 where the target is ignore_index.
// Forward: one all-gather of the rows' maxima and one all-reduce of the sums of exponentials with
// the target logits; backward: local (the softmax less the one-hot target). Throws naming the sizes
// if the shapes do not match.
at::Tensor vocab_parallel_cross_entropy(const torch::nn::Module& head, const at::Tensor& logits,
                                        const at::Tensor& targets, int64_t ignore_index = -100);

// param (a parameter of module) as module's forward should use it: under ReplicateParallel or
// SequenceParallel through the gradient's all-reduce over the group, otherwise param itself.
at::Tensor tensor_parallel_parameter(const torch::nn::Module& module, const at::Tensor& param);

// x (module's input) in the layout module's forward wants: moved by its PrepareModuleInput style
// (see the top of this file), else x itself. Throws naming the module, the sizes and the group
// if the sequence (dimension 1) does not divide by the group's size.
at::Tensor tensor_parallel_input(const torch::nn::Module& module, const at::Tensor& x);
// y (module's output) moved by its PrepareModuleOutput style, else y itself.
at::Tensor tensor_parallel_output(const torch::nn::Module& module, const at::Tensor& y);

// Where a parameter is split by tensor parallelism: the group it is split over and the
// dimension of the full tensor that is split (0: colwise weight and bias; 1: rowwise weight).
struct TensorParallelPlacement {
  std::shared_ptr<ProcessGroup> group;
  int64_t dim = 0;
  int64_t packed = 1;                 // the split dimension's equal blocks, each split on its own
  std::vector<int64_t> global_shape;  // the full tensor's shape
};

// The placement of param (a parameter of a parallelized layer, possibly sharded by FSDP since),
// or nullptr if tensor parallelism does not split it (replicated on the group, or no TP at all).
const TensorParallelPlacement* tensor_parallel_placement(const at::Tensor& param);

// [Note: an uneven vocabulary]
// GPT-2's 50,257 tokens do not divide by an even tp. Rather than keep the embeddings and the head
// whole on every rank (a third of GPT-2 small's parameters), a dimension of n that does not
// divide by the group's size T splits as torch.chunk and DTensor's Shard(d) split it: ceil(n / T)
// elements to each rank in order, the last ranks fewer. Only splits whose neighbours do not care
// may be uneven: a table's rows (each rank looks up the ids it holds) and a column layer without
// packed blocks (its outputs are the logits, whose loss takes each rank's columns where they
// start). A row layer's input features and packed blocks must divide.
struct TensorParallelRange {
  int64_t begin = 0;
  int64_t length = 0;
};
// Rank rank's part of a dimension of n elements split over size ranks (see the note above).
TensorParallelRange tensor_parallel_range(int64_t n, int size, int rank);

// The part of `full` (a tensor of placement.global_shape) that rank `rank` of the placement's
// group holds, as a view of full whose split dimension is two: [packed blocks, this rank's part
// of each]. reshape() to the slice's shape gives the rank's tensor; copy_() into it places one.
at::Tensor tensor_parallel_slice_view(const at::Tensor& full,
                                      const TensorParallelPlacement& placement, int rank);

}  // namespace fsdp
