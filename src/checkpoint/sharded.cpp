// Sharded checkpoints: save_sharded, load_sharded (see include/fsdp/checkpoint/checkpoint.h).
//
// Save, in three collective phases, each ending in agree() so that no rank is left waiting on
// a rank that failed:
//   1. every rank plans its slots (one per stored tensor: a parameter or one of its AdamW
//      states); rank 0 creates root/.tmp-step_<n>/, removing stale temporaries of crashed saves;
//   2. every rank writes its rows of every slot to its own file there and fsyncs it (a
//      Shard(d > 0) or tensor-parallel tensor that is no row range is gathered whole first, and
//      stored by one rank); an all-gather then
//      tells rank 0 each rank's rows, per-slot checksums and file size;
//   3. rank 0 writes metadata.json, fsyncs, renames the directory into place, then replaces
//      `latest` by rename. Until that rename, `latest` names the previous checkpoint, which is
//      untouched: a crash anywhere leaves a loadable checkpoint.
// A shard stores only real rows: padding is never written, and is zeroed on load.
//
// Load validates the whole checkpoint before touching the model (index, every file's presence,
// size and header, the model's names and shapes), then fills each local tensor's rows from the
// old shards that overlap them: a shard read whole goes straight into the destination; one
// that is only partly needed is read whole into a buffer (so its checksum can be verified) and
// the needed rows copied.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/format.h>
#include <fsdp/checkpoint/safetensors.h>

#include "checkpoint/adamw_state.h"
#include "checkpoint/checksum.h"
#include "checkpoint/common.h"
#include "checkpoint/file_util.h"
#include "checkpoint/step_dirs.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/optim/adamw.h>
#include <csignal>

#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>

