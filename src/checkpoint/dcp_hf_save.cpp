// save_dcp_hf (include/fsdp/checkpoint/dcp_hf.h): a sharded checkpoint in the layout that
// torch.distributed.checkpoint's HuggingFaceStorageWriter writes, so that PyTorch FSDP2 reads it.
//
// In three collective phases, each ending in agree() so that no rank waits on one that failed,
// as save_sharded:
//   1. every rank plans its items (a parameter, an AdamW state tensor or an AdamW step), the
//      ranks agree on them and on who writes which chunk; rank 0 creates root/.tmp-step_<n>/
//      with model/ and optim/;
//   2. every rank writes its chunks to model/ and optim/ (a file only where it has chunks);
//   3. the file sizes and RNG states are gathered, rank 0 writes fsdp.json and publishes the
//      directory (step_dirs.h: rename into place, then `latest`).
// Chunks carry the XXH3-64 of their bytes in the file's metadata ("fsdp.xxh3_64:<name>"): DCP's
// reader ignores it, ours verifies every chunk it reads.
//
// [Note: DCP-HF and the optimizer] torch 2.11's HuggingFaceStorageWriter holds tensors only.
// DCP plans every non-tensor value of a state dict (an optimizer's param_groups: lr, betas,
// eps, ...) as a BYTE_IO item, and FileSystemWriter writes those bytes into the same stream
// ahead of the safetensors bytes, leaving a file that no safetensors reader opens (checked:
// FSDP2's get_optimizer_state_dict through it gave a 57 KB rank file with pickles before its
// header). PyTorch's own recipes save the full training state with the default FileSystemWriter
// (.distcp files and a pickled .metadata, which C++ cannot read safely) and use the HF layout
// for weights alone (torchtitan: last_save_in_hf requires last_save_model_only). We keep one
// layout for both: the optimizer's tensors (moments and steps, flattened state dict keys) go
// through the same HF writer into optim/, and its hyper-parameters come from the job's
// configuration on either side, as they do in our own checkpoints (metadata.json holds no
// learning rate either: the trainer sets it every step from its schedule).
#include <fsdp/checkpoint/dcp_hf.h>
#include <fsdp/checkpoint/format.h>
#include <fsdp/checkpoint/safetensors.h>

#include "checkpoint/adamw_state.h"
#include "checkpoint/checksum.h"
#include "checkpoint/common.h"
#include "checkpoint/dcp_hf_layout.h"
#include "checkpoint/file_util.h"
#include "checkpoint/step_dirs.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>

