// Derives the planner's compute description from the model interface; see compute_spec.h for the
// assumptions. Sizes come from the memory spec (the same shapes the estimator shards) and from
// ModelSpec::sizes(), under either family's names.
#include "fsdp_plan/compute_spec.h"

#include <c10/util/Exception.h>
#include <fsdp/tensor_parallel.h>

#include <numeric>

namespace fsdp::tools {
namespace {

int64_t size_named(const models::ModelSpec& spec, std::initializer_list<const char*> names) {
  for (const auto& [key, value] : spec.sizes()) {
    for (const char* name : names) {
      if (key == name) return value;
    }
  }
  std::string known;
  for (const auto& [key, value] : spec.sizes()) known += (known.empty() ? "" : ", ") + key;
  TORCH_CHECK(false, "fsdp-plan: model '", spec.name(), "' reports none of ", *names.begin(),
              "... among its sizes (", known, ")");
}

int64_t inner_numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin() + 1, shape.end(), int64_t{1}, std::multiplies<>());
}

}  // namespace

namespace {

// One rank's part: the layers' slices of the memory spec for tp, this rank's heads.
ModelComputeSpec rank_compute_spec(const models::ModelSpec& spec, int64_t micro_batch,
                                   int64_t seq_len, at::ScalarType compute_dtype, int tp, bool sp) {
  const ModelMemorySpec memory =
      spec.memory_spec(micro_batch, seq_len, compute_dtype, false, tp, sp);
  const int64_t width = size_named(spec, {"n_embd", "hidden_size"});
  const int64_t heads = size_named(spec, {"n_head", "num_attention_heads"});
  TORCH_CHECK(heads > 0 && width % heads == 0 && heads % tp == 0, "fsdp-plan: model '", spec.name(),
              "' has width ", width, " and ", heads, " heads (tp ", tp, ")");
  ModelComputeSpec c;
  c.tokens = micro_batch * seq_len;
  for (const auto& unit : memory.units) {
    UnitComputeSpec u;
    for (const auto& shape : unit.param_shapes) {
      if (shape.size() >= 2) u.matmuls.push_back({c.tokens, inner_numel(shape), shape[0]});
    }
    u.attention_batch_heads = micro_batch * heads / tp;
    u.attention_seq = seq_len;
    u.attention_head_dim = width / heads;
    u.other_bytes = 3 * unit.saved_bytes;
    c.units.push_back(u);
  }
  // The head: [vocab, width], or rank 0's rows of it under a vocabulary split (the most).
  const int64_t vocab = spec.vocab_size();
  const int64_t rows = tp > 1 ? tensor_parallel_range(vocab, tp, 0).length : vocab;
  for (const auto& shape : memory.root_param_shapes) {
    if (shape.size() == 2 && (shape[0] == vocab || shape[0] == rows)) {
      c.root_head.matmuls.push_back({c.tokens, shape[1], shape[0]});
      break;  // tied or not, the head multiplies once
    }
  }
  c.root_stem.other_bytes = 3 * memory.root_saved_before_bytes;
  c.root_head.other_bytes =
      3 * (memory.root_saved_after_bytes + memory.root_forward_workspace_bytes);
  return c;
}

}  // namespace

ModelComputeSpec compute_spec(const models::ModelSpec& spec, int64_t micro_batch, int64_t seq_len,
                              at::ScalarType compute_dtype, int tp, bool sequence_parallel) {
  ModelComputeSpec c =
      rank_compute_spec(spec, micro_batch, seq_len, compute_dtype, tp, sequence_parallel);
  if (tp > 1) {  // the whole model's FLOPs, for MFU
    const ModelComputeSpec whole =
        rank_compute_spec(spec, micro_batch, seq_len, compute_dtype, 1, false);
    c.model_forward_flops = forward_flops(whole);
  }
  return c;
}

}  // namespace fsdp::tools