namespace fsdp::checkpoint {
namespace {

using detail::LocalParam;
using Clock = std::chrono::steady_clock;

constexpr const char* kIndexName = kIndexFileName;
constexpr char kModelPrefix[] = "model/";
constexpr uint64_t kMaxIndexBytes = 256ull << 20;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t as_i64(uint64_t v) {
  int64_t out;
  std::memcpy(&out, &v, sizeof(v));
  return out;
}
uint64_t as_u64(int64_t v) {
  uint64_t out;
  std::memcpy(&out, &v, sizeof(v));
  return out;
}

// The shape a shard of `rows` rows is stored with: the global shape with dim 0 = rows (a 0-D
// tensor's one row is stored as [rows]).
std::vector<int64_t> stored_shape(const std::vector<int64_t>& global_shape, int64_t rows) {
  std::vector<int64_t> shape = global_shape;
  if (shape.empty()) return {rows};
  shape[0] = rows;
  return shape;
}

// One tensor this rank stores: a parameter or one of its optimizer states.
struct Slot {
  std::string key;
  size_t param = 0;  // index into the local parameters
  const LocalParam* lp = nullptr;
  at::Tensor local;           // padded local shape (the parameter's or the state's)
  int64_t rows_to_write = 0;  // this rank's rows, or 0 when another rank stores them
};

std::vector<Slot> plan_slots(const std::vector<LocalParam>& locals, torch::optim::AdamW* adamw) {
  std::vector<Slot> slots;
  for (size_t i = 0; i < locals.size(); ++i) {
    const LocalParam& lp = locals[i];
    slots.push_back({kModelPrefix + lp.name, i, &lp, lp.param.detach(), 0});
    if (adamw == nullptr) continue;
    torch::optim::AdamWParamState* s = detail::state_of(*adamw, lp.param);
    if (s == nullptr) continue;
    for (const char* kind : detail::kAdamWStates) {
      at::Tensor t = detail::state_tensor(*s, kind);
      if (!t.defined()) continue;
      TORCH_CHECK(t.numel() == lp.param.numel() && t.is_contiguous(), "optimizer state ", kind,
                  " of '", lp.name, "' has shape ", t.sizes(), ", not its parameter's local shape");
      slots.push_back({std::string("optim/") + kind + "/" + lp.name, i, &lp, t, 0});
    }
  }
  return slots;
}

// A hash of what the slots are, which every rank must agree on.
uint64_t slots_signature(const std::vector<Slot>& slots) {
  detail::Hasher h;
  for (const auto& s : slots) {
    h.update(s.key.data(), s.key.size() + 1);
    h.update(s.lp->global_shape.data(), s.lp->global_shape.size() * sizeof(int64_t));
    const int dtype = static_cast<int>(s.local.scalar_type());
    h.update(&dtype, sizeof(dtype));
  }
  return h.digest();
}

// Crash injection for the tests of a save killed midway: FSDP_CHECKPOINT_KILL_AT names the save
// (step), the rank and where it dies with SIGKILL:
//   <step>:<rank>:<bytes>           after <bytes> bytes of its rank file;
//   <step>:<rank>:metadata:<bytes>  after <bytes> bytes of metadata.json (rank 0 writes it);
//   <step>:<rank>:rename            after the directory was renamed into place, before `latest`;
//   <step>:<rank>:latest            after the new `latest` was written, before its rename.
struct KillPoint {
  std::string phase = "data";  // data, metadata, rename or latest
  uint64_t bytes = 0;
};

std::optional<KillPoint> kill_point(int64_t step, int rank) {
  const char* value = std::getenv("FSDP_CHECKPOINT_KILL_AT");
  if (value == nullptr) return std::nullopt;
  long long s = 0, r = 0, bytes = 0;
  char phase[16] = {0};
  KillPoint point;
  if (std::sscanf(value, "%lld:%lld:%15[a-z]:%lld", &s, &r, phase, &bytes) == 4 &&
      std::strcmp(phase, "metadata") == 0 && bytes >= 0) {
    point.phase = phase;
  } else if (std::sscanf(value, "%lld:%lld:%15[a-z]", &s, &r, phase) == 3 &&
             (std::strcmp(phase, "rename") == 0 || std::strcmp(phase, "latest") == 0)) {
    point.phase = phase;
  } else {
    TORCH_CHECK(std::sscanf(value, "%lld:%lld:%lld", &s, &r, &bytes) == 3 && bytes >= 0,
                "FSDP_CHECKPOINT_KILL_AT must be <step>:<rank>:<bytes>, "
                "<step>:<rank>:metadata:<bytes>, <step>:<rank>:rename or <step>:<rank>:latest, "
                "got '",
                value, "'");
  }
  point.bytes = static_cast<uint64_t>(bytes);
  if (s == step && r == rank) return point;
  return std::nullopt;
}

std::optional<uint64_t> kill_hook(int64_t step, int rank) {
  const auto point = kill_point(step, rank);
  if (point && point->phase == "data") return point->bytes;
  return std::nullopt;
}

void kill_if(const std::optional<KillPoint>& point, const char* phase) {
  if (point && point->phase == phase) ::raise(SIGKILL);
}

CheckpointIndex read_index(const std::string& dir) {
  const std::string path = dir + "/" + kIndexName;
  const std::string text = detail::read_file(path, kMaxIndexBytes);
  try {
    return parse_checkpoint_index(text);
  } catch (const FormatError& e) {
    TORCH_CHECK(false, "'", path, "' is not a valid checkpoint index: ", e.what());
  }
}

// Throws listing every parameter the checkpoint lacks, every model tensor it has that the model
// lacks, and every shape that differs.
void check_model_matches(const std::string& dir, const CheckpointIndex& index,
                         const std::vector<LocalParam>& locals) {
  std::vector<std::string> missing, unexpected, misshaped;
  std::unordered_map<std::string, const LocalParam*> by_name;
  for (const auto& lp : locals) {
    by_name[lp.name] = &lp;
    auto it = index.tensors.find(kModelPrefix + lp.name);
    if (it == index.tensors.end()) {
      missing.push_back(lp.name + " " + detail::shape_string(lp.global_shape));
    } else if (it->second.shape != lp.global_shape) {
      misshaped.push_back(lp.name + ": checkpoint " + detail::shape_string(it->second.shape) +
                          ", model " + detail::shape_string(lp.global_shape));
    }
  }
  for (const auto& [key, record] : index.tensors) {
    if (key.rfind(kModelPrefix, 0) != 0) continue;
    const std::string name = key.substr(std::strlen(kModelPrefix));
    if (by_name.count(name) == 0)
      unexpected.push_back(name + " " + detail::shape_string(record.shape));
  }
  if (missing.empty() && unexpected.empty() && misshaped.empty()) return;
  std::string message = "checkpoint '" + dir + "' does not match the model:";
  detail::append_list(message, "missing from the checkpoint", missing);
  detail::append_list(message, "unexpected in the checkpoint", unexpected);
  detail::append_list(message, "mis-shaped", misshaped);
  TORCH_CHECK(false, message);
}

// Opens every rank file of the checkpoint and checks it against the index: present, of the
// recorded size, a valid safetensors file holding each shard the index places there with the
// right dtype and shape.
std::vector<SafetensorsReader> open_rank_files(const std::string& dir,
                                               const CheckpointIndex& index) {
  std::vector<std::string> problems;
  for (int r = 0; r < index.world_size; ++r) {
    const FileRecord& f = index.files[r];
    const std::string path = dir + "/" + f.name;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      problems.push_back("rank " + std::to_string(r) + "'s file " + f.name + " is missing (" +
                         std::strerror(errno) + ")");
    } else if (static_cast<uint64_t>(st.st_size) != f.bytes) {
      problems.push_back("rank " + std::to_string(r) + "'s file " + f.name + " has " +
                         std::to_string(st.st_size) + " bytes, the index records " +
                         std::to_string(f.bytes) + " (truncated or replaced)");
    }
  }
  if (!problems.empty()) {
    std::string message = "checkpoint '" + dir + "' is incomplete:";
    for (const auto& p : problems) message += "\n  " + p;
    TORCH_CHECK(false, message);
  }
  std::vector<SafetensorsReader> readers;
  readers.reserve(index.world_size);
  for (int r = 0; r < index.world_size; ++r) readers.emplace_back(dir + "/" + index.files[r].name);
  for (const auto& [key, record] : index.tensors) {
    for (const auto& shard : record.shards) {
      const SafetensorsReader& reader = readers[shard.rank];
      const TensorEntry* e = reader.header().find(key);
      TORCH_CHECK(e != nullptr, "'", reader.path(), "' lacks '", key,
                  "', which the index places there");
      const auto want = stored_shape(record.shape, shard.rows);
      TORCH_CHECK(e->dtype == record.dtype && e->shape == want, "'", reader.path(), "' stores '",
                  key, "' as ", dtype_name(e->dtype), " ", detail::shape_string(e->shape),
                  " but the index says ", dtype_name(record.dtype), " ",
                  detail::shape_string(want));
    }
  }
  return readers;
}

// Fills rows [lp.offset, lp.offset + lp.rows) of tensor `key` into the first lp.rows rows of
// dst2d ([padded_rows, row_numel]) and zeroes the padding rows. Returns the bytes read.
int64_t fill_rows(const std::string& key, const TensorRecord& record, const LocalParam& lp,
                  const at::Tensor& dst2d, const std::vector<SafetensorsReader>& readers) {
  at::NoGradGuard no_grad;
  int64_t bytes = 0;
  const int64_t begin = lp.offset, end = lp.offset + lp.rows;
  const at::ScalarType file_type = to_scalar_type(record.dtype);
  for (const auto& shard : record.shards) {
    const int64_t lo = std::max(begin, shard.offset);
    const int64_t hi = std::min(end, shard.offset + shard.rows);
    if (lo >= hi) continue;
    const SafetensorsReader& reader = readers[shard.rank];
    const TensorEntry& e = reader.entry(key);
    const at::Tensor dst = dst2d.narrow(0, lo - begin, hi - lo);
    const bool whole = lo == shard.offset && hi == shard.offset + shard.rows;
    const bool direct = whole && dst.device().is_cpu() && dst.scalar_type() == file_type;
    at::Tensor buffer = direct ? dst : at::empty({shard.rows, lp.row_numel}, file_type);
    const uint64_t sum = reader.read_into(e, buffer);
    bytes += static_cast<int64_t>(e.nbytes());
    TORCH_CHECK(sum == shard.checksum, "checkpoint file '", reader.path(), "' is corrupted: '", key,
                "' rows [", shard.offset, ", ", shard.offset + shard.rows, ") have checksum ",
                checksum_hex(sum), " but the index records ", checksum_hex(shard.checksum));
    if (!direct) dst.copy_(buffer.narrow(0, lo - shard.offset, hi - lo));
  }
  if (lp.rows < lp.padded_rows) dst2d.narrow(0, lp.rows, lp.padded_rows - lp.rows).zero_();
  return bytes;
}

// The header of a rank's record in the save's all-gather: file bytes, file checksum, RNG state
// bytes; then, per slot, its checksum.
constexpr size_t kHead = 3;

// Collective (world > 1): every rank must store the same tensors; the all-gathers of the save
// rely on it.
void check_same_slots(ProcessGroup* group, const std::vector<Slot>& slots,
                      const std::string& what) {
  detail::check_same_on_every_rank(group, static_cast<int64_t>(slots.size()),
                                   slots_signature(slots), what);
}

// Collective: who stores which rows, one copy of each distinct row range (HSDP replicas, and
// ranks holding whole tensors after the first, write nothing for them). Sets each slot's
// rows_to_write.
std::vector<std::vector<detail::RowRange>> assign_writers(ProcessGroup* group,
                                                          const std::vector<LocalParam>& locals,
                                                          std::vector<Slot>& slots, int world,
                                                          int rank) {
  auto writers = detail::choose_writers(detail::gather_row_layouts(group, locals), locals, world);
  for (auto& s : slots) {
    for (const auto& w : writers[s.param]) {
      if (w.rank == rank) s.rows_to_write = w.rows;
    }
  }
  return writers;
}

// Writes this rank's rows of every slot to its file in tmp_dir and fills `mine`: the header
// (see kHead) and each written slot's checksum. Returns this rank's failure, or null.
//
// A Shard(d > 0) or tensor-parallel (not a row range) slot is gathered whole here
// (detail::whole_value), one at a time so no rank holds more than one such tensor whole, and
// written by the one rank that stores it. Every rank takes part in every gather, in slot order,
// even after a failure of its own, so none is left waiting in one.
std::exception_ptr write_rank_file(ProcessGroup* group, const std::string& tmp_dir,
                                   const std::vector<Slot>& slots, int64_t step, int rank,
                                   int world, const at::Tensor& rng, std::vector<int64_t>& mine) {
  std::exception_ptr error;
  std::unique_ptr<SafetensorsWriter> writer;
  try {
    std::vector<TensorEntry> entries;
    for (const auto& s : slots) {
      if (s.rows_to_write == 0) continue;
      TensorEntry e;
      e.name = s.key;
      e.dtype = to_dtype(s.local.scalar_type());
      e.shape = stored_shape(s.lp->global_shape, s.rows_to_write);
      entries.push_back(std::move(e));
    }
    SafetensorsWriterOptions writer_options;
    writer_options.embed_checksums = false;  // metadata.json holds them
    writer_options.kill_after_bytes = kill_hook(step, rank);
    writer = std::make_unique<SafetensorsWriter>(
        tmp_dir + "/" + rank_file_name(rank, world), std::move(entries),
        std::map<std::string, std::string>{{"format", "pt"},
                                           {"fsdp.rank", std::to_string(rank)},
                                           {"fsdp.world_size", std::to_string(world)},
                                           {"fsdp.step", std::to_string(step)}},
        writer_options);
  } catch (...) {
    error = std::current_exception();
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    try {
      const at::Tensor local =
          s.lp->needs_whole() ? detail::whole_value(group, *s.lp, s.local) : s.local;
      if (error || s.rows_to_write == 0) continue;
      at::Tensor rows = s.lp->rows_view(local).narrow(0, 0, s.rows_to_write);
      if (!rows.device().is_cpu()) rows = rows.cpu();
      mine[kHead + i] = as_i64(writer->write(rows));
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) return error;
  try {
    writer->finish();
    mine[0] = static_cast<int64_t>(writer->file_bytes());
    mine[1] = as_i64(writer->file_checksum());
    mine[2] = rng.numel();
  } catch (...) {
    error = std::current_exception();
  }
  return error;
}

// Every rank's record (`mine`) and RNG state, gathered: with one rank, its own.
struct Gathered {
  at::Tensor records;  // [world * stride] int64
  at::Tensor rng;      // [world * rng bytes] uint8
};

// Collective (world > 1): two all-gathers, records then RNG states.
Gathered gather_records(ProcessGroup* group, int world, std::vector<int64_t>& mine,
                        const at::Tensor& rng) {
  Gathered g;
  g.records = at::from_blob(mine.data(), {static_cast<int64_t>(mine.size())}, at::kLong).clone();
  g.rng = rng;
  if (group != nullptr && world > 1) {
    at::Tensor gathered = at::empty({world * g.records.numel()}, at::kLong);
    group->all_gather_into_tensor(gathered, g.records)->wait();
    g.records = gathered;
    g.rng = at::empty({world * rng.numel()}, at::kByte);
    group->all_gather_into_tensor(g.rng, rng)->wait();
  }
  return g;
}

// The index of the checkpoint, from every rank's record.
CheckpointIndex build_index(const SaveOptions& options, int world, const std::vector<int64_t>& mine,
                            const Gathered& all, const std::vector<Slot>& slots,
                            const std::vector<std::vector<detail::RowRange>>& writers,
                            const std::vector<LocalParam>& locals, torch::optim::AdamW* adamw) {
  const auto* v = all.records.const_data_ptr<int64_t>();
  const size_t stride = mine.size();
  const int64_t rng_bytes = mine[2];
  CheckpointIndex index;
  index.world_size = world;
  index.step = options.step();
  index.user_json = options.user_json();
  if (const auto& g = options.grad_scaler()) {
    index.grad_scaler = GradScalerRecord{g->scale, g->growth_tracker, g->growth_factor,
                                         g->backoff_factor, g->growth_interval};
  }
  for (int r = 0; r < world; ++r) {
    const int64_t* row = v + r * stride;
    TORCH_CHECK(row[2] == mine[2], "rank ", r, " has an RNG state of ", row[2],
                " bytes, rank 0 of ", mine[2]);
    index.files.push_back({rank_file_name(r, world), as_u64(row[0]), as_u64(row[1])});
    const auto* state = all.rng.const_data_ptr<uint8_t>() + r * rng_bytes;
    index.rng_states.emplace_back(reinterpret_cast<const char*>(state), rng_bytes);
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    TensorRecord record;
    record.dtype = to_dtype(s.local.scalar_type());
    record.shape = s.lp->global_shape;
    for (const auto& w : writers[s.param]) {
      record.shards.push_back({w.rank, w.offset, w.rows, as_u64(v[w.rank * stride + kHead + i])});
    }
    index.tensors.emplace(s.key, std::move(record));
  }
  if (adamw != nullptr) {
    for (const auto& lp : locals) {
      if (auto* s = detail::state_of(*adamw, lp.param)) {
        index.optimizer = "AdamW";
        index.optimizer_steps[lp.name] = s->step();
      }
    }
  }
  return index;
}

// Rank 0 only: writes the index into tmp_dir, renames tmp_dir into place, points `latest` at
// it, and prunes old checkpoints.
void publish(const CheckpointIndex& index, const std::string& root, const std::string& tmp_dir,
             const std::string& dir_name, int keep_last) {
  const std::string text = serialize_checkpoint_index(index);
  try {
    parse_checkpoint_index(text);  // never publish an index we could not read back
  } catch (const FormatError& e) {
    TORCH_INTERNAL_ASSERT(false, "the index just built is invalid: ", e.what());
  }
  const auto kill = kill_point(index.step, 0);
  {
    detail::File file = detail::File::create(tmp_dir + "/" + kIndexName);
    if (kill && kill->phase == "metadata") {
      file.pwrite_all(text.data(), std::min<size_t>(kill->bytes, text.size()), 0);
      ::raise(SIGKILL);
    }
    file.pwrite_all(text.data(), text.size(), 0);
    file.sync();
    file.close();
  }
  detail::PublishHooks hooks;
  hooks.after_rename = [&] { kill_if(kill, "rename"); };
  hooks.before_latest_rename = [&] { kill_if(kill, "latest"); };
  detail::publish_step_dir(root, tmp_dir, dir_name, keep_last, hooks);
}

// The optimizer states to load, per local parameter (empty for one the optimizer does not
// train). Throws listing every state the checkpoint lacks.
std::vector<std::vector<std::string>> optimizer_kinds(const std::string& dir,
                                                      const CheckpointIndex& index,
                                                      const std::vector<LocalParam>& locals,
                                                      torch::optim::AdamW& adamw) {
  std::vector<std::vector<std::string>> kinds(locals.size());
  std::vector<std::string> missing;
  for (size_t i = 0; i < locals.size(); ++i) {
    const LocalParam& lp = locals[i];
    const auto* group_options = detail::options_of(adamw, lp.param);
    if (group_options == nullptr) continue;  // not trained by this optimizer
    kinds[i] = detail::state_kinds(*group_options);
    for (const auto& kind : kinds[i]) {
      const std::string key = "optim/" + kind + "/" + lp.name;
      auto it = index.tensors.find(key);
      if (it == index.tensors.end() || it->second.shape != lp.global_shape) missing.push_back(key);
    }
    if (index.optimizer_steps.count(lp.name) == 0)
      missing.push_back("optimizer step of " + lp.name);
  }
  if (!missing.empty()) {
    std::string message = "checkpoint '" + dir + "' lacks optimizer state the optimizer needs:";
    detail::append_list(message, "missing", missing);
    TORCH_CHECK(false, message);
  }
  return kinds;
}

// fill_rows into a local tensor of lp's shape (the parameter or a state): when needs_whole()
// through the whole tensor, of which this rank keeps its part.
int64_t fill_local(const std::string& key, const TensorRecord& record, const LocalParam& lp,
                   const at::Tensor& local, const std::vector<SafetensorsReader>& readers) {
  if (!lp.needs_whole()) return fill_rows(key, record, lp, lp.rows_view(local), readers);
  const at::Tensor whole = at::empty({lp.dim0, lp.row_numel}, local.options());
  const int64_t bytes = fill_rows(key, record, lp, whole, readers);
  detail::place_whole_value(lp, whole, local);
  return bytes;
}

// Loads the optimizer states `kinds` of one parameter and its step. Returns the bytes read.
int64_t load_optimizer_state(const CheckpointIndex& index, const LocalParam& lp,
                             const std::vector<std::string>& kinds, torch::optim::AdamW& adamw,
                             const std::vector<SafetensorsReader>& readers,
                             std::vector<void*>& created) {
  auto& s = detail::state_to_load(adamw, lp.param, kinds.size() == 3, created);
  s.step(index.optimizer_steps.at(lp.name));
  int64_t bytes = 0;
  for (const auto& kind : kinds) {
    at::Tensor t = detail::state_tensor(s, kind);
    TORCH_CHECK(t.defined() && t.is_contiguous() && t.numel() == lp.param.numel(),
                "optimizer state ", kind, " of '", lp.name, "' is missing or mis-shaped");
    const std::string key = "optim/" + kind + "/" + lp.name;
    bytes += fill_local(key, index.tensors.at(key), lp, t, readers);
  }
  return bytes;
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  return detail::resolve_step_dir(
      path, [](const std::string& dir) { return detail::path_exists(dir + "/" + kIndexName); },
      kIndexName);
}

SaveResult save_sharded(const std::string& root, const torch::nn::Module& model,
                        torch::optim::Optimizer* optimizer, ProcessGroup* group,
                        const SaveOptions& options) {
  const auto start = Clock::now();
  const int world = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  const std::string dir_name = detail::step_dir_name(options.step());
  const std::string final_dir = root + "/" + dir_name;
  const std::string tmp_dir = root + "/.tmp-" + dir_name;
  const std::string what = "saving checkpoint '" + final_dir + "'";

  // Phase 1: plan; rank 0 prepares the temporary directory.
  std::vector<LocalParam> locals;
  std::vector<Slot> slots;
  torch::optim::AdamW* adamw = nullptr;
  detail::agreed_phase(group, what, [&] {
    detail::check_save_options(options);
    adamw = detail::as_adamw(optimizer);
    locals = detail::local_params(model, group);
    slots = plan_slots(locals, adamw);
    if (rank == 0) detail::prepare_tmp_dir(root, tmp_dir);
  });
  check_same_slots(group, slots, what);
  std::vector<std::vector<detail::RowRange>> writers;
  detail::agreed_phase(group, what,
                       [&] { writers = assign_writers(group, locals, slots, world, rank); });

  // Phase 2: every rank writes its file.
  std::vector<int64_t> mine(kHead + slots.size(), 0);
  const at::Tensor rng = detail::cpu_rng_state();
  detail::agree(
      group, write_rank_file(group, tmp_dir, slots, options.step(), rank, world, rng, mine), what);
  const Gathered all = gather_records(group, world, mine, rng);
  const auto* v = all.records.const_data_ptr<int64_t>();
  int64_t total_bytes = 0;
  for (int r = 0; r < world; ++r) total_bytes += v[r * mine.size()];

  // Phase 3: rank 0 writes the index and publishes the checkpoint.
  detail::agreed_phase(group, what, [&] {
    if (rank != 0) return;
    const CheckpointIndex index =
        build_index(options, world, mine, all, slots, writers, locals, adamw);
    publish(index, root, tmp_dir, dir_name, options.keep_last());
  });
  return {final_dir, total_bytes, seconds_since(start)};
}

LoadResult load_sharded(const std::string& path, torch::nn::Module& model,
                        torch::optim::Optimizer* optimizer, ProcessGroup* group) {
  const auto start = Clock::now();
  const int rank = group ? group->rank() : 0;
  LoadResult result;
  std::exception_ptr error;
  torch::optim::AdamW* adamw = nullptr;
  std::vector<void*> created;  // optimizer states this load created, removed again on failure
  try {
    result.path = resolve_checkpoint(path);
    const std::string& dir = result.path;
    const CheckpointIndex index = read_index(dir);
    const std::vector<LocalParam> locals = detail::local_params(model, group);
    adamw = detail::as_adamw(optimizer);
    const bool with_optimizer = adamw != nullptr && !index.optimizer.empty();
    TORCH_CHECK(!with_optimizer || index.optimizer == "AdamW", "checkpoint '", dir,
                "' holds the state of a ", index.optimizer, " optimizer, not AdamW");
    check_model_matches(dir, index, locals);
    const std::vector<std::vector<std::string>> kinds =
        with_optimizer ? optimizer_kinds(dir, index, locals, *adamw)
                       : std::vector<std::vector<std::string>>(locals.size());
    const std::vector<SafetensorsReader> readers = open_rank_files(dir, index);

    // Everything is validated: fill the model and the optimizer.
    for (size_t i = 0; i < locals.size(); ++i) {
      const LocalParam& lp = locals[i];
      const std::string model_key = kModelPrefix + lp.name;
      result.bytes_read +=
          fill_local(model_key, index.tensors.at(model_key), lp, lp.param.detach(), readers);
      if (kinds[i].empty()) continue;
      result.bytes_read += load_optimizer_state(index, lp, kinds[i], *adamw, readers, created);
    }
    detail::restore_cpu_rng_state(dir, index.rng_states, rank);
    result.step = index.step;
    result.user_json = index.user_json;
    if (const auto& g = index.grad_scaler) {
      result.grad_scaler = GradScalerState{g->scale, g->growth_tracker, g->growth_factor,
                                           g->backoff_factor, g->growth_interval};
    }
    result.saved_world_size = index.world_size;
    for (const auto& f : index.files) result.checkpoint_bytes += static_cast<int64_t>(f.bytes);
  } catch (...) {
    error = std::current_exception();
    for (void* key : created) adamw->state().erase(key);
  }
  detail::agree(group, error, "loading checkpoint '" + path + "'");
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace fsdp::checkpoint
