// The numbers of one training step, as a metrics sink (fsdp/train/metrics_sink.h) records them:
// what every sink writes comes from this one record, so two sinks of a run never disagree.
// fsdp-train fills every field; a program of its own fills those it measures and leaves the
// others at their defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace fsdp::train {

// One rank's numbers for a step, as written under "ranks" in the metrics file.
struct RankStepStats {
  int rank = 0;
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optim_bytes = 0;
  int64_t peak_unsharded_bytes = 0;
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  // All-reduce payload: gradients across replicas (no_shard, hybrid_shard), the gradient norm
  // and, when the mesh's group is the world, the step's loss.
  int64_t all_reduce_bytes = 0;
  // whole_tensor: the broadcasts of parameters and the reduces of gradients to their owners.
  int64_t broadcast_bytes = 0;
  int64_t reduce_bytes = 0;
  // Under --tp: the collectives the tensor-parallel group ran in the step, by kind (their bytes
  // are counted above with FSDP's); clipping's all-reduce over the group is one of them.
  int64_t tp_all_gather_calls = 0;
  int64_t tp_reduce_scatter_calls = 0;
  int64_t tp_all_reduce_calls = 0;
  // What the process has measured of itself (Linux; 0 elsewhere): its peak resident memory so
  // far (VmHWM), and the bytes it wrote during the step, to sockets and files alike
  // (/proc/self/io wchar: the bytes every collective sent, plus the small metrics writes).
  int64_t peak_rss_bytes = 0;
  int64_t sent_bytes = 0;
  // With --metrics, CPU tensors are counted by fsdp's counting allocator
  // (include/fsdp/util/memory_counter.h): the most bytes alive at once in the process during
  // the step (parameters and optimizer state included; what fsdp-estimate's total_bytes
  // predicts), and the bytes autograd holds for backward at the end of the step's first
  // forward (allocated by the compute thread during forward and still alive, minus the
  // parameters gathered and communication buffers still held).
  int64_t peak_alloc_bytes = 0;
  int64_t activation_bytes = 0;
  // fsdp-train on jemalloc with its decay off: the freed host pages the allocator keeps for the
  // next step, at the step's end, and those given back to the kernel since the last step's end
  // because they outgrew what a step needs (step 1: those set-up freed), as
  // tools/common/kept_host_pages.cpp says ([Note: a bound on the kept pages]); 0 on another
  // allocator.
  int64_t host_kept_bytes = 0;
  int64_t host_returned_bytes = 0;
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;  // on fine-tuning data, trained (unmasked) targets per second
  double step_s = 0;
  double exposed_comm_s = 0;  // rank 0's time blocked on FSDP communication in the step
  std::vector<RankStepStats> ranks;
  double lr = 0;                   // the learning rate the step took
  std::optional<double> val_loss;  // held-out loss after the step, when evaluated
  // Steps skipped so far without an update: non-finite ones (--skip-nonfinite) and, under fp16,
  // those whose gradients overflowed at the loss scale.
  int64_t skipped_steps = 0;
  std::optional<double> loss_scale;  // fp16: the scale this step's loss was multiplied by
  int64_t units = 0;                 // FSDP units, the root included (0 under --no-fsdp)
  // Under --tp: rank 0's time blocked in the tensor-parallel group's collectives in the step
  // (inside its layers' forward and backward; not in exposed_comm_s).
  std::optional<double> tp_comm_s;
  // Rank 0's seconds of collectives in the step: each FSDP process group's busy_s (its
  // collectives from start to end), summed over the groups, so that two groups' collectives at
  // the same time count twice, as fsdp-plan's comm_s does. The trainer's own all-reduces (loss,
  // clipping) are in it; the tensor-parallel group's are not.
  double comm_s = 0;
};

}  // namespace fsdp::train
