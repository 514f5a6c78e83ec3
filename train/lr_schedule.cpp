// Learning-rate schedules: closed forms of the step, no state, so a resume restores the rate by
// recomputing it. Warm-up takes precedence over every schedule; the schedules' progress counts
// from the end of warm-up.
#include <fsdp/train/lr_schedule.h>

#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>

namespace fsdp::train {

double lr_at(const LrSchedule& s, int64_t step) {
  TORCH_CHECK(step >= 0, "lr_at: step must be non-negative, got ", step);
  if (step < s.warmup_steps) {
    return s.peak_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  switch (s.kind) {
    case LrScheduleKind::kConstant:
      return s.peak_lr;
    case LrScheduleKind::kCosine: {
      const int64_t span = std::max<int64_t>(1, s.total_steps - s.warmup_steps);
      const double p = static_cast<double>(step - s.warmup_steps) / static_cast<double>(span);
      return s.min_lr + (s.peak_lr - s.min_lr) * (1 + std::cos(M_PI * p)) / 2;
    }
    case LrScheduleKind::kWsd: {
      const auto decay = static_cast<int64_t>(std::llround(s.decay_frac * s.total_steps));
      const int64_t decay_start = s.total_steps - decay;
      if (decay == 0 || step < decay_start) return s.peak_lr;
      return s.peak_lr - (s.peak_lr - s.min_lr) * static_cast<double>(step - decay_start + 1) /
                             static_cast<double>(decay);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown learning-rate schedule");
}

double apply_lr(torch::optim::Optimizer& optimizer, const LrSchedule& schedule, int64_t step) {
  const double lr = lr_at(schedule, step);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
  return lr;
}

}  // namespace fsdp::train
