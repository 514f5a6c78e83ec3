// Full checkpoints: save_full, load_full (see include/fsdp/checkpoint/checkpoint.h).
//
// save_full gathers one parameter at a time with an all-gather of its padded shards (every
// rank takes part; rank 0 writes), so no rank ever holds more than one full parameter beyond
// its shards. The header is written first (all shapes are known up front) and the data
// streams after it. Rank 0 keeps taking part in the all-gathers after a write error, so the
// other ranks never wait on it; the error is agreed on at the end.
//
// load_full maps the file's keys to parameter names through the layout, reports every
// mismatch at once, then reads each rank's rows: a plain tensor's rows are one contiguous
// range; a transposed one's are a column block of the stored tensor, read row by row.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/safetensors.h>

#include "checkpoint/common.h"
#include "checkpoint/file_util.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <unistd.h>
#include <chrono>
#include <unordered_map>

namespace fsdp::checkpoint {
namespace {

using detail::LocalParam;
using Clock = std::chrono::steady_clock;
constexpr size_t kMaxListed = 40;

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

// The full value of lp on rank 0 (other ranks get an undefined tensor). When rank 0 holds it
// whole nothing moves; otherwise every rank contributes its padded rows to one all-gather (every
// rank pads to the same row count), and rank 0 assembles the distinct row ranges. Collective
// in that case; every rank takes the same branch, as every rank knows every layout.
at::Tensor gather_full(const LocalParam& lp, const std::vector<detail::RowRange>& writers,
                       const std::vector<int64_t>& layouts, size_t index, size_t count,
                       ProcessGroup* group) {
  const at::Tensor local = lp.param.detach();
  const int rank = group ? group->rank() : 0;
  if (writers.size() == 1 && writers[0].rank == 0) {
    return rank == 0 ? local.reshape(lp.global_shape) : at::Tensor();
  }
  const int world = group->size();
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK(layouts[(static_cast<size_t>(r) * count + index) * 3 + 2] == lp.padded_rows,
                "parameter '", lp.name, "' has ", lp.padded_rows, " local rows on rank ", rank,
                " but ", layouts[(static_cast<size_t>(r) * count + index) * 3 + 2], " on rank ", r);
  }
  at::Tensor gathered = at::empty({world, lp.padded_rows, lp.row_numel}, local.options());
  group->all_gather_into_tensor(gathered, local.contiguous())->wait();
  if (rank != 0) return at::Tensor();
  if (writers.size() == static_cast<size_t>(world)) {  // plain sharding: the chunks in order
    bool in_order = true;
    for (int r = 0; r < world; ++r) in_order = in_order && writers[r].rank == r;
    if (in_order)
      return gathered.view({world * lp.padded_rows, lp.row_numel})
          .narrow(0, 0, lp.dim0)
          .reshape(lp.global_shape);
  }
  at::Tensor full = at::empty({lp.dim0, lp.row_numel}, local.options());
  for (const auto& w : writers)
    full.narrow(0, w.offset, w.rows).copy_(gathered[w.rank].narrow(0, 0, w.rows));
  return full.reshape(lp.global_shape);
}

void append_list(std::string& out, const char* title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  out += std::string("\n  ") + title + " (" + std::to_string(items.size()) + "):";
  for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) out += "\n    " + items[i];
  if (items.size() > kMaxListed)
    out += "\n    ... and " + std::to_string(items.size() - kMaxListed) + " more";
}

}  // namespace

