// Full checkpoints: save_full, load_full (see include/fsdp/checkpoint/checkpoint.h).
//
// save_full gathers one parameter at a time with an all-gather of its padded shards, or a
// broadcast from the one rank that holds it whole (every rank takes part; rank 0 writes), so no
// rank ever holds more than one full parameter beyond its shards. The header is written first (all
// shapes are known up front) and the data streams after it. Rank 0 keeps taking part in the
// all-gathers after a write error, so the other ranks never wait on it; the error is agreed on at
// the end.
//
// load_full maps the file's keys to parameter names through the layout, reports every
// mismatch at once, then reads each rank's rows: a plain tensor's rows are one contiguous
// range; a transposed one's are a column block of the stored tensor, read row by row. A
// Hugging Face sharded checkpoint (model.safetensors.index.json naming a file per tensor) is
// the union of its files' tensors; the index must agree with the files' headers, so a stale or
// mixed-up index is an error, not a silently partial load.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/safetensors.h>

#include "checkpoint/common.h"
#include "checkpoint/file_util.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>

namespace fsdp::checkpoint {
namespace {

using detail::LocalParam;
using Clock = std::chrono::steady_clock;

std::string file_name_of(const FullLayout& layout, const std::string& name) {
  return layout.to_file() ? layout.to_file()(name) : name;
}

bool is_transposed(const FullLayout& layout, const LocalParam& lp) {
  if (!layout.transposed() || !layout.transposed()(lp.name)) return false;
  TORCH_CHECK(lp.global_shape.size() == 2, "the layout stores '", lp.name,
              "' transposed, but it has shape ", detail::shape_string(lp.global_shape),
              ", not 2-D");
  return true;
}

std::vector<int64_t> file_shape(const LocalParam& lp, bool transposed) {
  if (!transposed) return lp.global_shape;
  return {lp.global_shape[1], lp.global_shape[0]};
}

// gather_full's general case: every rank's padded rows in one all-gather, then rank 0 places
// the distinct row ranges of writers. Ranks may hold different numbers of rows (the tensor-
// parallel slices of an uneven vocabulary, [Note: an uneven vocabulary]): each sends its rows
// padded to the most any rank holds.
at::Tensor gather_rows_to_rank0(const LocalParam& lp, const std::vector<detail::RowRange>& writers,
                                const std::vector<int64_t>& layouts, size_t index, size_t count,
                                ProcessGroup& group) {
  const at::Tensor local = lp.param.detach().contiguous().view({lp.padded_rows, lp.row_numel});
  const int world = group.size(), rank = group.rank();
  int64_t most = 0;
  bool equal = true;
  for (int r = 0; r < world; ++r) {
    const int64_t rows = layouts[(static_cast<size_t>(r) * count + index) * 3 + 2];
    most = std::max(most, rows);
    equal = equal && rows == lp.padded_rows;
  }
  const at::Tensor sent =
      most == lp.padded_rows
          ? local
          : at::cat({local, at::zeros({most - lp.padded_rows, lp.row_numel}, local.options())});
  at::Tensor gathered = at::empty({world, most, lp.row_numel}, local.options());
  group.all_gather_into_tensor(gathered, sent)->wait();
  if (rank != 0) return at::Tensor();
  bool in_order = equal && writers.size() == static_cast<size_t>(world);
  for (size_t r = 0; in_order && r < writers.size(); ++r)
    in_order = writers[r].rank == static_cast<int>(r);
  if (in_order) {  // plain sharding: the chunks in order
    return gathered.view({world * lp.padded_rows, lp.row_numel})
        .narrow(0, 0, lp.dim0)
        .reshape(lp.global_shape);
  }
  at::Tensor full = at::empty({lp.dim0, lp.row_numel}, local.options());
  for (const auto& w : writers)
    full.narrow(0, w.offset, w.rows).copy_(gathered[w.rank].narrow(0, 0, w.rows));
  return full.reshape(lp.global_shape);
}

// The full value of lp on rank 0 (other ranks get an undefined tensor). When rank 0 holds it
// whole nothing moves; otherwise every rank contributes its padded rows to one all-gather (every
// rank pads to the same row count), and rank 0 assembles the distinct row ranges. Collective
// in that case; every rank takes the same branch, as every rank knows every layout.
at::Tensor gather_full(const LocalParam& lp, const std::vector<detail::RowRange>& writers,
                       const std::vector<int64_t>& layouts, size_t index, size_t count,
                       ProcessGroup* group) {
  const at::Tensor local = lp.param.detach();
  const int rank = group ? group->rank() : 0;
  if (lp.needs_whole()) {  // Shard(d > 0) or a TP split: every rank contributes its piece
    const at::Tensor whole = detail::whole_value(group, lp, local);
    return rank == 0 ? whole.view(lp.global_shape) : at::Tensor();
  }
  if (writers.size() == 1 && writers[0].rank == 0) {
    return rank == 0 ? local.reshape(lp.global_shape) : at::Tensor();
  }
  if (writers.size() == 1 && writers[0].rows == lp.dim0) {
    // Whole on another rank alone (inter-tensor ZeRO-3), which broadcasts it.
    const int owner = writers[0].rank;
    at::Tensor full = rank == owner ? local.reshape(lp.global_shape).contiguous()
                                    : at::empty(lp.global_shape, local.options());
    group->broadcast(full, owner)->wait();
    return rank == 0 ? full : at::Tensor();
  }
  return gather_rows_to_rank0(lp, writers, layouts, index, count, *group);
}

constexpr char kIndexSuffix[] = ".index.json";
constexpr uint64_t kMaxIndexBytes = 64ull << 20;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The safetensors files that a load_full path names, and which of them holds each key.
struct FullSource {
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  std::vector<std::pair<const SafetensorsReader*, const TensorEntry*>> entries;
};

// Shards of a Hugging Face index file: {"weight_map": {"<tensor>": "<file>", ...}, ...}, the
// files relative to the index's directory.
void open_index(const std::string& index_path, FullSource& source) {
  const auto index = nlohmann::json::parse(detail::read_file(index_path, kMaxIndexBytes), nullptr,
                                           /*allow_exceptions=*/false);
  TORCH_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              "'", index_path, "' is not a safetensors index (a JSON object with a weight_map)");
  std::map<std::string, std::string> weight_map;
  std::set<std::string> files;
  for (const auto& [key, file] : index["weight_map"].items()) {
    TORCH_CHECK(file.is_string(), "'", index_path, "': weight_map[\"", key,
                "\"] is not a file name");
    const std::string name = file.get<std::string>();
    TORCH_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "..", "'",
                index_path, "': weight_map[\"", key, "\"] = '", name,
                "' is not a file name in the index's directory");
    weight_map[key] = name;
    files.insert(name);
  }
  const std::string dir = detail::parent_directory(index_path);
  std::set<std::string> found;
  for (const std::string& file : files) {
    source.readers.push_back(std::make_unique<SafetensorsReader>(dir + "/" + file));
    const SafetensorsReader& reader = *source.readers.back();
    for (const auto& e : reader.header().entries) {
      auto it = weight_map.find(e.name);
      TORCH_CHECK(
          it != weight_map.end() && it->second == file, "'", reader.path(), "' holds '", e.name,
          "', which '", index_path, "' ",
          it == weight_map.end() ? std::string("does not list") : "places in '" + it->second + "'");
      found.insert(e.name);
      source.entries.emplace_back(&reader, &e);
    }
  }
  for (const auto& [key, file] : weight_map) {
    TORCH_CHECK(found.count(key) == 1, "'", index_path, "' places '", key, "' in '", file,
                "', which does not hold it");
  }
}

