// Every setting of a training job (train/job_config.h) as a flag and a TOML key, defined once
// here for every program that takes it: fsdp-train takes them all; fsdp-estimate and fsdp-plan
// take the model, the batch and the parallelism flags, with the same names, allowed values and
// help, so that a prediction takes the command line of the run it predicts. Each value is
// checked while the command line (or --config's file) is parsed; settings that depend on
// each other are checked by fsdp::train::validate.
#pragma once

#include <common/config_flags.h>
#include <train/job_config.h>

namespace fsdp::tools {

// [model]: --model and the size overrides; with_init, also --init-from and
// --activation-checkpoint's training-only companions.
void add_model_flags(ConfigFlags& flags, train::ModelConfig& model);
void add_init_flag(ConfigFlags& flags, train::ModelConfig& model);
// [training]: the batch's shape and accumulation (--global-batch, --seq-len, --grad-accum,
// --accum-mode).
void add_batch_flags(ConfigFlags& flags, train::TrainingConfig& training);
// [training]: steps, the optimizer, clipping, the schedule, fp16's gradient scaler.
void add_optimizer_flags(ConfigFlags& flags, train::TrainingConfig& training);
// [data]
void add_data_flags(ConfigFlags& flags, train::DataConfig& data);
// [parallelism]: what every program that predicts or runs a sharded job takes (strategy,
// resharding, replicas, placement, mixed precision, prefetch, the head as a unit, --no-fsdp).
void add_sharding_flags(ConfigFlags& flags, train::ParallelismConfig& parallelism);
// [parallelism]: what only a run takes (all-gather format, wrap policy, gradient division,
// offload, device).
void add_run_parallelism_flags(ConfigFlags& flags, train::ParallelismConfig& parallelism);
// [checkpoint], [metrics], [debug]
void add_checkpoint_flags(ConfigFlags& flags, train::CheckpointConfig& checkpoint);
void add_metrics_flags(ConfigFlags& flags, train::MetricsConfig& metrics);
void add_debug_flags(ConfigFlags& flags, train::DebugConfig& debug);
// [launch]: --nproc, --backend, --timeout-s.
void add_launch_flags(ConfigFlags& flags, train::LaunchConfig& launch);

// Every flag of fsdp-train.
void add_job_flags(ConfigFlags& flags, train::JobConfig& job);

}  // namespace fsdp::tools