ExportResult save_full(const std::string& path, const torch::nn::Module& model, ProcessGroup* group,
                       const ExportOptions& options) {
  const auto start = Clock::now();
  const int rank = group ? group->rank() : 0;
  const int world = group ? group->size() : 1;
  std::vector<LocalParam> locals;
  std::vector<bool> transposed;
  std::exception_ptr error;
  try {
    locals = detail::local_params(model, group);
    for (const auto& lp : locals) transposed.push_back(is_transposed(options.layout(), lp));
  } catch (...) {
    error = std::current_exception();
  }
  detail::agree(group, error, "exporting '" + path + "'");
  std::vector<int64_t> layouts;
  std::vector<std::vector<detail::RowRange>> writers;
  try {
    layouts = detail::gather_row_layouts(group, locals);
    writers = detail::choose_writers(layouts, locals, world);
  } catch (...) {
    error = std::current_exception();
  }
  detail::agree(group, error, "exporting '" + path + "'");

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  std::unique_ptr<SafetensorsWriter> writer;
  int64_t bytes = 0;
  if (rank == 0) {
    try {
      std::vector<TensorEntry> entries;
      for (size_t i = 0; i < locals.size(); ++i) {
        TensorEntry e;
        e.name = file_name_of(options.layout(), locals[i].name);
        e.dtype = to_dtype(options.dtype().value_or(locals[i].param.scalar_type()));
        e.shape = file_shape(locals[i], transposed[i]);
        entries.push_back(std::move(e));
      }
      detail::make_directories(detail::parent_directory(path));
      std::map<std::string, std::string> metadata = options.metadata();
      metadata["format"] = "pt";  // transformers refuses safetensors files without it
      writer = std::make_unique<SafetensorsWriter>(tmp, std::move(entries), std::move(metadata));
      bytes = static_cast<int64_t>(writer->file_bytes());
    } catch (...) {
      error = std::current_exception();
    }
  }
  for (size_t i = 0; i < locals.size(); ++i) {
    const at::Tensor full = gather_full(locals[i], writers[i], layouts, i, locals.size(), group);
    if (rank != 0 || error) continue;
    try {
      at::Tensor t = transposed[i] ? full.t() : full;
      t = t.to(at::kCPU, options.dtype().value_or(t.scalar_type())).contiguous();
      writer->write(t);
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (rank == 0 && !error) {
    try {
      writer->finish();
      writer.reset();
      TORCH_CHECK(::rename(tmp.c_str(), path.c_str()) == 0,
                  detail::system_error("cannot rename", tmp));
      detail::fsync_directory(detail::parent_directory(path));
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (rank == 0 && error) {
    writer.reset();
    ::unlink(tmp.c_str());
  }
  detail::agree(group, error, "exporting '" + path + "'");
  return {bytes, std::chrono::duration<double>(Clock::now() - start).count()};
}

void load_full(const std::string& path, torch::nn::Module& model, ProcessGroup* group,
               const FullLayout& layout) {
  const int world = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  std::exception_ptr error;
  try {
    const SafetensorsReader reader(path);
    const std::vector<LocalParam> locals = detail::local_params(model, group);

    // Which file entry holds each parameter.
    std::unordered_map<std::string, const TensorEntry*> by_param;
    std::vector<std::string> unexpected, missing, misshaped;
    std::unordered_map<std::string, const LocalParam*> params;
    for (const auto& lp : locals) params[lp.name] = &lp;
    for (const auto& e : reader.header().entries) {
      const std::optional<std::string> name =
          layout.from_file() ? layout.from_file()(e.name) : e.name;
      if (!name) continue;
      if (params.count(*name) == 0) {
        unexpected.push_back(e.name + " " + detail::shape_string(e.shape));
        continue;
      }
      auto [it, inserted] = by_param.emplace(*name, &e);
      TORCH_CHECK(inserted, "'", path, "' holds parameter '", *name, "' twice, as '",
                  it->second->name, "' and as '", e.name, "'");
    }
    std::vector<bool> transposed;
    for (const auto& lp : locals) {
      transposed.push_back(is_transposed(layout, lp));
      const auto want = file_shape(lp, transposed.back());
      auto it = by_param.find(lp.name);
      if (it == by_param.end()) {
        missing.push_back(file_name_of(layout, lp.name) + " " + detail::shape_string(want));
      } else if (it->second->shape != want) {
        misshaped.push_back(it->second->name + ": file " + detail::shape_string(it->second->shape) +
                            ", model expects " + detail::shape_string(want));
      }
    }
    if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
      std::string message = "'" + path + "' does not match the model:";
      append_list(message, "missing from the file", missing);
      append_list(message, "unexpected in the file", unexpected);
      append_list(message, "mis-shaped", misshaped);
      TORCH_CHECK(false, message);
    }

    at::NoGradGuard no_grad;
    for (size_t i = 0; i < locals.size(); ++i) {
      const LocalParam& lp = locals[i];
      const TensorEntry& e = *by_param.at(lp.name);
      const at::ScalarType file_type = to_scalar_type(e.dtype);
      const at::Tensor dst = lp.rows_view(lp.param.detach());
      const bool verify =
          reader.stored_checksum(e.name).has_value() && static_cast<int>(i % world) == rank;
      if (lp.rows > 0) {
        at::Tensor rows;
        if (verify || lp.rows == lp.dim0) {
          // Read whole: verified against the stored checksum when there is one.
          at::Tensor full = reader.read(e.name);
          full = transposed[i] ? full.t() : full;
          rows = full.reshape({lp.dim0, lp.row_numel}).narrow(0, lp.offset, lp.rows);
        } else if (!transposed[i]) {
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
    }
  } catch (...) {
    error = std::current_exception();
  }
  detail::agree(group, error, "initializing from '" + path + "'");
}

}  // namespace fsdp::checkpoint
