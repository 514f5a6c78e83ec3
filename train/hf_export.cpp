// export_hf (fsdp/train/hf_export.h): the weights through checkpoint::save_full with the model
// family's Hugging Face layout, then, on rank 0 only, the config.json and the companion copies
// (every rank waits in save_full, so the directory exists by then).
#include <fsdp/train/hf_export.h>

#include <c10/util/Exception.h>

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
  TORCH_CHECK(in.good(), "export: cannot read '", from, "'");
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  out.close();
  TORCH_CHECK(out.good(), "export: cannot write '", to, "' (a copy of '", from, "')");
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

HfExportResult export_hf(const std::string& path, const models::ModelSpec& spec,
                         torch::nn::Module& model, ProcessGroup* group,
                         const HfExportOptions& options) {
  checkpoint::ExportOptions export_options;
  export_options.layout(spec.hf_layout()).max_shard_bytes(options.max_shard_bytes());
  export_options.dtype(options.dtype());
  HfExportResult result;
  result.weights = checkpoint::save_full(path, model, group, export_options);
  if (group != nullptr && group->rank() != 0) return result;
  const std::string dir = directory_of(path);
  result.config_path = dir + "config.json";
  std::ofstream config_file(result.config_path, std::ios::out | std::ios::trunc);
  config_file << spec.hf_config_json(options.dtype().value_or(at::kFloat));
  config_file.close();
  TORCH_CHECK(config_file.good(), "cannot write '", result.config_path, "'");
  if (!options.companions_from().empty()) {
    result.companions_copied = copy_companions(options.companions_from(), dir);
  }
  return result;
}

}  // namespace fsdp::train
