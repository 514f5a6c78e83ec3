#include <train/job_config.h>

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/models/model.h>

#include <ostream>

namespace fsdp::train {

const NameTable<ShardingStrategy>& strategy_names() {
  static const NameTable<ShardingStrategy> table = {
      {"full_shard", ShardingStrategy::kFullShard},
      {"shard_grad_op", ShardingStrategy::kShardGradOp},
      {"no_shard", ShardingStrategy::kNoShard},
      {"hybrid_shard", ShardingStrategy::kHybridShard},
      {"whole_tensor", ShardingStrategy::kWholeTensor}};
  return table;
}

const NameTable<AccumulationMode>& accumulation_mode_names() {
  static const NameTable<AccumulationMode> table = {
      {"sync", AccumulationMode::kSync},
      {"no-sync", AccumulationMode::kNoSync},
      {"no-reshard", AccumulationMode::kNoReshard},
      {"no-all-reduce", AccumulationMode::kNoAllReduce}};
  return table;
}

const NameTable<LrScheduleKind>& lr_schedule_names() {
  static const NameTable<LrScheduleKind> table = {{"constant", LrScheduleKind::kConstant},
                                                  {"cosine", LrScheduleKind::kCosine},
                                                  {"wsd", LrScheduleKind::kWsd}};
  return table;
}

const NameTable<DeviceKind>& device_names() {
  static const NameTable<DeviceKind> table = {{"cpu", DeviceKind::kCpu},
                                              {"cuda", DeviceKind::kCuda}};
  return table;
}

const NameTable<at::ScalarType>& compute_dtype_names() {
  static const NameTable<at::ScalarType> table = {
      {"fp32", at::kFloat}, {"bf16", at::kBFloat16}, {"fp16", at::kHalf}};
  return table;
}

const NameTable<checkpoint::CheckpointFormat>& checkpoint_format_names() {
  static const NameTable<checkpoint::CheckpointFormat> table = [] {
    NameTable<checkpoint::CheckpointFormat> names;
    for (const std::string& name : checkpoint::checkpoint_format_names()) {
      names.emplace_back(name, *checkpoint::parse_checkpoint_format(name));
    }
    return names;
  }();
  return table;
}

const NameTable<at::ScalarType>& export_dtype_names() {
  static const NameTable<at::ScalarType> table = {{"fp32", at::kFloat}, {"bf16", at::kBFloat16}};
  return table;
}

namespace {

// The number after prefix in text, when text is prefix followed by 1 to max_digits decimal
// digits; nullopt otherwise.
std::optional<int64_t> number_after(const std::string& text, const std::string& prefix,
                                    size_t max_digits) {
  if (text.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = text.substr(prefix.size());
  if (digits.empty() || digits.size() > max_digits ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

}  // namespace

AllGatherSetting parse_all_gather(const std::string& text) {
  if (text == "fp") return {};
  if (text == "int8") return {Int8AllGather::kDefaultBlockSize};
  const auto block = number_after(text, "int8:", 9);
  TORCH_CHECK(block.has_value() && *block >= 1,
              "--all-gather must be fp, int8 or int8:BLOCK with BLOCK >= 1 elements per scale "
              "(at most 9 digits), got '",
              text, "'");
  return {block};
}

std::string to_string(const AllGatherSetting& setting) {
  if (!setting.int8_block.has_value()) return "fp";
  return "int8:" + std::to_string(*setting.int8_block);
}

WrapPolicySetting parse_wrap_policy(const std::string& text) {
  if (text == "block") return {};
  const auto n = number_after(text, "min-params:", 18);
  TORCH_CHECK(n.has_value() && *n >= 1,
              "--wrap-policy must be block or min-params:N with N >= 1 parameter elements (at "
              "most 18 digits), got '",
              text, "'");
  return {n};
}

std::string to_string(const WrapPolicySetting& setting) {
  if (!setting.min_params.has_value()) return "block";
  return "min-params:" + std::to_string(*setting.min_params);
}

std::ostream& operator<<(std::ostream& out, LrScheduleKind kind) {
  return out << name_of(lr_schedule_names(), kind);
}

std::ostream& operator<<(std::ostream& out, DeviceKind device) {
  return out << name_of(device_names(), device);
}

std::ostream& operator<<(std::ostream& out, const AllGatherSetting& setting) {
  return out << to_string(setting);
}

std::ostream& operator<<(std::ostream& out, const WrapPolicySetting& setting) {
  return out << to_string(setting);
}

models::SizeOverrides size_overrides(const ModelConfig& m) {
  models::SizeOverrides overrides;
  overrides.vocab_size = m.vocab_size;
  overrides.max_seq_len = m.n_positions;
  overrides.dim = m.n_embd;
  overrides.n_layers = m.n_layer;
  overrides.n_heads = m.n_head;
  return overrides;
}

std::string dtype_name(at::ScalarType dtype) {
  for (const auto& [name, value] : compute_dtype_names()) {
    if (value == dtype) return name;
  }
  return c10::toString(dtype);
}

}  // namespace fsdp::train
