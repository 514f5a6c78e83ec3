// One rank's training run: the state that set-up builds (parallelize.h) and that the loop
// (trainer.cpp) and its helpers (checkpointing.h, step_probe.h, progress.h) read and update.
#pragma once

#include <common/kept_host_pages.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <fsdp/grad_scaler.h>
#include <fsdp/models/model.h>
#include <fsdp/train/checkpoint_manager.h>
#include <fsdp/train/lr_schedule.h>
#include <fsdp/train/metrics_sink.h>
#include <fsdp/util/memory_counter.h>
#include <fsdp/util/trace.h>
#include <fsdp_train/batch_dump.h>
#include <fsdp_train/trainer.h>

#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::train {

// Everything one rank's training run holds, built once by the trainer's set-up and then read by
// the step and the helpers around it. Never moved: set-up's unit callback refers to it.
struct Run {
  Run(const JobConfig& options, std::shared_ptr<ProcessGroup> process_group,
      std::shared_ptr<const models::ModelSpec> model_spec)
      : o(options), group(std::move(process_group)), spec(std::move(model_spec)) {}
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  const JobConfig& o;
  std::shared_ptr<ProcessGroup> group;  // null: the --no-fsdp reference
  int world = 1;
  int rank = 0;
  // The data-parallel rank and size: what the global batch is split over (rank and world, but
  // under --tp the dp coordinate and W / tp: a tp group's ranks train on the same rows).
  int data_rank = 0;
  int data_world = 1;
  bool printing = false;  // rank 0 without --quiet

  c10::Device device = at::kCPU;  // where the model computes (--device)
  bool count_memory = false;      // --metrics or --tensorboard counts CPU tensor bytes
  // Activation bytes are counted on this (the compute) thread only: a collective's temporaries
  // on the process group's thread are not autograd's, whenever they happen to be freed.
  std::shared_ptr<MemoryCounter> thread_memory = std::make_shared<MemoryCounter>();
  std::optional<CountAllocations> count_thread;

  std::shared_ptr<const models::ModelSpec> spec;
  std::optional<DeviceMesh> mesh;     // FSDP's: the dp dimension under --tp
  std::optional<DeviceMesh> tp_mesh;  // --tp N > 1: each unit's tensor-parallel group
  std::unique_ptr<models::Model> built;
  std::shared_ptr<torch::nn::Module> model;
  std::optional<FSDPModule> root;
  // What every unit reports (bytes held, exposed communication, --trace's spans); the --no-fsdp
  // reference has no units and traces only its own compute into it.
  std::shared_ptr<RankMonitor> monitor = std::make_shared<RankMonitor>();
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  LrSchedule schedule;
  std::optional<CheckpointManager> checkpoints;  // --save, --save-every, --resume

  MetricsSinks metrics;  // --metrics and --tensorboard (rank 0; none elsewhere)
  BatchDump batches;     // --dump-batches (rank 0)
  int64_t first_step = 0;
  double elapsed = 0;                       // seconds spent in steps so far
  double tokens_done = 0;                   // tokens trained in those steps (tokens_per_s's)
  int64_t skipped_steps = 0;                // non-finite steps skipped (--skip-nonfinite)
  std::optional<ShardedGradScaler> scaler;  // fp16's dynamic loss scaling
  int64_t overflow_skips = 0;               // steps skipped because gradients overflowed (fp16)
  int64_t resumed_skips = 0;                // steps the run a resume continues skipped
  int64_t units = 0;                        // FSDP units, the root included (0 without FSDP)
  std::string placement;                    // --strategy whole_tensor: the partition, described
  // Gives the host pages jemalloc keeps back when they outgrow a step's ([Note: a bound on the
  // kept pages]).
  tools::KeptHostPages host_pages;
};

// Every step so far that updated nothing, on every rank.
inline int64_t skipped_steps(const Run& run) {
  return run.skipped_steps + run.overflow_skips + run.resumed_skips;
}

}  // namespace fsdp::train
