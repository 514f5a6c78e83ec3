// How a unit's gradients are scaled and reduced: FSDP2's _get_gradient_divide_factors, as data.
//
// Every rank's backward produces a gradient of its own micro-batch's loss; the sharded gradient
// the optimizer sees is their sum over the D = shard size x replicate size data-parallel ranks
// divided by a factor F (D unless set_gradient_divide_factor says otherwise). Where the division
// happens decides the collectives' ops and the rounding:
//   - fp32 and bf16 reductions (no overflow risk), no force-sum: the collectives divide.
//     Default F: reduce-scatter and all-reduce both kAvg (kSum when D = 1). Explicit F: the
//     reduce-scatter is kAvg if F equals the shard size, else a sum of inputs premultiplied by
//     1/F (NCCL's PreMulSum in FSDP2; here the input is multiplied by 1/F, then kSum); the
//     all-reduce across replicas is kSum.
//   - fp16 and other dtypes (overflow risk): kSum everywhere, the input divided by a power of
//     two p close to sqrt(F) before the sum and the output by F / p after it, so that neither
//     the summands nor the sum leave fp16's range.
//   - force_sum_reduction_for_comms (FSDP2's set_force_sum_reduction_for_comms): kSum
//     everywhere; fp32/bf16 divide by F after the reduction, other dtypes split as above.
// The post-divide runs after the all-reduce across replicas and after the all-reduce hook.
#pragma once

#include <fsdp/comm/process_group.h>

#include <c10/core/ScalarType.h>

#include <optional>

namespace fsdp::detail {

struct GradientReduction {
  // Multiply the reduce-scatter input by this before the collective (1: nothing to do). A
  // premultiplied sum's 1/F, or the reciprocal of the overflow-safe pre-divide p.
  double pre_scale = 1.0;
  // Divide the reduced (and all-reduced, and hooked) output by this (1: nothing to do).
  double post_divide = 1.0;
  ReduceOp reduce_scatter_op = ReduceOp::kSum;
  ReduceOp all_reduce_op = ReduceOp::kSum;
};

// The plan for a unit on a mesh of shard_size x replicate_size ranks reducing in reduce_dtype,
// with FSDP2's gradient_divide_factor (nullopt: the data-parallel size) and
// force_sum_reduction_for_comms. factor, when set, is finite and > 0 (the setter checks).
GradientReduction plan_gradient_reduction(int shard_size, int replicate_size,
                                          at::ScalarType reduce_dtype, std::optional<double> factor,
                                          bool force_sum);

}  // namespace fsdp::detail
