// GPT-2's memory description for the estimator; see gpt2_memory.h for what is counted. The
// tensor counts follow gpt2.cpp's forward on LibTorch's CPU kernels (Linear on a 3-D input is
// one addmm on a flattened view that keeps its input; scaled_dot_product_attention runs the
// fused flash kernel, which keeps q, k, v, its output and a float logsumexp; its output is laid
// out so that transpose(1, 2).contiguous() copies nothing) and are checked against the counting
// allocator in tests/estimate/.
#include <c10/util/Exception.h>
#include <models/common/memory.h>
#include <models/common/parallelize.h>
#include <models/gpt2/gpt2_memory.h>
#include <models/gpt2/gpt2_parallelize.h>

namespace fsdp::models {
namespace {

// Refuses a micro-batch the model does not accept, and sizes where a byte count below could
// overflow int64.
void check_sizes(const GPT2Config& c, int64_t micro_batch, int64_t seq_len) {
  c.validate();
  TORCH_CHECK(micro_batch >= 1 && seq_len >= 1 && seq_len <= c.n_positions,
              "gpt2_memory_spec: need micro_batch >= 1 and 1 <= seq_len <= n_positions = ",
              c.n_positions, ", got micro_batch ", micro_batch, ", seq_len ", seq_len);
  // Every byte count below is an int64; refuse sizes where one could overflow.
  const long double largest = static_cast<long double>(micro_batch) * seq_len *
                              (c.vocab_size + 16.0L * c.n_embd + 8.0L * c.inner_size()) * 8 *
                              c.n_layer;
  TORCH_CHECK(largest < 0x1p62L, "gpt2_memory_spec: a micro-batch of ", micro_batch,
              " sequences of ", seq_len, " tokens needs more than 2^62 bytes of activations");
  const long double state =
      16.0L * c.n_embd *
      (2.0L * c.vocab_size + c.n_positions + (4.0L * c.n_embd + 2.0L * c.inner_size()) * c.n_layer);
  TORCH_CHECK(state < 0x1p62L, "gpt2_memory_spec: n_embd ", c.n_embd, " and n_layer ", c.n_layer,
              " make more than 2^62 bytes of parameters and optimizer state");
}

}  // namespace

ModelMemorySpec gpt2_memory_spec(const GPT2Config& c, int64_t micro_batch, int64_t seq_len,
                                 at::ScalarType compute_dtype, bool activation_checkpoint, int tp,
                                 bool sequence_parallel) {
  check_sizes(c, micro_batch, seq_len);
  const ParamTable params = gpt2_params(c);
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t bt = micro_batch * seq_len;
  const LayerSplit split{
      tp != 1 ? gpt2_block_tp_plan(c, tp, sequence_parallel) : TensorParallelPlan{}, tp,
      bt * c.n_embd * e, activation_checkpoint, e};
  // A block's heads and MLP width on one rank (/ tp under tensor parallelism).
  const int64_t d = c.n_embd, v = c.vocab_size, h = c.n_head / tp, inner = c.inner_size() / tp;
  const int64_t btd = bt * d * e;
  const int64_t bta = btd / tp;        // one of q, k, v or the attention output: this rank's heads
  const int64_t bti = bt * inner * e;  // the MLP's width
  // The residual stream's bytes, and LayerNorm's mean and rstd ([B, T, 1] each, in the compute
  // dtype on CPU), over this rank's sequence shard under sequence parallelism.
  const int64_t shards = sequence_parallel ? tp : 1, stream = btd / shards;
  const int64_t ln_stats = 2 * bt / shards * e;
  const int64_t logsumexp = micro_batch * h * seq_len * 4;  // float for every compute dtype
  // ln_f has a weight and a bias; both embeddings' outputs are scattered (wpe's [1, T, d]).
  const RootSplit root{tp, sequence_parallel, vocabulary_splits(v, tp), btd,
                       bt, 2 * d * e,         seq_len * d * e,          2};
  // The root: wte (= lm_head when tied), wpe, ln_f. Before the blocks it keeps the position ids
  // and the embeddings' sum; after them ln_f's statistics and its (gathered) output.
  ModelMemorySpec spec = root_memory(params, root,
                                     {{"transformer.wte.weight", "lm_head.weight"},
                                      c.tie_word_embeddings,
                                      seq_len * 8 + stream,
                                      ln_stats + btd},
                                     e);

  // Per block: 16 [B, T, d] at the default MLP width 4d; the MLP's c_fc output and its
  // activation are [B, T, inner] each.
  // ln_1's output, the residual sum, ln_2's output and the block's output whole (under sequence
  // parallelism the residual sum and the block's output are shards, the norms' outputs gathered
  // whole); q, k, v and the attention output of this rank's heads.
  const int64_t full_saved = 2 * btd + 2 * stream + 4 * bta + 2 * bti + 2 * ln_stats + logsumexp;
  // The first step of a block's backward is its peak: the MLP's c_proj gives the gradient of
  // the activation's output [B, T, inner] and its own weight and bias gradients, before the
  // activation output it kept is released; the steps after it free about as much as they
  // allocate.
  const int64_t plain_backward_peak = bti + (inner * d + d) * e;
  // the MLP's c_proj output before the residual add
  const LayerMemory plain{full_saved, btd, plain_backward_peak};
  // Checkpointed, forward runs without autograd, so intermediates go when their last reference
  // does; a C++ temporary lives to the end of its full expression, so at c_proj the residual h,
  // ln_2's output, c_fc's output (4 at the default width), the activation (4) and c_proj's
  // output are alive: 11 [B, T, d] above the block's input, 10 above its output.
  spec.units = layer_units(
      params, "h.", activation_checkpoint ? checkpointed(plain, stream, 2 * btd + 2 * bti) : plain,
      split);
  return spec;
}

}  // namespace fsdp::models
