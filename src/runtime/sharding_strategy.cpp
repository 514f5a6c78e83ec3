#include <fsdp/sharding_strategy.h>

#include <c10/util/Exception.h>

#include <ostream>

namespace fsdp {

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  if (name == "full_shard") return ShardingStrategy::kFullShard;
  if (name == "shard_grad_op") return ShardingStrategy::kShardGradOp;
  if (name == "no_shard") return ShardingStrategy::kNoShard;
  if (name == "hybrid_shard") return ShardingStrategy::kHybridShard;
  if (name == "whole_tensor") return ShardingStrategy::kWholeTensor;
  TORCH_CHECK(false, "unknown sharding strategy '", name,
              "'; valid: full_shard, shard_grad_op, no_shard, hybrid_shard, whole_tensor");
}

std::string to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard:
      return "full_shard";
    case ShardingStrategy::kShardGradOp:
      return "shard_grad_op";
    case ShardingStrategy::kNoShard:
      return "no_shard";
    case ShardingStrategy::kHybridShard:
      return "hybrid_shard";
    case ShardingStrategy::kWholeTensor:
      return "whole_tensor";
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled sharding strategy");
}

AccumulationMode parse_accumulation_mode(const std::string& name) {
  if (name == "sync") return AccumulationMode::kSync;
  if (name == "no-sync") return AccumulationMode::kNoSync;
  if (name == "no-reshard") return AccumulationMode::kNoReshard;
  if (name == "no-all-reduce") return AccumulationMode::kNoAllReduce;
  TORCH_CHECK(false, "unknown accumulation mode '", name,
              "'; valid: sync, no-sync, no-reshard, no-all-reduce");
}

std::string to_string(AccumulationMode mode) {
  switch (mode) {
    case AccumulationMode::kSync:
      return "sync";
    case AccumulationMode::kNoSync:
      return "no-sync";
    case AccumulationMode::kNoReshard:
      return "no-reshard";
    case AccumulationMode::kNoAllReduce:
      return "no-all-reduce";
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled accumulation mode");
}

std::ostream& operator<<(std::ostream& out, ShardingStrategy strategy) {
  return out << to_string(strategy);
}

std::ostream& operator<<(std::ostream& out, AccumulationMode mode) {
  return out << to_string(mode);
}

}  // namespace fsdp
