// What sharded and full checkpoints share: this rank's view of each parameter (its rows of
// the global tensor), who stores which rows, and agreeing on failure across ranks.
//
// Files hold row ranges (dim 0) of global tensors. A parameter sharded along a dim d > 0
// (shard_placement_fn) holds no row range: the checkpoint treats it as whole on every rank
// (rows = dim0, so one rank writes it), saving its whole value gathered from the ranks
// (whole_value, collective) and loading by reading the whole tensor and keeping this rank's
// slices along d (place_whole_value).
//
// A parameter split by tensor parallelism ([Note: tensor-parallel slices in checkpoints] in
// common.cpp) is stored as its global tensor too: a column split with no packed blocks is a row
// range (the slice's offset plus FSDP's rows within it); any other split is gathered whole, as
// Shard(d > 0) is (LocalParam::tp).
//
// The group of a checkpoint call is the whole job (the world). A parameter's rows may be held
// by several ranks at once: with HSDP every replica holds the same shard, with no_shard every
// rank holds the whole tensor, and parameters outside FSDP units are whole on every rank. Each
// distinct row range is stored once, by the first rank (in world order) that holds it.
#pragma once

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/fully_shard.h>
#include <fsdp/tensor_parallel.h>

#include <ATen/core/Tensor.h>

#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::checkpoint::detail {

// One distinct parameter of the model, as this rank holds it.
struct LocalParam {
  std::string name;  // full name under the model (a tied parameter once, at its first name)
  at::Tensor param;  // the parameter itself (its data is the padded shard when sharded)
  std::vector<int64_t> global_shape;
  int64_t dim0 = 1;         // rows of the global tensor (1 for 0-D)
  int64_t row_numel = 1;    // elements per row
  int64_t offset = 0;       // first global row this rank holds
  int64_t rows = 0;         // real rows this rank holds
  int64_t padded_rows = 0;  // rows of the local tensor, padding included
  bool sharded = false;     // managed by an FSDP unit (else the full tensor, on every rank)
  // Shard(d), d > 0: the placement the local tensor has (offset, rows and padded_rows above then
  // describe the whole tensor, as for a parameter every rank holds in full).
  int64_t shard_dim = 0;
  int64_t dim_offset = 0;  // first slice along shard_dim this rank holds
  int64_t dim_rows = 0;    // real slices along shard_dim this rank holds
  int64_t dim_padded = 0;  // slices along shard_dim of the local tensor, padding included

  // A tensor-parallel split that is not a row range of the global tensor (a row layer's
  // columns, a packed column layer's blocks): where this rank's local tensor sits. offset, rows
  // and padded_rows above then describe the whole tensor.
  struct TensorParallelSlice {
    const TensorParallelPlacement* placement = nullptr;
    int rank = 0;                      // in the placement's group
    std::vector<int64_t> slice_shape;  // the tensor-parallel slice's (FSDP's global) shape
    int64_t offset = 0;                // FSDP's rows of the slice this rank holds: first,
    int64_t rows = 0;                  // real ones,
    int64_t padded = 0;                // and with padding (the local tensor's dim 0)
  };
  std::optional<TensorParallelSlice> tp;

  // The local tensor (param, or a state tensor of the same shape) as [padded_rows, row_numel].
  // When needs_whole() pass the whole value instead (whole_value).
  at::Tensor rows_view(const at::Tensor& local) const;
  bool along_dim() const { return shard_dim > 0; }
  // The local tensor is no row range of the global one: saved gathered whole, loaded from it.
  bool needs_whole() const { return along_dim() || tp.has_value(); }
  int64_t local_numel() const;
  // Shape of the local tensor under Shard(d > 0): the global shape with d's size dim_padded.
  std::vector<int64_t> dim_padded_shape() const;
};

// needs_whole(): the whole value ([dim0, row_numel]) of lp's local tensor `local` (the
// parameter or a state tensor of its shape), gathered over group. Collective: every rank calls
// it for the same tensors in the same order.
at::Tensor whole_value(ProcessGroup* group, const LocalParam& lp, const at::Tensor& local);
// needs_whole(): copies this rank's part of whole (the global tensor) into local and zeroes its
// padding. Local: no communication.
void place_whole_value(const LocalParam& lp, const at::Tensor& whole, const at::Tensor& local);

// Every distinct parameter of model, in named_parameters() order. Parameters of FSDP units get
// their shard layout; others are full on every rank. Throws when a sharded parameter is
// currently unsharded, when its mesh does not fit in group, or when the model is sharded over
// several ranks but group is null.
std::vector<LocalParam> local_params(const torch::nn::Module& model, ProcessGroup* group);

// Every rank's (offset, rows, padded_rows) of every parameter, flat as [world][params][3].
// Collective (one small all-gather).
std::vector<int64_t> gather_row_layouts(ProcessGroup* group, const std::vector<LocalParam>& locals);

struct RowRange {
  int rank = 0;
  int64_t offset = 0;
  int64_t rows = 0;
};
// For each parameter, who stores it: the first rank, in rank order, holding each distinct
// non-empty row range (the same range on a later rank is a replica and skipped), sorted by
// offset. Throws if two ranks hold ranges that overlap without being equal, or if the ranges do
// not cover the parameter. Deterministic: every rank computes the same answer.
std::vector<std::vector<RowRange>> choose_writers(const std::vector<int64_t>& layouts,
                                                  const std::vector<LocalParam>& locals, int world);

// Collective: every rank passes its own error (or null). Returns when no rank failed;
// otherwise throws on every rank a message naming each failed rank and its message, prefixed
// by what. With a null group, rethrows error as is.
void agree(ProcessGroup* group, const std::exception_ptr& error, const std::string& what);

// Runs work unless an earlier step already failed, keeping its exception in error for agree():
// a rank that fails must still take part in the collectives that follow.
template <class Work>
void unless_failed(std::exception_ptr& error, Work&& work) {
  if (error) return;
  try {
    work();
  } catch (...) {
    error = std::current_exception();
  }
}

// One phase of a collective save or load: runs work on this rank, then agree()s on every
// rank's outcome, so the ranks leave the phase together, all done or all throwing.
template <class Work>
void agreed_phase(ProcessGroup* group, const std::string& what, Work&& work) {
  std::exception_ptr error;
  unless_failed(error, std::forward<Work>(work));
  agree(group, error, what);
}

// "[3, 4]".
std::string shape_string(c10::IntArrayRef shape);

// Appends to a mismatch message "title (N):" and the first kMaxListed items, one a line, then
// how many more there are: a load that names every fault, but not thousands of lines.
constexpr size_t kMaxListed = 40;
template <typename Item>
void append_list(std::string& out, const char* title, const std::vector<Item>& items) {
  if (items.empty()) return;
  out += std::string("\n  ") + title + " (" + std::to_string(items.size()) + "):";
  for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) out += "\n    " + items[i];
  if (items.size() > kMaxListed)
    out += "\n    ... and " + std::to_string(items.size() - kMaxListed) + " more";
}

// A save's checks of its options, before anything is written: a non-negative step and
// keep_last, user_json a JSON object, a gradient scaler state that a scaler would load.
void check_save_options(const SaveOptions& options);

// Collective (world > 1): every rank must store the same tensors (count of them, and a hash of
// what they are), which the save's collectives rely on. Throws on every rank otherwise.
void check_same_on_every_rank(ProcessGroup* group, int64_t count, uint64_t signature,
                              const std::string& what);

}  // namespace fsdp::checkpoint::detail