// path: a safetensors file, an index file (*.index.json), or a directory holding
// model.safetensors or else model.safetensors.index.json.
FullSource open_full_source(const std::string& path) {
  FullSource source;
  std::string file = path;
  if (detail::is_directory(path)) {
    // transformers' order: the single file first, then the index.
    const std::string single = path + "/model.safetensors";
    file = detail::path_exists(single) ? single : path + "/model.safetensors.index.json";
    TORCH_CHECK(detail::path_exists(file), "directory '", path,
                "' holds neither model.safetensors.index.json nor model.safetensors");
  }
  if (ends_with(file, kIndexSuffix)) {
    open_index(file, source);
  } else {
    source.readers.push_back(std::make_unique<SafetensorsReader>(file));
    for (const auto& e : source.readers.back()->header().entries)
      source.entries.emplace_back(source.readers.back().get(), &e);
  }
  return source;
}

// One file of a (possibly sharded) export: its final and temporary paths and its entries.
struct ShardFile {
  std::string path, tmp;
  std::vector<TensorEntry> entries;
};

int64_t entry_bytes(const TensorEntry& e) {
  int64_t n = dtype_size(e.dtype);
  for (int64_t d : e.shape) n *= d;
  return n;
}

// Splits entries, in order, into files of at most max_shard_bytes of tensor data (a larger
// tensor alone in its file): model-<k>-of-<n>.safetensors in dir, as transformers'
// save_pretrained names them; one file at path when they fit in one or max_shard_bytes is 0.
void plan_shards(const std::string& path, const std::string& dir, std::vector<TensorEntry> entries,
                 int64_t max_shard_bytes, std::vector<ShardFile>& shards,
                 std::vector<size_t>& shard_of) {
  TORCH_CHECK(max_shard_bytes >= 0, "max_shard_bytes must be non-negative, got ", max_shard_bytes);
  std::vector<std::vector<TensorEntry>> groups(1);
  int64_t in_group = 0;
  for (auto& e : entries) {
    const int64_t n = entry_bytes(e);
    if (max_shard_bytes > 0 && !groups.back().empty() && in_group + n > max_shard_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    in_group += n;
    groups.back().push_back(std::move(e));
    shard_of.push_back(groups.size() - 1);
  }
  const std::string suffix = ".tmp-" + std::to_string(::getpid());
  if (groups.size() == 1) {
    shards.push_back({path, path + suffix, std::move(groups[0])});
    return;
  }
  char name[64];
  for (size_t k = 0; k < groups.size(); ++k) {
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, groups.size());
    shards.push_back({dir + "/" + name, dir + "/" + name + suffix, std::move(groups[k])});
  }
}

