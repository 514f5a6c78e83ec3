// See gpt_case.h.
#include "support/gpt_case.h"
#include "support/test_support.h"

#include <fsdp/util/memory_counter.h>
#include <models/gpt2/gpt2.h>

namespace fsdp::test {

using models::GPT2Config;
using models::GPT2LMHead;
using models::GPT2LMHeadImpl;
using models::GPT2Options;

int64_t gpt2_bytes_kept_for_backward(const GPT2Config& config, int64_t batch, int64_t seq,
                                     bool activation_checkpoint) {
  GPT2LMHead model(GPT2Options(config).seed(1).activation_checkpoint(activation_checkpoint));
  const at::Tensor idx = at::randint(config.vocab_size, {batch, seq}, at::kLong);
  auto counter = std::make_shared<MemoryCounter>();
  CountAllocations count(counter);
  const int64_t before = counter->live_bytes();
  at::Tensor loss = models::loss(model->forward(idx), idx);
  const int64_t held = counter->live_bytes() - before;
  loss.backward();
  return held;
}

TrainCase gpt_case(const GptCaseOptions& opt) {
  TrainCase c;
  const GPT2Config config = GPT2Config::tiny();
  c.loss = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
              const at::Tensor& y) {
    GPT2LMHead model(std::static_pointer_cast<GPT2LMHeadImpl>(m));
    return models::loss(fsdp::forward(model, x), y);
  };
  c.batch = [](int64_t step) { return text_batch(step, 12, 16, 7); };
  c.accumulation = opt.accumulation;
  c.steps = 10;
  // lr 1e-3 keeps Adam's amplification of float32 rounding noise (in gradients that are
  // mathematically ~0, like attention key biases) below the 1e-5 parameter tolerance; the
  // float64 test uses 1e-2.
  c.lr = 1e-3;
  c.weight_decay = 0.1;
  c.max_grad_norm = 1.0;
  FullyShardOptions unit_options;
  unit_options.reshard_after_forward(opt.reshard_after_forward)
      .mp_policy(opt.mp_policy)
      .shard_placement_fn(opt.shard_placement_fn);
  FullyShardOptions root_options;
  root_options.mp_policy(opt.mp_policy).shard_placement_fn(opt.shard_placement_fn);
  const bool deferred = opt.deferred;
  const int prefetch = opt.prefetch;
  c.make_model = [config, unit_options, deferred](const DeviceMesh* mesh) {
    GPT2Options o(config);
    o.seed(42);
    if (mesh != nullptr && deferred) {
      // Each block is sharded the moment it is built (deferred initialization).
      const DeviceMesh m = *mesh;
      o.on_block_built(
          [m, unit_options](const std::string&, const std::shared_ptr<torch::nn::Module>& block) {
            fully_shard(block, m, unit_options);
          });
    }
    return GPT2LMHead(o).ptr();
  };
  const bool head_unit = opt.head_unit;
  c.shard = [unit_options, root_options, deferred, prefetch, head_unit](
                const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto model = std::static_pointer_cast<GPT2LMHeadImpl>(m);
    if (!deferred) {
      for (auto& block : model->transformer->blocks) fully_shard(block, mesh, unit_options);
    }
    if (head_unit) {
      fully_shard(model->lm_head.ptr(), mesh,
                  FullyShardOptions(unit_options).reshard_after_forward(false));
    }
    fully_shard(m, mesh, root_options).set_implicit_prefetch(prefetch);
  };
  return c;
}

}  // namespace fsdp::test
