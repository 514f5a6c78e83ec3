// The GPT-2 block's tensor-parallel plan; see gpt2_parallelize.h.
#include <models/gpt2/gpt2_parallelize.h>

#include <models/common/parallelize.h>

#include <c10/util/Exception.h>

namespace fsdp::models {

TensorParallelPlan gpt2_block_tp_plan(const GPT2Config& config, int tp, bool sequence_parallel) {
  TORCH_CHECK(tp >= 1, "tensor-parallel size ", tp, " must be at least 1");
  // Whole heads per rank: a head split across ranks would need its attention scores summed.
  TORCH_CHECK(config.n_head % tp == 0, "tensor parallelism over ", tp,
              " ranks needs n_head divisible by it, got ", config.n_head);
  TORCH_CHECK(config.inner_size() % tp == 0, "tensor parallelism over ", tp,
              " ranks needs the MLP width divisible by it, got ", config.inner_size());
  // Under sequence parallelism the residual stream stays in sequence shards (see Llama's plan).
  const Layout stream = sequence_parallel ? Layout::kSequenceShard : Layout::kReplicate;
  TensorParallelPlan plan = {{"attn.c_attn", ColwiseParallel(/*packed=*/3)},
                             {"attn.c_proj", RowwiseParallel(stream)},
                             {"mlp.c_fc", ColwiseParallel()},
                             {"mlp.c_proj", RowwiseParallel(stream)}};
  if (sequence_parallel) {
    for (const char* norm : {"ln_1", "ln_2"}) plan.push_back({norm, SequenceParallel()});
    for (const char* block : {"attn", "mlp"})
      plan.push_back({block, PrepareModuleInput(Layout::kSequenceShard, Layout::kReplicate)});
  }
  return plan;
}

TensorParallelPlan gpt2_root_tp_plan(const GPT2Config& config, int tp, bool sequence_parallel) {
  return root_tp_plan({"transformer.wte", "lm_head", "transformer.ln_f", "transformer.wpe"},
                      config.vocab_size, tp, sequence_parallel);
}

}  // namespace fsdp::models
