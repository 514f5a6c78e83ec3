// --export (export.h): the job's settings turned into export_hf's options, and the report.
#include <fsdp_train/export.h>

#include <fsdp/train/hf_export.h>

#include <fmt/format.h>

namespace fsdp::train {

void export_model(const JobConfig& job, const models::ModelSpec& spec, torch::nn::Module& model,
                  ProcessGroup* group, bool printing) {
  const CheckpointConfig& c = job.checkpoint;
  if (c.export_path.empty()) return;
  HfExportOptions options;
  options.max_shard_bytes(c.export_max_shard_bytes);
  if (c.export_dtype == at::kBFloat16) options.dtype(at::kBFloat16);
  if (models::is_pretrained_dir(job.model.name)) options.companions_from(job.model.name);
  const HfExportResult exported = export_hf(c.export_path, spec, model, group, options);
  if (!printing) return;
  fmt::print("fsdp-train: exported {} and {} ({:.1f} MB in {:.2f}s){}\n", c.export_path,
             exported.config_path, exported.weights.bytes / 1e6, exported.weights.seconds,
             exported.companions_copied == 0
                 ? ""
                 : fmt::format(", and {} tokenizer and generation files of {}",
                               exported.companions_copied, job.model.name));
}

}  // namespace fsdp::train
