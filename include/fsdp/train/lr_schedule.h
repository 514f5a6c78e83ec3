// Learning-rate schedules: constant, cosine and warmup-stable-decay (wsd), each after an
// optional linear warm-up. The rate of a step is a pure function of the step, the total number
// of steps and the schedule's settings, so a resumed run takes exactly the rates an
// uninterrupted one takes: nothing about a schedule needs saving in a checkpoint.
#pragma once

#include <cstdint>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace fsdp::train {

enum class LrScheduleKind { kConstant, kCosine, kWsd };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double peak_lr = 3e-3;     // the rate after warm-up
  double min_lr = 0;         // where cosine and wsd end
  int64_t warmup_steps = 0;  // linear warm-up over the first N steps
  double decay_frac = 0.2;   // wsd: the last fraction of the steps decays
  int64_t total_steps = 1;   // of the whole run, resumed parts included
};

// The rate of 0-based step `step` (the step that takes the model from `step` to `step + 1`):
// - warm-up, for step < warmup_steps: peak_lr * (step + 1) / warmup_steps;
// - constant: peak_lr;
// - cosine: min_lr + (peak_lr - min_lr) * (1 + cos(pi * p)) / 2, with
//   p = (step - warmup_steps) / (total_steps - warmup_steps);
// - wsd: peak_lr until the last D = round(decay_frac * total_steps) steps, then linearly down:
//   peak_lr - (peak_lr - min_lr) * (step - (total_steps - D) + 1) / D, so the last step is at
//   min_lr.
// Throws naming the schedule's settings and the step when step < 0.
double lr_at(const LrSchedule& schedule, int64_t step);

// Sets lr_at(schedule, step) on every parameter group of optimizer and returns it. An
// optimizer's state carries no schedule: call it before every optimizer step, and a resumed
// run takes the same rates.
double apply_lr(torch::optim::Optimizer& optimizer, const LrSchedule& schedule, int64_t step);

}  // namespace fsdp::train
