// Llama's memory description for the estimator; see llama_memory.h for what is counted.
// Autograd saves an operand only when the other operand's gradient needs it, so the rotary
// products keep cos and sin but not q and k, and `weight * normed` keeps normed.
#include <c10/util/Exception.h>
#include <models/llama/llama_memory.h>

namespace fsdp::models {
namespace {

// CPU generator state that fsdp::checkpoint keeps per region (mt19937 plus normal-cache fields).
constexpr int64_t kCpuGeneratorStateBytes = 5056;

}  // namespace

ModelMemorySpec llama_memory_spec(const LlamaConfig& c, int64_t micro_batch, int64_t seq_len,
                                  at::ScalarType compute_dtype, bool activation_checkpoint) {
  c.validate();
  TORCH_CHECK(micro_batch >= 1 && seq_len >= 1 && seq_len <= c.max_position_embeddings,
              "llama_memory_spec: need micro_batch >= 1 and 1 <= seq_len <= "
              "max_position_embeddings = ",
              c.max_position_embeddings, ", got micro_batch ", micro_batch, ", seq_len ", seq_len);
  // Every byte count below is an int64; refuse sizes where one could overflow.
  const long double largest = static_cast<long double>(micro_batch) * seq_len *
                              (c.vocab_size + 16.0L * c.hidden_size + 4.0L * c.intermediate_size) *
                              8 * c.num_hidden_layers;
  TORCH_CHECK(largest < 0x1p62L, "llama_memory_spec: a micro-batch of ", micro_batch,
              " sequences of ", seq_len, " tokens needs more than 2^62 bytes of activations");
  const long double state =
      16.0L * c.hidden_size *
      (2.0L * c.vocab_size +
       (4.0L * c.hidden_size + 3.0L * c.intermediate_size) * c.num_hidden_layers);
  TORCH_CHECK(state < 0x1p62L, "llama_memory_spec: hidden_size ", c.hidden_size, " and ",
              c.num_hidden_layers,
              " layers make more than 2^62 bytes of parameters and optimizer state");
  const int64_t d = c.hidden_size, v = c.vocab_size, f = c.intermediate_size;
  const int64_t h = c.num_attention_heads, hd = c.head_dim();
  const int64_t kv = c.num_key_value_heads * hd;
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t bt = micro_batch * seq_len;
  const int64_t btd = bt * d * e, btf = bt * f * e, btv = bt * v * e;
  const int64_t f32_btd = bt * d * 4;
  const int64_t rsqrt = bt * 4;                             // [B, T, 1] float32
  const int64_t norm_saved = f32_btd + rsqrt + 2 * btd;     // input (float32), rsqrt, 2 x [B,T,d]
  const int64_t logsumexp = micro_batch * h * seq_len * 4;  // float for every compute dtype
  const bool grouped = c.num_key_value_heads != c.num_attention_heads;
  const int64_t kv_saved = grouped ? 2 * btd : 2 * bt * kv * e;  // what attention gets as k, v

  ModelMemorySpec spec;
  spec.root_param_shapes = {{v, d}, {d}};  // embed_tokens (= lm_head when tied), norm
  if (!c.tie_word_embeddings) spec.root_param_shapes.push_back({v, d});
  spec.root_saved_before_bytes = 0;  // the embedding keeps only the caller's token ids
  spec.root_saved_after_bytes = norm_saved + btv;  // final norm, log_softmax of the logits
  spec.root_forward_workspace_bytes = btv;         // the logits, freed after the loss
  spec.root_backward_peak_bytes = 2 * btv;         // gradients of log_softmax's output and input
  // Tied: the embedding's dense [V, d] gradient and its out-of-place sum with the head's (see
  // gpt2_memory.cpp). Untied: the embedding's dense gradient is its only one, already counted.
  spec.root_stem_backward_peak_bytes = c.tie_word_embeddings ? 2 * v * d * e : 0;

  const int64_t attention_saved =
      btd /*rotated q*/ + kv_saved + btd /*output*/ + logsumexp + 2 * seq_len * hd * e /*cos, sin*/;
  const int64_t full_saved = 2 * norm_saved + attention_saved + 4 * btf;
  // The first step of a layer's backward, down_proj's, gives the gradient of the MLP product
  // [B, T, f] and down_proj's weight gradient; the product's backward adds the SiLU's and up's
  // gradients before the saved [B, T, f] tensors go.
  const int64_t plain_backward_peak = 3 * btf + d * f * e;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    UnitMemorySpec unit;
    unit.name = "model.layers." + std::to_string(i);
    unit.param_shapes = {{d},                               // input_layernorm
                         {d, d}, {kv, d}, {kv, d}, {d, d},  // q, k, v, o
                         {d},                               // post_attention_layernorm
                         {f, d}, {f, d},  {d, f}};          // gate, up, down
    if (activation_checkpoint) {
      unit.saved_bytes = btd + kCpuGeneratorStateBytes;
      // Without autograd the MLP's four [B, T, f] temporaries live to the end of their
      // expression, beside the residual, the norm's output and down_proj's output.
      unit.forward_workspace_bytes = 4 * btf + 3 * btd;
      unit.backward_peak_bytes = full_saved + plain_backward_peak;
    } else {
      unit.saved_bytes = full_saved;
      // Rotating q: q, rotate_half(q) and the two products, beside k and v.
      unit.forward_workspace_bytes = 4 * btd + 2 * bt * kv * e;
      unit.backward_peak_bytes = plain_backward_peak;
    }
    spec.units.push_back(std::move(unit));
  }
  return spec;
}

}  // namespace fsdp::models
