// GPT-2's memory description for the estimator; see gpt2_memory.h for what is counted. The
// tensor counts follow gpt2.cpp's forward on LibTorch's CPU kernels (Linear on a 3-D input is
// one addmm on a flattened view that keeps its input; scaled_dot_product_attention runs the
// fused flash kernel, which keeps q, k, v, its output and a float logsumexp; its output is laid
// out so that transpose(1, 2).contiguous() copies nothing) and are checked against the counting
// allocator in tests/estimate/.
#include <models/gpt2/gpt2_memory.h>

#include <c10/util/Exception.h>

namespace fsdp::models {
namespace {

// CPU generator state that fsdp::checkpoint keeps per region (mt19937 plus normal-cache fields).
constexpr int64_t kCpuGeneratorStateBytes = 5056;

}  // namespace

ModelMemorySpec gpt2_memory_spec(const GPT2Config& c, int64_t micro_batch, int64_t seq_len,
                                 at::ScalarType compute_dtype, bool activation_checkpoint) {
  c.validate();
  TORCH_CHECK(micro_batch >= 1 && seq_len >= 1 && seq_len <= c.n_positions,
              "gpt2_memory_spec: need micro_batch >= 1 and 1 <= seq_len <= n_positions = ",
              c.n_positions, ", got micro_batch ", micro_batch, ", seq_len ", seq_len);
  const int64_t d = c.n_embd, v = c.vocab_size, p = c.n_positions, h = c.n_head;
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t bt = micro_batch * seq_len;
  const int64_t btd = bt * d * e;
  const int64_t btv = bt * v * e;
  // LayerNorm's mean and rstd ([B, T, 1] each), in the compute dtype on CPU.
  const int64_t ln_stats = 2 * bt * e;
  const int64_t logsumexp = micro_batch * h * seq_len * 4;  // float for every compute dtype

  ModelMemorySpec spec;
  spec.root_param_shapes = {{v, d}, {p, d}, {d}, {d}};  // wte (= lm_head), wpe, ln_f
  spec.root_saved_before_bytes = seq_len * 8 + btd;    // position ids, wte(idx) + wpe(pos)
  spec.root_saved_after_bytes = ln_stats + btd + btv;  // ln_f, its output, log_softmax
  spec.root_forward_workspace_bytes = btv;             // the logits, freed after the loss
  spec.root_backward_workspace_bytes = 2 * btv;        // gradients of log_softmax's output and input

  const int64_t full_saved = 16 * btd + 2 * ln_stats + logsumexp;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    UnitMemorySpec unit;
    unit.name = "h." + std::to_string(i);
    unit.param_shapes = {{d},         {d},         // ln_1
                         {3 * d, d},  {3 * d},     // attn.c_attn
                         {d, d},      {d},         // attn.c_proj
                         {d},         {d},         // ln_2
                         {4 * d, d},  {4 * d},     // mlp.c_fc
                         {d, 4 * d},  {d}};        // mlp.c_proj
    // The MLP's c_proj output before the residual add.
    unit.forward_workspace_bytes = btd;
    // Gradients flowing through the block: the incoming one and the MLP's two [B, T, 4d].
    unit.backward_workspace_bytes = 9 * btd;
    if (activation_checkpoint) {
      unit.saved_bytes = btd + kCpuGeneratorStateBytes;
      // The recompute materializes the block's activations again during its backward.
      unit.backward_workspace_bytes += full_saved;
    } else {
      unit.saved_bytes = full_saved;
    }
    spec.units.push_back(std::move(unit));
  }
  return spec;
}

}  // namespace fsdp::models
