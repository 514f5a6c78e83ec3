// --export: the trained model as a Hugging Face model directory that transformers loads as it
// is: the weights (one safetensors file or shards with an index), config.json, and, for a model
// that came from a Hugging Face directory, that directory's tokenizer and generation files.
#pragma once

#include <fsdp/comm/process_group.h>
#include <models/model.h>
#include <train/job_config.h>

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace fsdp::train {

// Collective over group (null: one process); rank 0 writes config.json and the copies, and with
// printing says what it wrote.
void export_model(const JobConfig& job, const models::ModelSpec& spec, torch::nn::Module& model,
                  ProcessGroup* group, bool printing);

// The files beside a Hugging Face model's weights that are not weights or config.json and that
// from_pretrained reads (tokenizer, its configuration, generation defaults), in this order.
const std::vector<std::string>& companion_file_names();

}  // namespace fsdp::train
