// The sharded checkpoint formats side by side (checkpoint.h's "either sharded format"): their
// names, telling them apart on disk, and dispatching to each one's save and load.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/dcp_hf.h>
#include <fsdp/checkpoint/format.h>

#include "checkpoint/file_util.h"
#include "checkpoint/step_dirs.h"

#include <c10/util/Exception.h>

namespace fsdp::checkpoint {
namespace {

constexpr CheckpointFormat kFormats[] = {CheckpointFormat::kSharded, CheckpointFormat::kDcpHf};

bool is_sharded_checkpoint(const std::string& dir) {
  return detail::path_exists(dir + "/" + kIndexFileName);
}

}  // namespace

const char* checkpoint_format_name(CheckpointFormat format) {
  return format == CheckpointFormat::kDcpHf ? "dcp-hf" : "sharded";
}

std::optional<CheckpointFormat> parse_checkpoint_format(const std::string& name) {
  for (CheckpointFormat f : kFormats) {
    if (name == checkpoint_format_name(f)) return f;
  }
  return std::nullopt;
}

std::vector<std::string> checkpoint_format_names() {
  std::vector<std::string> names;
  for (CheckpointFormat f : kFormats) names.push_back(checkpoint_format_name(f));
  return names;
}

CheckpointFormat checkpoint_format_of(const std::string& path) {
  const std::string dir = detail::resolve_step_dir(
      path,
      [](const std::string& d) { return is_sharded_checkpoint(d) || is_dcp_hf_checkpoint(d); },
      "metadata.json (fsdp's sharded format) or model/ (DCP's Hugging Face layout)");
  return is_sharded_checkpoint(dir) ? CheckpointFormat::kSharded : CheckpointFormat::kDcpHf;
}

SaveResult save_checkpoint(CheckpointFormat format, const std::string& root,
                           const torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                           ProcessGroup* group, const SaveOptions& options) {
  if (format == CheckpointFormat::kDcpHf) {
    return save_dcp_hf(root, model, optimizer, group, options);
  }
  return save_sharded(root, model, optimizer, group, options);
}

LoadResult load_checkpoint(const std::string& path, torch::nn::Module& model,
                           torch::optim::Optimizer* optimizer, ProcessGroup* group) {
  if (checkpoint_format_of(path) == CheckpointFormat::kDcpHf) {
    return load_dcp_hf(path, model, optimizer, group);
  }
  return load_sharded(path, model, optimizer, group);
}

}  // namespace fsdp::checkpoint
