// GPT-2's memory description for the estimator; see gpt2_memory.h for what is counted. The
// tensor counts follow gpt2.cpp's forward on LibTorch's CPU kernels (Linear on a 3-D input is
// one addmm on a flattened view that keeps its input; scaled_dot_product_attention runs the
// fused flash kernel, which keeps q, k, v, its output and a float logsumexp; its output is laid
// out so that transpose(1, 2).contiguous() copies nothing) and are checked against the counting
// allocator in tests/estimate/.
#include <c10/util/Exception.h>
#include <models/gpt2/gpt2_memory.h>

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
  // Every byte count below is an int64; refuse sizes where one could overflow.
  const long double largest = static_cast<long double>(micro_batch) * seq_len *
                              (c.vocab_size + 16.0L * c.n_embd) * 8 * c.n_layer;
  TORCH_CHECK(largest < 0x1p62L, "gpt2_memory_spec: a micro-batch of ", micro_batch,
              " sequences of ", seq_len, " tokens needs more than 2^62 bytes of activations");
  const long double state =
      16.0L * c.n_embd * (c.vocab_size + c.n_positions + 12.0L * c.n_embd * c.n_layer);
  TORCH_CHECK(state < 0x1p62L, "gpt2_memory_spec: n_embd ", c.n_embd, " and n_layer ", c.n_layer,
              " make more than 2^62 bytes of parameters and optimizer state");
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
  spec.root_saved_before_bytes = seq_len * 8 + btd;     // position ids, wte(idx) + wpe(pos)
  spec.root_saved_after_bytes = ln_stats + btd + btv;   // ln_f, its output, log_softmax
  spec.root_forward_workspace_bytes = btv;              // the logits, freed after the loss
  spec.root_backward_peak_bytes = 2 * btv;  // gradients of log_softmax's output and input
  // wte is tied to the head, so its gradient comes in two parts: the head's [V, d], held by
  // autograd from the start of backward, and the embedding's, which embedding_dense_backward
  // makes as a dense [V, d] at the very end. Autograd sums a leaf's incoming gradients out of
  // place (its input buffer never writes into a gradient it was handed), so for a moment three
  // [V, d] tensors are alive; the sum then replaces the head's part as wte's gradient. (wpe's
  // dense gradient is its only one, already counted with the root's gradients.)
  spec.root_stem_backward_peak_bytes = 2 * v * d * e;

  const int64_t full_saved = 16 * btd + 2 * ln_stats + logsumexp;
  // The first step of a block's backward is its peak: the MLP's c_proj gives the gradient of
  // the GELU output [B, T, 4d] and its own weight and bias gradients, before the GELU output it
  // kept is released; the steps after it free about as much as they allocate.
  const int64_t plain_backward_peak = 4 * btd + (4 * d * d + d) * e;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    UnitMemorySpec unit;
    unit.name = "h." + std::to_string(i);
    unit.param_shapes = {{d},        {d},      // ln_1
                         {3 * d, d}, {3 * d},  // attn.c_attn
                         {d, d},     {d},      // attn.c_proj
                         {d},        {d},      // ln_2
                         {4 * d, d}, {4 * d},  // mlp.c_fc
                         {d, 4 * d}, {d}};     // mlp.c_proj
    if (activation_checkpoint) {
      unit.saved_bytes = btd + kCpuGeneratorStateBytes;
      // Forward runs without autograd, so intermediates go when their last reference does; a
      // C++ temporary lives to the end of its full expression, so at c_proj the residual h,
      // ln_2's output, c_fc's output (4), the GELU (4) and c_proj's output are alive: 11
      // [B, T, d] above the block's input, 10 above its output.
      unit.forward_workspace_bytes = 10 * btd;
      // The recompute materializes the block's activations again, then backward runs on them.
      unit.backward_peak_bytes = full_saved + plain_backward_peak;
    } else {
      unit.saved_bytes = full_saved;
      unit.forward_workspace_bytes = btd;  // the MLP's c_proj output before the residual add
      unit.backward_peak_bytes = plain_backward_peak;
    }
    spec.units.push_back(std::move(unit));
  }
  return spec;
}

}  // namespace fsdp::models
