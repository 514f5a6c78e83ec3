// The GPT-2 block's tensor-parallel plan; see gpt2_parallelize.h.
#include <models/gpt2/gpt2_parallelize.h>

#include <c10/util/Exception.h>

namespace fsdp::models {

TensorParallelPlan gpt2_block_tp_plan(const GPT2Config& config, int tp) {
  TORCH_CHECK(tp >= 1, "tensor-parallel size ", tp, " must be at least 1");
  // Whole heads per rank: a head split across ranks would need its attention scores summed.
  TORCH_CHECK(config.n_head % tp == 0, "tensor parallelism over ", tp,
              " ranks needs n_head divisible by it, got ", config.n_head);
  TORCH_CHECK(config.inner_size() % tp == 0, "tensor parallelism over ", tp,
              " ranks needs the MLP width divisible by it, got ", config.inner_size());
  return {{"attn.c_attn", ColwiseParallel(/*packed=*/3)},
          {"attn.c_proj", RowwiseParallel()},
          {"mlp.c_fc", ColwiseParallel()},
          {"mlp.c_proj", RowwiseParallel()}};
}

}  // namespace fsdp::models
