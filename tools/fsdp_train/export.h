// --export: the trained model as a Hugging Face model directory (fsdp/train/hf_export.h), with
// --export-dtype and --export-max-shard-size, and the tokenizer and generation files of the
// Hugging Face directory --model named, if it named one.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/models/model.h>
#include <train/job_config.h>

#include <torch/nn/module.h>

namespace fsdp::train {

// Collective over group (null: one process); with printing, rank 0 says what it wrote. Does
// nothing without --export.
void export_model(const JobConfig& job, const models::ModelSpec& spec, torch::nn::Module& model,
                  ProcessGroup* group, bool printing);

}  // namespace fsdp::train
