// load_dcp_hf (include/fsdp/checkpoint/dcp_hf.h): a checkpoint in DCP's Hugging Face layout,
// ours or PyTorch FSDP2's, into a model sharded any way.
//
// Everything is validated before the model is touched: the manifest when there is one (and
// that it lists exactly the files there are, at their sizes), every file's header, each
// tensor's chunks tiling it (format.h's assemble_dcp_tensors), the model's names and shapes and
// the optimizer's keys. Then each local tensor is filled from the chunks that overlap its box
// (see [Note: a parameter's chunk]): a chunk needed whole and of the same dtype is read straight
// into place; one needed in part is read whole into a buffer (so its checksum, when it has one,
// is verified) and its overlap copied. Padding is zeroed.
#include <fsdp/checkpoint/dcp_hf.h>
#include <fsdp/checkpoint/format.h>
#include <fsdp/checkpoint/safetensors.h>

#include "checkpoint/adamw_state.h"
#include "checkpoint/common.h"
#include "checkpoint/dcp_hf_layout.h"
#include "checkpoint/file_util.h"
#include "checkpoint/step_dirs.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>

namespace fsdp::checkpoint {
namespace {

using detail::Chunk;
using detail::LocalParam;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMaxManifestBytes = 256ull << 20;
constexpr char kSuffix[] = ".safetensors";

// The .safetensors files directly in dir, sorted: what DCP's reader lists. None when dir is
// missing.
std::vector<std::string> safetensors_in(const std::string& dir) {
  std::vector<std::string> names;
  if (!detail::is_directory(dir)) return names;
  const size_t n = std::strlen(kSuffix);
  for (const auto& name : detail::list_directory(dir)) {
    if (name.size() > n && name.compare(name.size() - n, n, kSuffix) == 0 &&
        !detail::is_directory(dir + "/" + name)) {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// model/ or optim/ of a checkpoint: its files, open, and the tensors they hold.
struct Part {
  std::vector<SafetensorsReader> readers;
  std::map<std::string, DcpTensor> tensors;
  int64_t bytes = 0;
};

Part open_part(const std::string& dir) {
  Part part;
  std::vector<DcpFileHeader> headers;
  for (const auto& name : safetensors_in(dir)) part.readers.emplace_back(dir + "/" + name);
  for (const auto& r : part.readers) {
    headers.push_back({r.path(), &r.header()});
    part.bytes += static_cast<int64_t>(r.header().data_offset + r.header().data_bytes);
  }
  try {
    part.tensors = assemble_dcp_tensors(headers);
  } catch (const FormatError& e) {
    TORCH_CHECK(false, "checkpoint directory '", dir,
                "' is not a valid DCP checkpoint: ", e.what());
  }
  return part;
}

std::optional<DcpManifest> read_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kDcpManifestName;
  if (!detail::path_exists(path)) return std::nullopt;
  const std::string text = detail::read_file(path, kMaxManifestBytes);
  try {
    return parse_dcp_manifest(text);
  } catch (const FormatError& e) {
    TORCH_CHECK(false, "'", path, "' is not a valid manifest: ", e.what());
  }
}

// The files the manifest lists must be exactly the .safetensors files there are (DCP's reader
// would read a stray one too), each of the recorded size.
void check_manifest_files(const std::string& dir, const DcpManifest& manifest) {
  std::map<std::string, uint64_t> listed;
  for (const auto& f : manifest.files) listed[f.path] = f.bytes;
  std::vector<std::string> problems;
  for (const char* part : {kDcpModelDir, kDcpOptimDir}) {
    for (const auto& name : safetensors_in(dir + "/" + part)) {
      const std::string path = std::string(part) + "/" + name;
      if (listed.count(path) == 0) {
        problems.push_back(path + " is not in the manifest (left by another save?)");
      }
    }
  }
  for (const auto& [path, bytes] : listed) {
    struct stat st;
    if (::stat((dir + "/" + path).c_str(), &st) != 0) {
      problems.push_back(path + " is missing (" + std::strerror(errno) + ")");
    } else if (static_cast<uint64_t>(st.st_size) != bytes) {
      problems.push_back(path + " has " + std::to_string(st.st_size) +
                         " bytes, the manifest records " + std::to_string(bytes) +
                         " (truncated or replaced)");
    }
  }
  if (problems.empty()) return;
  std::string message = "checkpoint '" + dir + "' does not match its " + kDcpManifestName + ":";
  for (const auto& p : problems) message += "\n  " + p;
  TORCH_CHECK(false, message);
}

// Every name the model gives a parameter after its first (a tied parameter's other names):
// a checkpoint may hold them, and they are skipped.
std::set<std::string> alias_names(const torch::nn::Module& model,
                                  const std::vector<LocalParam>& locals) {
  std::set<std::string> firsts, aliases;
  for (const auto& lp : locals) firsts.insert(lp.name);
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (firsts.count(item.key()) == 0) aliases.insert(item.key());
  }
  return aliases;
}

// The tensors `wanted` (key -> global shape) must be in `have`; every other tensor there must
// be an alias. Throws listing what is missing, unexpected and mis-shaped, with `hint` when
// something is mis-shaped.
void check_keys(const std::string& dir, const char* what,
                const std::map<std::string, std::vector<int64_t>>& wanted,
                const std::map<std::string, DcpTensor>& have, const std::set<std::string>& aliases,
                const std::string& hint) {
  std::vector<std::string> missing, unexpected, misshaped;
  for (const auto& [key, shape] : wanted) {
    auto it = have.find(key);
    if (it == have.end()) {
      missing.push_back(key + " " + detail::shape_string(shape));
    } else if (it->second.shape != shape) {
      misshaped.push_back(key + ": checkpoint " + detail::shape_string(it->second.shape) +
                          ", model " + detail::shape_string(shape));
    }
  }
  for (const auto& [key, t] : have) {
    if (wanted.count(key) == 0 && aliases.count(key) == 0)
      unexpected.push_back(key + " " + detail::shape_string(t.shape));
  }
  if (missing.empty() && unexpected.empty() && misshaped.empty()) return;
  std::string message = "checkpoint '" + dir + "' does not match the " + what;
  message += (misshaped.empty() ? "" : hint) + ":";  // first: agree() keeps a message's start
  detail::append_list(message, "missing from the checkpoint", missing);
  detail::append_list(message, "unexpected in the checkpoint", unexpected);
  detail::append_list(message, "mis-shaped", misshaped);
  TORCH_CHECK(false, message);
}

// The optimizer's keys and their shapes: per parameter it trains, its states and its step.
std::map<std::string, std::vector<int64_t>> optimizer_keys(const std::vector<LocalParam>& locals,
                                                           torch::optim::AdamW& adamw) {
  std::map<std::string, std::vector<int64_t>> keys;
  for (const auto& lp : locals) {
    const auto* options = detail::options_of(adamw, lp.param);
    if (options == nullptr) continue;
    for (const auto& kind : detail::state_kinds(*options))
      keys[detail::dcp_state_key(lp.name, kind)] = lp.global_shape;
    keys[detail::dcp_state_key(lp.name, "step")] = {};
  }
  return keys;
}

// Narrows t to the box [lo, hi) given relative to origin, in every dimension.
at::Tensor narrow_box(at::Tensor t, const std::vector<int64_t>& origin,
                      const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  for (size_t d = 0; d < lo.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), lo[d] - origin[d], hi[d] - lo[d]);
  }
  return t;
}

// Fills local (lp's parameter or a state of its shape) from tensor `key`'s chunks that overlap
// this rank's box, and zeroes the padding. Returns the bytes read.
int64_t fill_local(const std::string& key, const DcpTensor& t, const LocalParam& lp,
                   const at::Tensor& local, const std::vector<SafetensorsReader>& readers) {
  at::NoGradGuard no_grad;
  const Chunk c = detail::chunk_of(lp);
  const at::Tensor view = local.view(detail::local_shape(lp, c));
  const std::vector<int64_t> box_lo = detail::chunk_offsets(lp, c);
  const std::vector<int64_t> box_size = detail::chunk_shape(lp, c);
  int64_t bytes = 0;
  for (const DcpChunk& chunk : t.chunks) {
    std::vector<int64_t> lo(box_lo.size()), hi(box_lo.size());
    bool empty = false, whole = true;
    for (size_t d = 0; d < lo.size(); ++d) {
      lo[d] = std::max(box_lo[d], chunk.offsets[d]);
      hi[d] = std::min(box_lo[d] + box_size[d], chunk.offsets[d] + chunk.sizes[d]);
      empty = empty || lo[d] >= hi[d];
      whole = whole && lo[d] == chunk.offsets[d] && hi[d] == chunk.offsets[d] + chunk.sizes[d];
    }
    if (empty) continue;
    const SafetensorsReader& reader = readers[chunk.file];
    const TensorEntry& e = reader.entry(key);
    const at::Tensor dst = narrow_box(view, box_lo, lo, hi);
    const bool direct = whole && dst.is_contiguous() && dst.device().is_cpu() &&
                        dst.scalar_type() == to_scalar_type(e.dtype);
    const at::Tensor buffer = direct ? dst : at::empty(chunk.sizes, to_scalar_type(e.dtype));
    reader.read_into(e, buffer);  // verifies the chunk's checksum when it has one
    bytes += static_cast<int64_t>(e.nbytes());
    if (!direct) dst.copy_(narrow_box(buffer, chunk.offsets, lo, hi));
  }
  if (c.rows < c.padded) view.narrow(c.dim, c.rows, c.padded - c.rows).zero_();
  return bytes;
}

// An AdamW step: a 0-D tensor holding a non-negative integer (float32 in torch's checkpoints).
int64_t read_step(const std::string& key, const DcpTensor& t,
                  const std::vector<SafetensorsReader>& readers) {
  TORCH_INTERNAL_ASSERT(t.chunks.size() == 1);
  const SafetensorsReader& reader = readers[t.chunks[0].file];
  const double step = reader.read(key).to(at::kDouble).item<double>();
  TORCH_CHECK(step >= 0 && step <= 9.0e15 && std::floor(step) == step, "'", reader.path(),
              "' holds ", step, " as '", key, "', not an optimizer step (a non-negative integer)");
  return static_cast<int64_t>(step);
}

// The largest step of any parameter in the optimizer's part (0 when it has none).
int64_t largest_step(const Part& optim) {
  int64_t step = 0;
  const std::string suffix = ".step";
  for (const auto& [key, t] : optim.tensors) {
    if (key.size() > suffix.size() && key.rfind("state.", 0) == 0 && t.shape.empty() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
      step = std::max(step, read_step(key, t, optim.readers));
    }
  }
  return step;
}

// Loads one parameter's AdamW state (created when the optimizer has none yet). Returns the
// bytes read.
int64_t load_state(const Part& optim, const LocalParam& lp, torch::optim::AdamW& adamw,
                   std::vector<void*>& created) {
  const auto kinds = detail::state_kinds(*detail::options_of(adamw, lp.param));
  auto& s = detail::state_to_load(adamw, lp.param, kinds.size() == 3, created);
  const std::string step_key = detail::dcp_state_key(lp.name, "step");
  s.step(read_step(step_key, optim.tensors.at(step_key), optim.readers));
  int64_t bytes = 0;
  for (const auto& kind : kinds) {
    const at::Tensor t = detail::state_tensor(s, kind);
    TORCH_CHECK(t.defined() && t.is_contiguous() && t.numel() == lp.param.numel(),
                "optimizer state ", kind, " of '", lp.name, "' is missing or mis-shaped");
    const std::string key = detail::dcp_state_key(lp.name, kind);
    bytes += fill_local(key, optim.tensors.at(key), lp, t, optim.readers);
  }
  return bytes;
}

// A checkpoint opened and checked against the model and optimizer, before anything is loaded.
struct Opened {
  std::string dir;
  std::optional<DcpManifest> manifest;
  Part weights, optim;
  std::vector<LocalParam> locals;
  bool with_optimizer = false;
};

Opened open_checked(const std::string& path, torch::nn::Module& model, torch::optim::AdamW* adamw,
                    ProcessGroup* group) {
  Opened o;
  o.dir = detail::resolve_step_dir(path, is_dcp_hf_checkpoint, std::string(kDcpModelDir) + "/");
  o.manifest = read_manifest(o.dir);
  if (o.manifest) check_manifest_files(o.dir, *o.manifest);
  o.weights = open_part(o.dir + "/" + kDcpModelDir);
  o.optim = open_part(o.dir + "/" + kDcpOptimDir);
  o.locals = detail::local_params(model, group);
  const std::set<std::string> aliases = alias_names(model, o.locals);
  std::map<std::string, std::vector<int64_t>> wanted;
  for (const auto& lp : o.locals) wanted[lp.name] = lp.global_shape;
  // Without our manifest, a tensor's shape is where its chunks end (as DCP's reader sees it),
  // so a missing last rank file shows as tensors too small.
  const std::string hint = o.manifest ? ""
                                      : std::string(" (there is no ") + kDcpManifestName +
                                            " to list the files: a rank's file may be missing)";
  check_keys(o.dir + "/" + kDcpModelDir, "model", wanted, o.weights.tensors, aliases, hint);
  o.with_optimizer = adamw != nullptr && !o.optim.tensors.empty();
  if (!o.with_optimizer) return o;
  std::set<std::string> state_aliases;
  for (const auto& a : aliases) {
    for (const char* kind : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"})
      state_aliases.insert(detail::dcp_state_key(a, kind));
  }
  check_keys(o.dir + "/" + kDcpOptimDir, "optimizer", optimizer_keys(o.locals, *adamw),
             o.optim.tensors, state_aliases, hint);
  return o;
}

// Everything of load_dcp_hf but the agreement; `created` lists the optimizer states it made.
LoadResult load_here(const std::string& path, torch::nn::Module& model, torch::optim::AdamW* adamw,
                     ProcessGroup* group, std::vector<void*>& created) {
  const Opened o = open_checked(path, model, adamw, group);
  LoadResult result;
  result.path = o.dir;
  for (const auto& lp : o.locals) {
    result.bytes_read += fill_local(lp.name, o.weights.tensors.at(lp.name), lp, lp.param.detach(),
                                    o.weights.readers);
    if (o.with_optimizer && detail::options_of(*adamw, lp.param) != nullptr) {
      result.bytes_read += load_state(o.optim, lp, *adamw, created);
    }
  }
  if (const auto& m = o.manifest) {
    detail::restore_cpu_rng_state(o.dir, m->rng_states, group ? group->rank() : 0);
    result.step = m->step;
    result.user_json = m->user_json;
    if (const auto& g = m->grad_scaler) {
      result.grad_scaler = GradScalerState{g->scale, g->growth_tracker, g->growth_factor,
                                           g->backoff_factor, g->growth_interval};
    }
  } else {
    result.step = largest_step(o.optim);  // FSDP2's checkpoints: the optimizer knows the step
    result.user_json = "{}";
  }
  result.saved_world_size =
      o.manifest ? o.manifest->world_size : std::max(1, static_cast<int>(o.weights.readers.size()));
  result.checkpoint_bytes = o.weights.bytes + o.optim.bytes;
  return result;
}

}  // namespace

bool is_dcp_hf_checkpoint(const std::string& dir) {
  return detail::is_directory(dir + "/" + kDcpModelDir);
}

LoadResult load_dcp_hf(const std::string& path, torch::nn::Module& model,
                       torch::optim::Optimizer* optimizer, ProcessGroup* group) {
  const auto start = Clock::now();
  LoadResult result;
  std::exception_ptr error;
  torch::optim::AdamW* adamw = nullptr;
  std::vector<void*> created;  // optimizer states this load created, removed again on failure
  try {
    adamw = detail::as_adamw(optimizer);
    result = load_here(path, model, adamw, group, created);
  } catch (...) {
    error = std::current_exception();
    for (void* key : created) adamw->state().erase(key);
  }
  detail::agree(group, error, "loading checkpoint '" + path + "'");
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace fsdp::checkpoint
