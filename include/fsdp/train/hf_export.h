// The trained model as a Hugging Face model directory that transformers loads as it is: the
// weights (one safetensors file, or shards with an index), config.json, and, for a model that
// came from a Hugging Face directory, that directory's tokenizer and generation files.
#pragma once

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/models/model.h>

#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::train {

struct HfExportOptions {
  // Element type of the weights. (optional) defaults to each parameter's own (float32);
  // kBFloat16 halves the files.
  TORCH_ARG(std::optional<at::ScalarType>, dtype) = std::nullopt;
  // > 0: shards of at most this many tensor bytes, as transformers' save_pretrained
  // (max_shard_size) writes them (checkpoint::ExportOptions::max_shard_bytes). (optional)
  // defaults to 0: one file.
  TORCH_ARG(int64_t, max_shard_bytes) = 0;
  // A Hugging Face directory whose companion files (companion_file_names()) are copied beside
  // the weights. (optional) defaults to "": none.
  TORCH_ARG(std::string, companions_from) = "";
};

struct HfExportResult {
  checkpoint::ExportResult weights;
  std::string config_path;    // the config.json written beside the weights ("" off rank 0)
  int companions_copied = 0;  // files copied from companions_from (rank 0)
};

// Writes model (sharded or not) as spec's Hugging Face class to the safetensors file path, with
// config.json in path's directory. Collective over group (null: one process); rank 0 writes
// config.json and the copies. Throws naming the file that cannot be read or written.
HfExportResult export_hf(const std::string& path, const models::ModelSpec& spec,
                         torch::nn::Module& model, ProcessGroup* group,
                         const HfExportOptions& options = {});

// The files beside a Hugging Face model's weights that are not weights or config.json and that
// from_pretrained reads (tokenizer, its configuration, generation defaults), in this order.
const std::vector<std::string>& companion_file_names();

}  // namespace fsdp::train
