// Llama's memory description for the estimator; see llama_memory.h for what is counted. The
// parameter shapes are llama_params's.
// Autograd saves an operand only when the other operand's gradient needs it, so the rotary
// products keep cos and sin but not q and k, and `weight * normed` keeps normed.
#include <c10/util/Exception.h>
#include <models/common/memory.h>
#include <models/common/parallelize.h>
#include <models/llama/llama_memory.h>
#include <models/llama/llama_parallelize.h>

namespace fsdp::models {
namespace {

// What RMSNorm (LlamaRMSNormImpl::forward) keeps over `rows` rows of `width`, element size e:
// its input in float32 (the input itself in float32, else its float32 copy), rsqrt [rows, 1]
// float32, and the normalized value cast to the compute dtype (weight * normed keeps it).
int64_t rms_norm_saved(int64_t rows, int64_t width, int64_t e) {
  return rows * width * 4 + rows * 4 + rows * width * e;
}

// Refuses a micro-batch the model does not accept, and sizes where a byte count below could
// overflow int64 (the parameters' and optimizer state's cannot: validate() bounds the parameter
// count by 2^46).
void check_sizes(const LlamaConfig& c, int64_t micro_batch, int64_t seq_len) {
  c.validate();
  TORCH_CHECK(
      micro_batch >= 1 && seq_len >= 1 && seq_len <= c.max_seq_len(),
      "llama_memory_spec: need micro_batch >= 1 and 1 <= seq_len <= "
      "max_position_embeddings = ",
      c.max_position_embeddings,
      (c.sliding_window > 0 ? " (and sliding_window = " + std::to_string(c.sliding_window) + ")"
                            : std::string()),
      ", got micro_batch ", micro_batch, ", seq_len ", seq_len);
  const long double width = c.hidden_size + c.num_attention_heads * c.head_dim();
  const long double largest = static_cast<long double>(micro_batch) * seq_len *
                              (c.vocab_size + 16.0L * width + 4.0L * c.intermediate_size) * 8 *
                              c.num_hidden_layers;
  TORCH_CHECK(largest < 0x1p62L, "llama_memory_spec: a micro-batch of ", micro_batch,
              " sequences of ", seq_len, " tokens needs more than 2^62 bytes of activations");
}

}  // namespace

ModelMemorySpec llama_memory_spec(const LlamaConfig& c, int64_t micro_batch, int64_t seq_len,
                                  at::ScalarType compute_dtype, bool activation_checkpoint, int tp,
                                  bool sequence_parallel) {
  check_sizes(c, micro_batch, seq_len);
  const ParamTable params = llama_params(c);
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t bt = micro_batch * seq_len;
  // tp != 1 asks the plan, which names the sizes that do not divide.
  const LayerSplit split{
      tp != 1 ? llama_layer_tp_plan(c, tp, sequence_parallel) : TensorParallelPlan{}, tp,
      bt * c.hidden_size * e, activation_checkpoint, e};
  // The tokens of a norm and of the residual stream: this rank's sequence shard under sequence
  // parallelism.
  const int64_t stream_rows = sequence_parallel ? bt / tp : bt;
  // A layer's widths on one rank (its heads and MLP columns under tensor parallelism).
  const int64_t d = c.hidden_size, v = c.vocab_size, f = c.intermediate_size / tp;
  const int64_t h = c.num_attention_heads / tp, hd = c.head_dim();
  const int64_t kvh = c.num_key_value_heads / tp;
  const int64_t btd = bt * d * e, btf = bt * f * e;
  const int64_t btq = bt * h * hd * e, btkv = bt * kvh * hd * e;  // q's and k's (v's) widths
  // The residual norms keep, besides rms_norm_saved, their weighted output (the projections'
  // input; under sequence parallelism the gathered whole of it).
  const int64_t norm_saved = rms_norm_saved(stream_rows, d, e) + btd;
  const int64_t logsumexp = micro_batch * h * seq_len * 4;  // float for every compute dtype
  const bool grouped = kvh != h;
  const int64_t kv_saved = grouped ? 2 * btq : 2 * btkv;  // what attention gets as k, v
  // Qwen3's q and k norms: the projections' outputs, which nothing else keeps (the rotation keeps
  // cos and sin only), are the norms' inputs.
  const int64_t qk_norm_saved =
      c.qk_norm ? rms_norm_saved(bt * h, hd, e) + rms_norm_saved(bt * kvh, hd, e) : 0;

  // The root: embed_tokens (= lm_head when tied), the final norm (which keeps norm_saved).
  // The embedding keeps only the caller's token ids. The rotary table (cos and sin [T, head_dim])
  // that every layer's rotation keeps is not an activation: LlamaRotary makes it once and keeps
  // it between steps, like a buffer.
  const RootSplit root{tp, sequence_parallel, vocabulary_splits(v, tp), btd, bt, d * e, 0};
  ModelMemorySpec spec = root_memory(
      params, root,
      {{"model.embed_tokens.weight", "lm_head.weight"}, c.tie_word_embeddings, 0, norm_saved}, e);

  const int64_t attention_saved =
      btq /*rotated q*/ + kv_saved + btq /*output*/ + logsumexp + qk_norm_saved;
  const int64_t full_saved = 2 * norm_saved + attention_saved + 4 * btf;
  // The first step of a layer's backward, down_proj's, gives the gradient of the MLP product
  // [B, T, f] and down_proj's weight gradient; the product's backward adds the activation's and
  // up's gradients before the saved [B, T, f] tensors go.
  const int64_t plain_backward_peak = 3 * btf + d * f * e;
  // Rotating q: q, rotate_half(q) and the two products, beside k and v.
  const LayerMemory plain{full_saved, 4 * btq + 2 * btkv, plain_backward_peak};
  // Checkpointed, without autograd the MLP's four [B, T, f] temporaries live to the end of their
  // expression, beside the residual, the norm's output and down_proj's output.
  spec.units = layer_units(
      params, params.layer_prefix,
      activation_checkpoint ? checkpointed(plain, stream_rows * d * e, 4 * btf + 3 * btd) : plain,
      split);
  return spec;
}

}  // namespace fsdp::models
