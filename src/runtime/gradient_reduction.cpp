// FSDP2's gradient divide rules (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
// _get_gradient_divide_factors), restated; see gradient_reduction.h.
#include "runtime/gradient_reduction.h"

#include <cmath>

namespace fsdp::detail {

GradientReduction plan_gradient_reduction(int shard_size, int replicate_size,
                                          at::ScalarType reduce_dtype, std::optional<double> factor,
                                          bool force_sum) {
  GradientReduction plan;
  const int data_parallel = shard_size * replicate_size;
  // fp32 and bf16 have fp32's range: a sum of D gradients cannot overflow where their mean
  // does not, so the collectives may divide.
  const bool overflow_risk = reduce_dtype != at::kFloat && reduce_dtype != at::kBFloat16;
  if (!overflow_risk && !force_sum) {
    if (!factor.has_value()) {
      const ReduceOp op = data_parallel == 1 ? ReduceOp::kSum : ReduceOp::kAvg;
      plan.reduce_scatter_op = plan.all_reduce_op = op;
      return plan;
    }
    if (*factor == shard_size) {
      plan.reduce_scatter_op = ReduceOp::kAvg;
    } else {
      plan.pre_scale = 1.0 / *factor;  // PreMulSum(1/F)
    }
    return plan;  // the all-reduce across replicas sums
  }
  const double f = factor.value_or(static_cast<double>(data_parallel));
  if (!overflow_risk) {
    plan.post_divide = f;  // one division, on the smaller (reduced) tensor
    return plan;
  }
  // Divide by p ~ sqrt(F) before and by F / p after: p doubles from 1 while it divides F and is
  // below F / p (FSDP2's loop; F = 4 gives 2 and 2, F = 8 gives 4 and 2, F = 3 gives 2 and 1.5).
  double p = 1;
  while (std::fmod(f, p) == 0 && f / p > p) p *= 2;
  plan.pre_scale = 1.0 / p;
  plan.post_divide = f / p;
  return plan;
}

}  // namespace fsdp::detail