namespace fsdp::checkpoint {
namespace {

using detail::Chunk;
using detail::LocalParam;
using Clock = std::chrono::steady_clock;

// float32 holds every integer up to 2^24 exactly: torch.optim.AdamW's own step tensors are
// float32, so steps past that are stored as float64 (which torch reads back as well).
constexpr int64_t kExactFloat32Steps = int64_t{1} << 24;

// One tensor the checkpoint stores: a parameter, one of its AdamW states, or its AdamW step.
struct Item {
  std::string key;
  bool optim = false;
  size_t param = 0;   // index into the local parameters
  at::Tensor local;   // the padded local tensor; undefined for a step
  int64_t step = 0;   // the AdamW step of a step item
  bool mine = false;  // this rank writes it
};

std::vector<Item> plan_items(const std::vector<LocalParam>& locals, torch::optim::AdamW* adamw) {
  std::vector<Item> items;
  for (size_t i = 0; i < locals.size(); ++i) {
    const LocalParam& lp = locals[i];
    items.push_back({lp.name, false, i, lp.param.detach()});
    torch::optim::AdamWParamState* s = adamw ? detail::state_of(*adamw, lp.param) : nullptr;
    if (s == nullptr) continue;
    for (const char* kind : detail::kAdamWStates) {
      const at::Tensor t = detail::state_tensor(*s, kind);
      if (!t.defined()) continue;
      TORCH_CHECK(t.numel() == lp.param.numel() && t.is_contiguous(), "optimizer state ", kind,
                  " of '", lp.name, "' has shape ", t.sizes(), ", not its parameter's local shape");
      items.push_back({detail::dcp_state_key(lp.name, kind), true, i, t});
    }
    items.push_back({detail::dcp_state_key(lp.name, "step"), true, i, at::Tensor(), s->step()});
  }
  return items;
}

uint64_t items_signature(const std::vector<Item>& items, const std::vector<LocalParam>& locals) {
  detail::Hasher h;
  for (const auto& item : items) {
    h.update(item.key.data(), item.key.size() + 1);
    const auto& shape = locals[item.param].global_shape;
    h.update(shape.data(), shape.size() * sizeof(int64_t));
    const int dtype = item.local.defined() ? static_cast<int>(item.local.scalar_type()) : -1;
    h.update(&dtype, sizeof(dtype));
  }
  return h.digest();
}

// Collective: who writes each parameter's chunks (the first rank holding each distinct range,
// see [Note: a parameter's chunk]); marks this rank's items. A step goes with its parameter's
// first chunk.
void assign_writers(ProcessGroup* group, const std::vector<LocalParam>& locals,
                    std::vector<Item>& items, int rank) {
  std::vector<LocalParam> ranges = locals;  // each parameter's range along its chunk dim
  for (auto& r : ranges) {
    const Chunk c = detail::chunk_of(r);
    r.offset = c.offset;
    r.rows = c.rows;
    r.padded_rows = c.padded;
    r.dim0 = c.size;
  }
  const int world = group ? group->size() : 1;
  const auto writers =
      detail::choose_writers(detail::gather_row_layouts(group, ranges), ranges, world);
  for (auto& item : items) {
    const auto& w = writers[item.param];
    if (!item.local.defined()) {
      item.mine = (w.empty() ? 0 : w.front().rank) == rank;
      continue;
    }
    for (const auto& range : w) item.mine = item.mine || range.rank == rank;
  }
}

// The bytes an item stores: this rank's chunk (padding left out), or the step as a 0-D tensor.
at::Tensor chunk_data(const Item& item, const LocalParam& lp) {
  if (!item.local.defined()) {
    return item.step <= kExactFloat32Steps
               ? at::scalar_tensor(static_cast<double>(item.step), at::kFloat)
               : at::scalar_tensor(static_cast<double>(item.step), at::kDouble);
  }
  const Chunk c = detail::chunk_of(lp);
  const at::Tensor local = item.local.view(detail::local_shape(lp, c));
  if (lp.global_shape.empty()) return local.cpu();
  return local.narrow(c.dim, 0, c.rows).cpu().contiguous();
}

// Writes this rank's items of one kind (model or optimizer) to path; returns the file's size,
// or 0 when this rank has none (no file then, as DCP).
uint64_t write_chunks(const std::string& path, const std::vector<Item>& items, bool optim,
                      const std::vector<LocalParam>& locals) {
  std::vector<TensorEntry> entries;
  std::map<std::string, std::vector<int64_t>> offsets;
  std::vector<const Item*> mine;
  for (const auto& item : items) {
    if (!item.mine || item.optim != optim) continue;
    const LocalParam& lp = locals[item.param];
    const Chunk c = detail::chunk_of(lp);
    TensorEntry e;
    e.name = item.key;
    e.dtype = item.local.defined() ? to_dtype(item.local.scalar_type())
                                   : (item.step <= kExactFloat32Steps ? Dtype::kF32 : Dtype::kF64);
    e.shape = item.local.defined() ? detail::chunk_shape(lp, c) : std::vector<int64_t>{};
    offsets[item.key] =
        item.local.defined() ? detail::chunk_offsets(lp, c) : std::vector<int64_t>{};
    entries.push_back(std::move(e));
    mine.push_back(&item);
  }
  if (entries.empty()) return 0;
  SafetensorsWriter writer(path, std::move(entries), dcp_file_metadata(offsets));
  for (const Item* item : mine) writer.write(chunk_data(*item, locals[item->param]));
  writer.finish();
  return writer.file_bytes();
}

struct Gathered {
  std::vector<int64_t> bytes;    // per rank: model file, optim file (0: none)
  std::vector<std::string> rng;  // per rank
};

// Collective: every rank's file sizes and RNG state.
Gathered gather_files(ProcessGroup* group, int64_t model_bytes, int64_t optim_bytes) {
  const int world = group ? group->size() : 1;
  const at::Tensor rng = detail::cpu_rng_state();
  int64_t mine[3] = {model_bytes, optim_bytes, rng.numel()};
  at::Tensor all = at::from_blob(mine, {3}, at::kLong).clone();
  at::Tensor states = rng;
  if (group != nullptr && world > 1) {
    all = at::empty({3 * world}, at::kLong);
    group->all_gather_into_tensor(all, at::from_blob(mine, {3}, at::kLong))->wait();
    states = at::empty({world * rng.numel()}, at::kByte);
    group->all_gather_into_tensor(states, rng)->wait();
  }
  Gathered g;
  const auto* v = all.const_data_ptr<int64_t>();
  const auto* s = reinterpret_cast<const char*>(states.const_data_ptr<uint8_t>());
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK(v[3 * r + 2] == mine[2], "rank ", r, " has an RNG state of ", v[3 * r + 2],
                " bytes, this rank of ", mine[2]);
    g.bytes.insert(g.bytes.end(), {v[3 * r], v[3 * r + 1]});
    g.rng.emplace_back(s + r * mine[2], mine[2]);
  }
  return g;
}

DcpManifest build_manifest(const SaveOptions& options, int world, const Gathered& g) {
  DcpManifest m;
  m.world_size = world;
  m.step = options.step();
  m.user_json = options.user_json();
  m.rng_states = g.rng;
  if (const auto& s = options.grad_scaler()) {
    m.grad_scaler = GradScalerRecord{s->scale, s->growth_tracker, s->growth_factor,
                                     s->backoff_factor, s->growth_interval};
  }
  const char* dirs[2] = {kDcpModelDir, kDcpOptimDir};  // g.bytes' two columns
  for (size_t column = 0; column < 2; ++column) {
    for (int r = 0; r < world; ++r) {
      const int64_t bytes = g.bytes[2 * r + column];
      if (bytes > 0) {
        m.files.push_back({std::string(dirs[column]) + "/" + dcp_shard_file_name(r),
                           static_cast<uint64_t>(bytes)});
      }
    }
  }
  return m;
}

// Rank 0: writes fsdp.json into tmp_dir and publishes the checkpoint.
void publish(const DcpManifest& manifest, const std::string& root, const std::string& tmp_dir,
             const std::string& dir_name, int keep_last) {
  const std::string text = serialize_dcp_manifest(manifest);
  try {
    parse_dcp_manifest(text);  // never publish a manifest we could not read back
  } catch (const FormatError& e) {
    TORCH_INTERNAL_ASSERT(false, "the manifest just built is invalid: ", e.what());
  }
  for (const char* dir : {kDcpModelDir, kDcpOptimDir}) {
    detail::fsync_directory(tmp_dir + "/" + dir);
  }
  detail::write_file_atomically(tmp_dir + "/" + kDcpManifestName, text);
  detail::publish_step_dir(root, tmp_dir, dir_name, keep_last);
}

// Phase 1 on this rank: checks the options and lists the items to store; rank 0 also creates
// tmp_dir (and its model/ and optim/).
void plan(const torch::nn::Module& model, torch::optim::Optimizer* optimizer, ProcessGroup* group,
          const SaveOptions& options, const std::string& root, const std::string& tmp_dir,
          std::vector<LocalParam>& locals, std::vector<Item>& items) {
  detail::check_save_options(options);
  locals = detail::local_params(model, group);
  items = plan_items(locals, detail::as_adamw(optimizer));
  if (group == nullptr || group->rank() == 0) {
    detail::prepare_tmp_dir(root, tmp_dir);
    for (const char* dir : {kDcpModelDir, kDcpOptimDir}) {
      detail::make_directories(tmp_dir + "/" + dir);
    }
  }
}

}  // namespace