std::unique_ptr<SafetensorsWriter> open_shard_writer(const ShardFile& shard,
                                                     std::map<std::string, std::string> metadata) {
  metadata["format"] = "pt";  // transformers refuses safetensors files without it
  return std::make_unique<SafetensorsWriter>(shard.tmp, shard.entries, std::move(metadata));
}

// model.safetensors.index.json: {"metadata": {"total_size": <tensor bytes>}, "weight_map":
// {"<tensor>": "<file>"}}, transformers' format.
void write_index(const std::string& dir, const std::vector<ShardFile>& shards) {
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total = 0;
  for (const auto& shard : shards) {
    const std::string file = shard.path.substr(shard.path.rfind('/') + 1);
    for (const auto& e : shard.entries) {
      weight_map[e.name] = file;
      total += entry_bytes(e);
    }
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  detail::write_file_atomically(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

// Rank 0's side of an export: the files it writes (one at path, or with max_shard_bytes,
// Hugging Face's shards beside it) and the writer of the one open now.
struct ExportFiles {
  std::vector<ShardFile> shards;
  std::vector<size_t> shard_of;  // per parameter
  std::unique_ptr<SafetensorsWriter> writer;
  size_t open_shard = 0;
  int64_t bytes = 0;

  // Plans the files and opens the first.
  void open(const std::string& path, const std::string& dir, const std::vector<LocalParam>& locals,
            const std::vector<bool>& transposed, const ExportOptions& options) {
    std::vector<TensorEntry> entries;
    for (size_t i = 0; i < locals.size(); ++i) {
      TensorEntry e;
      e.name = file_name_of(options.layout(), locals[i].name);
      e.dtype = to_dtype(options.dtype().value_or(locals[i].param.scalar_type()));
      e.shape = file_shape(locals[i], transposed[i]);
      entries.push_back(std::move(e));
    }
    detail::make_directories(dir);
    plan_shards(path, dir, std::move(entries), options.max_shard_bytes(), shards, shard_of);
    writer = open_shard_writer(shards[0], options.metadata());
  }

  // Writes parameter i, gathered whole, moving on to its file first.
  void write(size_t i, const at::Tensor& full, bool transposed, const ExportOptions& options) {
    if (shard_of[i] != open_shard) {  // shards hold consecutive parameters
      writer->finish();
      bytes += static_cast<int64_t>(writer->file_bytes());
      open_shard = shard_of[i];
      writer = open_shard_writer(shards[open_shard], options.metadata());
    }
    at::Tensor t = transposed ? full.t() : full;
    t = t.to(at::kCPU, options.dtype().value_or(t.scalar_type())).contiguous();
    writer->write(t);
  }

  // Finishes the last file and renames every file into place.
  void publish(const std::string& path, const std::string& dir) {
    writer->finish();
    bytes += static_cast<int64_t>(writer->file_bytes());
    writer.reset();
    for (const auto& shard : shards) {
      TORCH_CHECK(::rename(shard.tmp.c_str(), shard.path.c_str()) == 0,
                  detail::system_error("cannot rename", shard.tmp));
    }
    // The new files replace what a directory load (and transformers) would otherwise prefer
    // or find: path when sharded, a sharded index when path is the directory's
    // model.safetensors.
    const std::string index = dir + "/model.safetensors.index.json";
    if (shards.size() > 1) {
      write_index(dir, shards);
      ::unlink(path.c_str());
    } else if (path == dir + "/model.safetensors") {
      ::unlink(index.c_str());
    }
    detail::fsync_directory(dir);
  }

  // Removes the temporary files after an error.
  void abort() {
    writer.reset();
    for (const auto& shard : shards) ::unlink(shard.tmp.c_str());
  }
};

using EntryOf = std::pair<const SafetensorsReader*, const TensorEntry*>;

// Which file entry holds each parameter (by name), and whether the layout stores each
// transposed (pushed onto `transposed`, after the entries are matched, so that errors come in
// the order they always have). Throws listing every parameter the source
// lacks, every tensor it has that the model lacks, and every shape that differs.
std::unordered_map<std::string, EntryOf> match_params(const std::string& path,
                                                      const FullSource& source,
                                                      const std::vector<LocalParam>& locals,
                                                      const FullLayout& layout,
                                                      std::vector<bool>& transposed) {
  std::unordered_map<std::string, EntryOf> by_param;
  std::vector<std::string> unexpected, missing, misshaped;
  std::unordered_map<std::string, const LocalParam*> params;
  for (const auto& lp : locals) params[lp.name] = &lp;
  for (const auto& [file, entry] : source.entries) {
    const TensorEntry& e = *entry;
    const std::optional<std::string> name =
        layout.from_file() ? layout.from_file()(e.name) : e.name;
    if (!name) continue;
    if (params.count(*name) == 0) {
      unexpected.push_back(e.name + " " + detail::shape_string(e.shape));
      continue;
    }
    auto [it, inserted] = by_param.emplace(*name, std::make_pair(file, &e));
    TORCH_CHECK(inserted, "'", path, "' holds parameter '", *name, "' twice, as '",
                it->second.second->name, "' and as '", e.name, "'");
  }
  for (size_t i = 0; i < locals.size(); ++i) {
    const LocalParam& lp = locals[i];
    transposed.push_back(is_transposed(layout, lp));
    const auto want = file_shape(lp, transposed.back());
    auto it = by_param.find(lp.name);
    if (it == by_param.end()) {
      missing.push_back(file_name_of(layout, lp.name) + " " + detail::shape_string(want));
    } else if (it->second.second->shape != want) {
      misshaped.push_back(it->second.second->name + ": file " +
                          detail::shape_string(it->second.second->shape) + ", model expects " +
                          detail::shape_string(want));
    }
  }
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::string message = "'" + path + "' does not match the model:";
    detail::append_list(message, "missing from the file", missing);
    detail::append_list(message, "unexpected in the file", unexpected);
    detail::append_list(message, "mis-shaped", misshaped);
    TORCH_CHECK(false, message);
  }
  return by_param;
}

// Reads this rank's rows of one parameter from its entry and zeroes the padding rows; with
// `verify`, reads the entry whole so its stored checksum is checked.
void load_param(const LocalParam& lp, const SafetensorsReader& reader, const TensorEntry& e,
                bool transposed, bool verify) {
  const at::ScalarType file_type = to_scalar_type(e.dtype);
  // Shard(d > 0) or a TP split read whole (lp.rows is every row), then this rank's part kept.
  const at::Tensor dst = lp.needs_whole() ? at::empty({lp.dim0, lp.row_numel}, lp.param.options())
                                          : lp.rows_view(lp.param.detach());
  if (lp.rows > 0) {
    at::Tensor rows;
    if (verify || lp.rows == lp.dim0) {
      // Read whole: verified against the stored checksum when there is one.
      at::Tensor full = reader.read(e.name);
      full = transposed ? full.t() : full;
      rows = full.reshape({lp.dim0, lp.row_numel}).narrow(0, lp.offset, lp.rows);
    } else if (!transposed) {
      rows = at::empty({lp.rows, lp.row_numel}, file_type);
      reader.read_rows(e, lp.offset, lp.rows, rows);
    } else {
      rows = at::empty({lp.rows, lp.row_numel}, file_type);
      reader.read_columns_transposed(e, lp.offset, lp.rows, rows);
    }
    dst.narrow(0, 0, lp.rows).copy_(rows);
  } else if (verify) {
    reader.read(e.name);
  }
  if (lp.rows < lp.padded_rows) dst.narrow(0, lp.rows, lp.padded_rows - lp.rows).zero_();
  if (lp.needs_whole()) detail::place_whole_value(lp, dst, lp.param.detach());
}

}  // namespace

ExportResult save_full(const std::string& path, const torch::nn::Module& model, ProcessGroup* group,
                       const ExportOptions& options) {
  const auto start = Clock::now();
  const int rank = group ? group->rank() : 0;
  const int world = group ? group->size() : 1;
  const std::string what = "exporting '" + path + "'";
  std::vector<LocalParam> locals;
  std::vector<bool> transposed;
  detail::agreed_phase(group, what, [&] {
    locals = detail::local_params(model, group);
    for (const auto& lp : locals) transposed.push_back(is_transposed(options.layout(), lp));
  });
  std::vector<int64_t> layouts;
  std::vector<std::vector<detail::RowRange>> writers;
  detail::agreed_phase(group, what, [&] {
    layouts = detail::gather_row_layouts(group, locals);
    writers = detail::choose_writers(layouts, locals, world);
  });

  // Rank 0 writes while every rank keeps gathering: its failure is agreed on at the end.
  std::exception_ptr error;
  ExportFiles files;
  const std::string dir = detail::parent_directory(path);
  if (rank == 0)
    detail::unless_failed(error, [&] { files.open(path, dir, locals, transposed, options); });
  for (size_t i = 0; i < locals.size(); ++i) {
    const at::Tensor full = gather_full(locals[i], writers[i], layouts, i, locals.size(), group);
    if (rank == 0)
      detail::unless_failed(error, [&] { files.write(i, full, transposed[i], options); });
  }
  if (rank == 0) detail::unless_failed(error, [&] { files.publish(path, dir); });
  if (rank == 0 && error) files.abort();
  detail::agree(group, error, what);
  return {files.bytes, std::chrono::duration<double>(Clock::now() - start).count()};
}

void load_full(const std::string& path, torch::nn::Module& model, ProcessGroup* group,
               const FullLayout& layout) {
  const int world = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  detail::agreed_phase(group, "initializing from '" + path + "'", [&] {
    const FullSource source = open_full_source(path);
    const std::vector<LocalParam> locals = detail::local_params(model, group);
    std::vector<bool> transposed;
    const auto by_param = match_params(path, source, locals, layout, transposed);

    at::NoGradGuard no_grad;
    for (size_t i = 0; i < locals.size(); ++i) {
      const LocalParam& lp = locals[i];
      const auto [file, entry] = by_param.at(lp.name);
      // One rank per parameter verifies it, spreading the whole reads over the ranks.
      const bool verify =
          file->stored_checksum(entry->name).has_value() && static_cast<int>(i % world) == rank;
      load_param(lp, *file, *entry, transposed[i], verify);
    }
  });
}

}  // namespace fsdp::checkpoint
