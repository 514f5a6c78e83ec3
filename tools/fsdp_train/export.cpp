#include <fsdp_train/export.h>

#include <fsdp/checkpoint/checkpoint.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <sys/stat.h>

#include <fstream>
#include <sstream>

namespace fsdp::train {
namespace {

// The directory part of path, with its trailing slash ("" for a bare file name). (No
// std::filesystem: libtorch.so exports a clashing copy of parts of it.)
std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Copies from's bytes to to; throws naming both on a failure.
void copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  TORCH_CHECK(in.good(), "--export: cannot read '", from, "'");
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  out.close();
  TORCH_CHECK(out.good(), "--export: cannot write '", to, "' (a copy of '", from, "')");
}

// The companion files of the Hugging Face directory the model came from, copied beside the
// export; returns how many.
int copy_companions(const std::string& model_dir, const std::string& export_dir) {
  int copied = 0;
  for (const std::string& name : companion_file_names()) {
    const std::string from = model_dir + "/" + name, to = export_dir + name;
    struct stat st {};
    if (::stat(from.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || same_file(from, to)) continue;
    copy_file(from, to);
    ++copied;
  }
  return copied;
}

}  // namespace

const std::vector<std::string>& companion_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "added_tokens.json",
                                                 "vocab.json",
                                                 "merges.txt",
                                                 "tokenizer.model",
                                                 "generation_config.json"};
  return names;
}

void export_model(const JobConfig& job, const models::ModelSpec& spec, torch::nn::Module& model,
                  ProcessGroup* group, bool printing) {
  const CheckpointConfig& c = job.checkpoint;
  if (c.export_path.empty()) return;
  checkpoint::ExportOptions options;
  options.layout(spec.hf_layout()).max_shard_bytes(c.export_max_shard_bytes);
  if (c.export_dtype == at::kBFloat16) options.dtype(at::kBFloat16);
  const auto exported = checkpoint::save_full(c.export_path, model, group, options);
  if (group != nullptr && group->rank() != 0) return;
  const std::string dir = directory_of(c.export_path), config_path = dir + "config.json";
  std::ofstream config_file(config_path, std::ios::out | std::ios::trunc);
  config_file << spec.hf_config_json(options.dtype().value_or(at::kFloat));
  config_file.close();
  TORCH_CHECK(config_file.good(), "cannot write '", config_path, "'");
  const int copied =
      models::is_pretrained_dir(job.model.name) ? copy_companions(job.model.name, dir) : 0;
  if (!printing) return;
  fmt::print("fsdp-train: exported {} and {} ({:.1f} MB in {:.2f}s){}\n", c.export_path,
             config_path, exported.bytes / 1e6, exported.seconds,
             copied == 0 ? ""
                         : fmt::format(", and {} tokenizer and generation files of {}", copied,
                                       job.model.name));
}

}  // namespace fsdp::train