SaveResult save_dcp_hf(const std::string& root, const torch::nn::Module& model,
                       torch::optim::Optimizer* optimizer, ProcessGroup* group,
                       const SaveOptions& options) {
  const auto start = Clock::now();
  const int world = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  const std::string dir_name = detail::step_dir_name(options.step());
  const std::string tmp_dir = root + "/.tmp-" + dir_name;
  const std::string what = "saving checkpoint '" + root + "/" + dir_name + "'";

  // Phase 1: plan; rank 0 prepares the temporary directory.
  std::vector<LocalParam> locals;
  std::vector<Item> items;
  detail::agreed_phase(
      group, what, [&] { plan(model, optimizer, group, options, root, tmp_dir, locals, items); });
  detail::check_same_on_every_rank(group, static_cast<int64_t>(items.size()),
                                   items_signature(items, locals), what);
  detail::agreed_phase(group, what, [&] { assign_writers(group, locals, items, rank); });

  // Phase 2: every rank writes its chunks.
  int64_t bytes[2] = {0, 0};
  detail::agreed_phase(group, what, [&] {
    const std::string file = dcp_shard_file_name(rank);
    bytes[0] = static_cast<int64_t>(
        write_chunks(tmp_dir + "/" + kDcpModelDir + "/" + file, items, false, locals));
    bytes[1] = static_cast<int64_t>(
        write_chunks(tmp_dir + "/" + kDcpOptimDir + "/" + file, items, true, locals));
  });

  // Phase 3: rank 0 writes the manifest and publishes the checkpoint.
  const Gathered gathered = gather_files(group, bytes[0], bytes[1]);
  int64_t total = 0;
  for (int64_t b : gathered.bytes) total += b;
  detail::agreed_phase(group, what, [&] {
    if (rank == 0) {
      publish(build_manifest(options, world, gathered), root, tmp_dir, dir_name,
              options.keep_last());
    }
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return {root + "/" + dir_name, total, seconds};
}

}  // namespace fsdp::checkpoint
