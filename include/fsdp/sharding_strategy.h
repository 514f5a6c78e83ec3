// The sharding strategies and gradient-accumulation modes of FSDP as a whole-model setting
// (fsdp-train's --strategy and --accum-mode), with their names. The runtime itself takes them
// apart into per-unit options (FullyShardOptions); the estimator, the step-time planner and the
// trainer's job config name them with these.
#pragma once

#include <iosfwd>
#include <string>

namespace fsdp {

// kWholeTensor: inter-tensor ZeRO-3 (fsdp/runtime/whole_tensor.h); the estimate is that of the
// rank owning the most bytes under partition_whole_tensors, and its "sharded" bytes are the
// tensors it owns (exact); blocks reshard after forward as under full_shard.
enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard, kWholeTensor };

// How gradients of the micro-batches of one step are accumulated (fsdp-train --accum-mode):
// reduce after every backward (kSync); keep full gradients until the last backward reduces
// their sum (kNoSync: set_requires_gradient_sync(false)); and also keep every unit gathered
// from the first forward to the last backward (kNoReshard); with a replicate dimension,
// reduce-scatter after every backward but all-reduce across replicas only after the last
// (kNoAllReduce: set_requires_all_reduce(false); estimated as kSync, with the all-reduce bytes
// of the last pass only; fsdp-plan still times an all-reduce per pass).
enum class AccumulationMode { kSync, kNoSync, kNoReshard, kNoAllReduce };

// "full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "whole_tensor"; throws listing
// them otherwise.
ShardingStrategy parse_sharding_strategy(const std::string& name);
std::string to_string(ShardingStrategy strategy);
// "sync", "no-sync", "no-reshard", "no-all-reduce" (fsdp-train's --accum-mode); throws listing
// them otherwise.
AccumulationMode parse_accumulation_mode(const std::string& name);
std::string to_string(AccumulationMode mode);
// Their names, in messages.
std::ostream& operator<<(std::ostream& out, ShardingStrategy strategy);
std::ostream& operator<<(std::ostream& out, AccumulationMode mode);

}  // namespace fsdp
