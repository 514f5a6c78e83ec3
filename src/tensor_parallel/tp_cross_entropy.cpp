// fsdp::vocab_parallel_cross_entropy and fsdp::splits_vocabulary (see fsdp/tensor_parallel.h).
//
// [Note: the vocabulary-parallel cross-entropy]
// For a row of logits z over the whole vocabulary (its columns split over the group) and target
// t: loss = log(sum_j exp(z_j - m)) - (z_t - m), m the row's maximum over every rank's columns
// (for range only; all-gathered, as the process groups have no max reduction, and exact). Each
// rank sums exp(z_j - m) over its columns and picks z_t - m when t is among them (0 otherwise);
// one all-reduce of both adds the ranks' parts. The gradient, softmax(z) - onehot(t), needs only
// each rank's own columns: the backward communicates nothing. Memory: the softmax of this rank's
// columns, float32, as the whole vocabulary's log-softmax is kept without tensor parallelism.
//
// [Note: the softmax as exp of the log-softmax]
// The softmax is computed as exp(z - m - log(sum)), the way log_softmax's backward forms it for
// at::cross_entropy_loss, not as exp(z - m) / sum: the two round each element differently, and a
// head row whose gradient is a cancelling sum over the batch (a token the batch never has)
// turns those independent roundings into a visibly different AdamW step (2.4e-5 on llama-tiny's
// exported head after 4 steps, against 9e-6 for the whole-vocabulary loss). Computed the same
// way, the two losses differ only by how the sum of exponentials is added up: a common factor
// on a row, which does not cancel away.
#include <fsdp/tensor_parallel.h>

#include "tensor_parallel/tp_layer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

namespace fsdp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rows' maxima over the whole vocabulary, from each rank's maxima of its columns.
at::Tensor global_maxima(const at::Tensor& logits, const detail::TpSite& site) {
  const at::Tensor mine = logits.amax(1).contiguous();
  at::Tensor all = at::empty({site.group->size(), mine.size(0)}, mine.options());
  detail::run_checked(site, "all-gather", "the logits' row maxima",
                      [&] { return site.group->all_gather_into_tensor(all, mine); });
  return all.amax(0);
}

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, const c10::IValue& site_value,
                            int64_t ignore_index, int64_t first) {
    ctx->saved_data["site"] = site_value;
    const detail::TpSite& site = detail::site_of(ctx);
    const int64_t columns = logits.size(1);
    const at::Tensor shifted = logits - global_maxima(logits, site).unsqueeze(1);
    const at::Tensor local = targets - first;
    const at::Tensor kept = targets != ignore_index;
    const at::Tensor here = local.ge(0).logical_and(local.lt(columns)).logical_and(kept);
    const at::Tensor index = local.clamp(0, columns - 1).unsqueeze(1);
    at::Tensor sums = at::stack({shifted.exp().sum(1), shifted.gather(1, index).squeeze(1) * here});
    detail::run_checked(site, "all-reduce", "the sums of exponentials and the target logits",
                        [&] { return site.group->all_reduce(sums, ReduceOp::kSum); });
    // [Note: the softmax as exp of the log-softmax]
    const at::Tensor log_sum = sums[0].log();
    ctx->save_for_backward({(shifted - log_sum.unsqueeze(1)).exp_(), index, here, kept});
    return (log_sum - sums[1]).masked_fill(kept.logical_not(), 0);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &softmax = saved[0], &index = saved[1], &here = saved[2], &kept = saved[3];
    const at::Tensor g = grads[0] * kept;
    at::Tensor grad = softmax * g.unsqueeze(1);
    grad.scatter_add_(1, index, (-(g * here)).unsqueeze(1));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool splits_vocabulary(const torch::nn::Module& head) {
  const detail::TpLayer* tp = detail::tp_layer_of(head);
  return tp != nullptr && tp->style.kind() == ParallelStyle::Kind::kColwise;
}

at::Tensor vocab_parallel_cross_entropy(const torch::nn::Module& head, const at::Tensor& logits,
                                        const at::Tensor& targets, int64_t ignore_index) {
  const detail::TpLayer* tp = detail::tp_layer_of(head);
  TORCH_CHECK(tp != nullptr && tp->style.kind() == ParallelStyle::Kind::kColwise,
              "vocab_parallel_cross_entropy: the head '", head.name(),
              "' does not split its logits over the vocabulary (no ColwiseParallel style)");
  TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
              "vocab_parallel_cross_entropy expects logits [N, V_r] and targets [N], got logits ",
              logits.sizes(), " and targets ", targets.sizes());
  // Reduced-precision logits in float32, as at::cross_entropy_loss's callers upcast them.
  const at::Tensor wide =
      c10::isReducedFloatingType(logits.scalar_type()) ? logits.to(at::kFloat) : logits;
  return VocabParallelCrossEntropy::apply(wide, targets, detail::site_capsule(tp->site),
                                          ignore_index, tp->first);
}

}  // namespace fsdp
