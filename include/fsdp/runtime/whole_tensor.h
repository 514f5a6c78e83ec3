// Inter-tensor ZeRO-3 (fsdp-train --strategy whole_tensor): every parameter lives whole on one
// owner rank instead of being split into rows across all ranks.
//
// The units, hooks, prefetching and accumulation controls are fully_shard's; only the layout and
// the collectives change. Before a unit's forward and backward each owner broadcasts the
// unit's tensors it owns (one broadcast per owner of the unit, its tensors packed together);
// after the unit's backward each owner receives the sum of its tensors' gradients by a reduce
// (not an all-reduce), and the other ranks drop theirs. A rank's optimizer therefore holds
// state for the tensors it owns and nothing for the rest: a non-owned parameter is, between
// steps, an empty tensor (0 rows) with an empty gradient, so torch::optim, clip_grad_norm_ and
// the checkpoints treat every rank alike. Compared with FULL_SHARD the per-step traffic is the
// same in bytes (two broadcasts and one reduce of every byte, against two all-gathers and one
// reduce-scatter) but rooted, so a rank's state is as even as the partition below can make it.
//
// Who owns what is decided once, before sharding, by partition_whole_tensors over every
// parameter of the model, and handed to fully_shard through FullyShardOptions::whole_tensor;
// whole_tensor_shard does both for a model and its units.
#pragma once

#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace fsdp {

// One tensor to place: its size and the unit whose collectives will move it.
struct WholeTensorItem {
  std::string name;
  int64_t bytes = 0;
  int unit = 0;  // any non-negative id; tensors with the same id are moved together
};

struct WholeTensorPartitionOptions {
  // What to favour, in [0, 1]. 1 places for balance alone: tensors largest first, each on the
  // rank that holds the fewest bytes so far (greedy LPT). Below 1, a tensor instead joins a rank
  // that already owns a tensor of its unit (the least loaded of them) whenever that rank stays
  // within (2 - evenness_priority) times the mean bytes per rank: a unit then has fewer owners,
  // so fewer broadcasts and reduces per unit, at the price of balance. (optional) defaults to 1.
  TORCH_ARG(double, evenness_priority) = 1.0;
};

struct WholeTensorPartition {
  std::vector<int> owners;          // per item, in the order given
  std::vector<int64_t> rank_bytes;  // per rank: the bytes of the tensors it owns
  // Distinct (unit, owner) pairs: the broadcasts of one gather of every unit, and the reduces
  // of one backward.
  int64_t unit_owner_pairs = 0;

  int64_t total_bytes() const;
  // The largest rank's bytes over the mean (1: perfectly even; W: one rank owns everything).
  double imbalance() const;
  // "rank bytes 1234, 1200; imbalance 1.014; 25 broadcasts per gather of every unit".
  std::string describe() const;
};

// Partitions items over world ranks. Deterministic: every rank computes the same owners. Ties
// (equal sizes, equal loads) go to the earlier unit and item, and to the lower rank. Throws
// naming the value for world < 1, evenness_priority outside [0, 1], or a negative byte count
// or unit.
WholeTensorPartition partition_whole_tensors(const std::vector<WholeTensorItem>& items, int world,
                                             const WholeTensorPartitionOptions& options = {});

// The owner rank of each parameter, keyed by the parameter Variable itself (a tied tensor is one
// key). What FullyShardOptions::whole_tensor takes.
class WholeTensorPlacement {
 public:
  // Throws if rank is negative or param is undefined.
  void set_owner(const at::Tensor& param, int rank);
  // The owner of param, or -1 if it has none.
  int owner_of(const at::Tensor& param) const;
  size_t size() const { return owners_.size(); }

 private:
  std::unordered_map<const c10::TensorImpl*, int> owners_;
};

struct WholeTensorShardOptions {
  TORCH_ARG(WholeTensorPartitionOptions, partition) = WholeTensorPartitionOptions();
  // Options of the units (reshard_after_forward must be a bool; mp_policy as for fully_shard).
  // The root keeps its parameters from forward to backward, as fully_shard's root does.
  TORCH_ARG(FullyShardOptions, unit_options) = FullyShardOptions();
  TORCH_ARG(MixedPrecisionPolicy, root_mp_policy) = MixedPrecisionPolicy();
};

struct WholeTensorSharding {
  FSDPModule root;
  WholeTensorPartition partition;
  std::vector<std::string> names;  // the tensors partitioned (partition.owners' order): the model's
                                   // distinct parameters, in named_parameters() order
};

// Inter-tensor ZeRO-3 over model: partitions every distinct parameter of model (the tensors of
// units[i] as unit i, the rest as the root's), then fully_shards each unit (bottom-up: units must
// not contain each other) and model as the root with that placement. model must hold its full,
// initialized parameters (no deferred sharding: the partition needs every tensor's size first).
// Collective over mesh. Throws if mesh is 2-D, a unit is null or not under model, or as
// fully_shard does.
WholeTensorSharding whole_tensor_shard(const std::shared_ptr<torch::nn::Module>& model,
                                       const std::vector<std::shared_ptr<torch::nn::Module>>& units,
                                       const DeviceMesh& mesh,
                                       const WholeTensorShardOptions& options = {});

}  // namespace fsdp
