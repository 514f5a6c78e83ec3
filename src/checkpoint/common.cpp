// See common.h. A parameter's rows come from the FSDP unit that manages it (FSDPModule's
// ShardMetadata), matched by TensorImpl, so tied parameters and full names line up with
// unique_named_parameters().
#include "checkpoint/common.h"

#include <fsdp/tensor_parallel.h>

#include <fsdp/grad_scaler.h>
#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace fsdp::checkpoint::detail {

at::Tensor LocalParam::rows_view(const at::Tensor& local) const {
  return local.view({padded_rows, row_numel});
}

std::vector<int64_t> LocalParam::dim_padded_shape() const {
  std::vector<int64_t> shape = global_shape;
  shape[shard_dim] = dim_padded;
  return shape;
}

int64_t LocalParam::local_numel() const {
  if (tp) return tp->padded * (c10::multiply_integers(tp->slice_shape) / tp->slice_shape[0]);
  return along_dim() ? c10::multiply_integers(dim_padded_shape()) : padded_rows * row_numel;
}

// [Note: tensor-parallel slices in checkpoints]
// Files hold global tensors, so a checkpoint saved at one (dp, tp) loads at any other, and a
// tensor-parallel run's export is the single process's. A rank's local tensor is FSDP's rows
// (offset, rows, padded) of its tensor-parallel slice. A column split with no packed blocks
// slices dim 0 in rank order, so those rows are global rows (the slice's first row plus
// offset): a row range like any other, stored and read without gathering. A row split (columns)
// or a packed column split (each block's part) is not: it is gathered whole over every rank
// (each contributes its piece and where it sits) and assembled through the slice views that
// parallelize_module cut it by (tensor_parallel_slice_view), one tensor at a time, like
// Shard(d > 0); loading reads it whole and keeps this rank's piece.
namespace {

at::Tensor tensor_parallel_whole(ProcessGroup* group, const LocalParam& lp,
                                 const at::Tensor& local) {
  const LocalParam::TensorParallelSlice& tp = *lp.tp;
  const int world = group ? group->size() : 1;
  std::vector<int64_t> mine = {tp.rank, tp.offset, tp.rows, local.numel()};
  at::Tensor places = at::from_blob(mine.data(), {1, 4}, at::kLong);
  if (world > 1) {
    places = at::empty({world, 4}, at::kLong);
    group->all_gather_into_tensor(places, at::from_blob(mine.data(), {4}, at::kLong))->wait();
  }
  const auto* place = places.const_data_ptr<int64_t>();
  for (int r = 0; r < world; ++r) {  // every rank sees the same table, so all throw or none
    TORCH_CHECK(place[4 * r + 3] == local.numel(), "parameter '", lp.name, "': rank ", r, " holds ",
                place[4 * r + 3], " elements of its tensor-parallel slice and this rank ",
                local.numel(), "; the ranks' pieces must be equal to be gathered");
  }
  at::Tensor pieces = local.contiguous().view({1, -1});
  if (world > 1) {
    pieces = at::empty({world, local.numel()}, local.options());
    group->all_gather_into_tensor(pieces, local.contiguous().view({-1}))->wait();
  }
  const int64_t slice_rows = tp.slice_shape[0], inner = local.numel() / tp.padded;
  const int size = tp.placement->group->size();
  at::Tensor slices = at::zeros({size, slice_rows, inner}, local.options());
  std::vector<int64_t> covered(size, 0);  // replicas (dp without FSDP) write equal values
  for (int r = 0; r < world; ++r) {
    const int64_t t = place[4 * r], offset = place[4 * r + 1], rows = place[4 * r + 2];
    TORCH_CHECK(t >= 0 && t < size && offset >= 0 && offset + rows <= slice_rows, "parameter '",
                lp.name, "': rank ", r, " holds rows [", offset, ", ", offset + rows,
                ") of tensor-parallel slice ", t, ", outside its ", size, " slices of ", slice_rows,
                " rows");
    slices[t].narrow(0, offset, rows).copy_(pieces[r].view({tp.padded, inner}).narrow(0, 0, rows));
    covered[t] = std::max(covered[t], offset + rows);
  }
  at::Tensor whole = at::empty(lp.global_shape, local.options());
  for (int t = 0; t < size; ++t) {
    TORCH_CHECK(covered[t] == slice_rows, "parameter '", lp.name, "': the ranks hold rows up to ",
                covered[t], " of tensor-parallel slice ", t, "'s ", slice_rows);
    const at::Tensor view = tensor_parallel_slice_view(whole, *tp.placement, t);
    view.copy_(slices[t].view(view.sizes()));
  }
  return whole.view({lp.dim0, lp.row_numel});
}

void place_tensor_parallel_whole(const LocalParam& lp, const at::Tensor& whole,
                                 const at::Tensor& local) {
  const LocalParam::TensorParallelSlice& tp = *lp.tp;
  const at::Tensor slice =
      tensor_parallel_slice_view(whole.view(lp.global_shape), *tp.placement, tp.rank)
          .reshape(tp.slice_shape);
  std::vector<int64_t> padded_shape = tp.slice_shape;
  padded_shape[0] = tp.padded;
  const at::Tensor dst = local.view(padded_shape);
  if (tp.rows > 0) dst.narrow(0, 0, tp.rows).copy_(slice.narrow(0, tp.offset, tp.rows));
  if (tp.rows < tp.padded) dst.narrow(0, tp.rows, tp.padded - tp.rows).zero_();
}

}  // namespace

at::Tensor whole_value(ProcessGroup* group, const LocalParam& lp, const at::Tensor& local) {
  if (lp.tp) return tensor_parallel_whole(group, lp, local);
  TORCH_INTERNAL_ASSERT(lp.along_dim());
  if (group == nullptr || group->size() == 1) {
    // One rank: its shard is the whole tensor (no padding).
    return local.contiguous().view({lp.dim0, lp.row_numel});
  }
  const int world = group->size();
  // Every rank's padded shard (the same shape on every rank) and where it sits along d.
  at::Tensor shards = at::empty({world, local.numel()},
                                local.options().memory_format(at::MemoryFormat::Contiguous));
  group->all_gather_into_tensor(shards, local.contiguous().view({-1}))->wait();
  std::vector<int64_t> mine = {lp.dim_offset, lp.dim_rows};
  at::Tensor places = at::empty({2 * world}, at::kLong);
  group->all_gather_into_tensor(places, at::from_blob(mine.data(), {2}, at::kLong))->wait();
  const auto* place = places.const_data_ptr<int64_t>();
  // The shards as [outer, rows, inner] around d: a replica's slices overwrite equal values.
  const int64_t d = lp.shard_dim;
  const int64_t outer =
      c10::multiply_integers(lp.global_shape.begin(), lp.global_shape.begin() + d);
  const int64_t inner =
      c10::multiply_integers(lp.global_shape.begin() + d + 1, lp.global_shape.end());
  const int64_t size = lp.global_shape[d];
  at::Tensor whole = at::empty({outer, size, inner}, shards.options());
  int64_t end = 0;  // the ranks' chunks tile [0, size) in rank order, so the last one ends it
  for (int r = 0; r < world; ++r) {
    const int64_t offset = place[2 * r], rows = place[2 * r + 1];
    if (rows == 0) continue;
    TORCH_CHECK(offset >= 0 && offset + rows <= size, "parameter '", lp.name, "': rank ", r,
                " holds slices [", offset, ", ", offset + rows, ") of dim ", d, ", outside its ",
                size);
    whole.narrow(1, offset, rows)
        .copy_(shards[r].view({outer, lp.dim_padded, inner}).narrow(1, 0, rows));
    end = std::max(end, offset + rows);
  }
  TORCH_CHECK(end == size, "parameter '", lp.name, "': the ranks hold slices up to ", end,
              " of its ", size, " along dim ", d);
  return whole.view({lp.dim0, lp.row_numel});
}

void place_whole_value(const LocalParam& lp, const at::Tensor& whole, const at::Tensor& local) {
  if (lp.tp) return place_tensor_parallel_whole(lp, whole, local);
  TORCH_INTERNAL_ASSERT(lp.along_dim());
  const int64_t d = lp.shard_dim;
  const at::Tensor dst = local.view(lp.dim_padded_shape());
  if (lp.dim_rows > 0) {
    dst.narrow(d, 0, lp.dim_rows)
        .copy_(whole.view(lp.global_shape).narrow(d, lp.dim_offset, lp.dim_rows));
  }
  if (lp.dim_rows < lp.dim_padded) dst.narrow(d, lp.dim_rows, lp.dim_padded - lp.dim_rows).zero_();
}

namespace {

// The sharding fields of lp from its parameter's shard metadata; refuses metadata that does not
// fit a checkpoint group of `world` ranks.
void set_sharding(LocalParam& lp, const ShardMetadata& m, ProcessGroup* group) {
  const int world = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  TORCH_CHECK(m.mesh_size >= 1 && world % m.mesh_size == 0 && m.mesh_rank < m.mesh_size,
              "parameter '", lp.name, "' is sharded as rank ", m.mesh_rank, " of ", m.mesh_size,
              ", which does not fit a checkpoint group of ", world, " ranks (rank ", rank, ")",
              (group ? "; pass the group of every rank of the job"
                     : "; pass the process group the model is sharded over"));
  lp.global_shape = m.global_shape;
  lp.sharded = true;
  lp.offset = m.local_offset;
  lp.rows = m.local_rows;
  lp.padded_rows = m.padded_rows;
  if (m.shard_dim > 0) {
    lp.shard_dim = m.shard_dim;
    lp.dim_offset = m.local_offset;
    lp.dim_rows = m.local_rows;
    lp.dim_padded = m.padded_rows;
  }
}

// The row view of lp's global shape, and the checks that the local tensor is what its
// sharding says: checkpoints are taken between steps, while parameters are sharded.
void set_rows_and_check(LocalParam& lp) {
  lp.dim0 = lp.global_shape.empty() ? 1 : lp.global_shape[0];
  lp.row_numel = 1;
  for (size_t i = 1; i < lp.global_shape.size(); ++i) lp.row_numel *= lp.global_shape[i];
  if (!lp.sharded || lp.needs_whole()) {
    lp.offset = 0;
    lp.rows = lp.padded_rows = lp.dim0;
  }
  const int64_t local_numel = lp.local_numel();
  TORCH_CHECK(lp.param.numel() == local_numel, "parameter '", lp.name, "' has shape ",
              lp.param.sizes(), ", not its ", (lp.sharded ? "sharded" : "full"), " shape of ",
              local_numel,
              " elements: checkpoints are taken between steps, while parameters are sharded");
  TORCH_CHECK(lp.param.is_contiguous(), "parameter '", lp.name, "' is not contiguous");
}

// A parameter split by tensor parallelism ([Note: tensor-parallel slices in checkpoints]): its
// global shape is the full tensor's; FSDP's sharding (or none) is of the slice.
void set_tensor_parallel(LocalParam& lp, const TensorParallelPlacement& placement) {
  TORCH_CHECK(!lp.along_dim(), "checkpoint: parameter '", lp.name,
              "' is split by tensor parallelism and sharded along dim ", lp.shard_dim,
              " by fully_shard; checkpoints of that combination are not supported (shard dim 0)");
  LocalParam::TensorParallelSlice tp{&placement, placement.group->rank(), lp.global_shape};
  tp.offset = lp.sharded ? lp.offset : 0;
  tp.rows = lp.sharded ? lp.rows : tp.slice_shape[0];
  tp.padded = lp.sharded ? lp.padded_rows : tp.slice_shape[0];
  lp.global_shape = placement.global_shape;
  if (placement.dim == 0 && placement.packed == 1) {  // a row range of the global tensor
    lp.offset =
        tensor_parallel_range(placement.global_shape[0], placement.group->size(), tp.rank).begin +
        tp.offset;  // uneven splits too ([Note: an uneven vocabulary])
    lp.rows = tp.rows;
    lp.padded_rows = tp.padded;
    lp.sharded = true;
    return;
  }
  lp.tp = std::move(tp);
}

}  // namespace

std::vector<LocalParam> local_params(const torch::nn::Module& model, ProcessGroup* group) {
  std::unordered_map<const c10::TensorImpl*, ShardMetadata> sharded;
  for (const auto& unit : fsdp_modules_under(model)) {
    for (const auto& p : unit.sharded_parameters()) {
      sharded.emplace(p.local.unsafeGetTensorImpl(), p.metadata);
    }
  }
  std::vector<LocalParam> result;
  for (auto& [name, param] : unique_named_parameters(model)) {
    LocalParam lp;
    lp.name = name;
    lp.param = param;
    auto it = sharded.find(param.unsafeGetTensorImpl());
    if (it != sharded.end()) {
      set_sharding(lp, it->second, group);
    } else {
      lp.global_shape = param.sizes().vec();
    }
    if (const TensorParallelPlacement* tp = tensor_parallel_placement(param)) {
      set_tensor_parallel(lp, *tp);
    }
    set_rows_and_check(lp);
    result.push_back(std::move(lp));
  }
  return result;
}

std::vector<int64_t> gather_row_layouts(ProcessGroup* group,
                                        const std::vector<LocalParam>& locals) {
  std::vector<int64_t> mine;
  mine.reserve(3 * locals.size());
  for (const auto& lp : locals) {
    mine.insert(mine.end(), {lp.offset, lp.rows, lp.padded_rows});
  }
  if (group == nullptr || group->size() == 1 || mine.empty()) return mine;
  at::Tensor all = at::empty({group->size() * static_cast<int64_t>(mine.size())}, at::kLong);
  group
      ->all_gather_into_tensor(
          all, at::from_blob(mine.data(), {static_cast<int64_t>(mine.size())}, at::kLong))
      ->wait();
  return std::vector<int64_t>(all.const_data_ptr<int64_t>(),
                              all.const_data_ptr<int64_t>() + all.numel());
}

std::vector<std::vector<RowRange>> choose_writers(const std::vector<int64_t>& layouts,
                                                  const std::vector<LocalParam>& locals,
                                                  int world) {
  const size_t n = locals.size();
  TORCH_INTERNAL_ASSERT(layouts.size() == static_cast<size_t>(world) * n * 3);
  std::vector<std::vector<RowRange>> writers(n);
  for (size_t i = 0; i < n; ++i) {
    auto& chosen = writers[i];
    for (int r = 0; r < world; ++r) {
      const int64_t* l = layouts.data() + (static_cast<size_t>(r) * n + i) * 3;
      const RowRange range{r, l[0], l[1]};
      if (range.rows == 0) continue;
      bool replica = false;
      for (const auto& c : chosen) {
        if (c.offset == range.offset && c.rows == range.rows) {
          replica = true;
          break;
        }
        TORCH_CHECK(range.offset + range.rows <= c.offset || c.offset + c.rows <= range.offset,
                    "parameter '", locals[i].name, "': rank ", r, " holds rows [", range.offset,
                    ", ", range.offset + range.rows, ") and rank ", c.rank, " rows [", c.offset,
                    ", ", c.offset + c.rows, "), which overlap; the ranks disagree on its layout");
      }
      if (!replica) chosen.push_back(range);
    }
    std::sort(chosen.begin(), chosen.end(),
              [](const RowRange& a, const RowRange& b) { return a.offset < b.offset; });
    int64_t covered = 0;
    for (const auto& c : chosen) covered += c.rows;
    TORCH_CHECK(covered == locals[i].dim0, "parameter '", locals[i].name, "': the ranks hold ",
                covered, " of its ", locals[i].dim0, " rows");
  }
  return writers;
}

void agree(ProcessGroup* group, const std::exception_ptr& error, const std::string& what) {
  if (group == nullptr || group->size() == 1) {
    if (error) std::rethrow_exception(error);
    return;
  }
  constexpr int64_t kMessageBytes = 1024;
  const int world = group->size();
  at::Tensor mine = at::zeros({kMessageBytes}, at::kByte);
  if (error) {
    std::string message = error_message(error);
    if (message.empty()) message = "failed";
    message.resize(std::min<size_t>(message.size(), kMessageBytes - 1));
    std::memcpy(mine.data_ptr(), message.data(), message.size());
  }
  at::Tensor all = at::empty({world * kMessageBytes}, at::kByte);
  group->all_gather_into_tensor(all, mine)->wait();
  std::string failures;
  const auto* bytes = all.const_data_ptr<uint8_t>();
  for (int r = 0; r < world; ++r) {
    const char* m = reinterpret_cast<const char*>(bytes + r * kMessageBytes);
    if (m[0] == '\0') continue;
    failures += "\n  rank " + std::to_string(r) + ": " + std::string(m, strnlen(m, kMessageBytes));
  }
  if (failures.empty()) return;
  TORCH_CHECK(false, what, " failed on", failures);
}

std::string shape_string(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void check_save_options(const SaveOptions& options) {
  TORCH_CHECK(options.step() >= 0, "the step must be non-negative, got ", options.step());
  TORCH_CHECK(options.keep_last() >= 0, "keep_last must be non-negative, got ",
              options.keep_last());
  const auto user = nlohmann::json::parse(options.user_json(), nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(user.is_object(), "user_json must be a JSON object, got '",
              options.user_json().substr(0, 80), "'");
  // A state a scaler would refuse to load is refused now (the check names the value).
  if (options.grad_scaler()) ShardedGradScaler(std::nullopt).load_state(*options.grad_scaler());
}

void check_same_on_every_rank(ProcessGroup* group, int64_t count, uint64_t signature,
                              const std::string& what) {
  if (group == nullptr || group->size() <= 1) return;
  const int world = group->size();
  int64_t mine[2] = {count, 0};
  std::memcpy(&mine[1], &signature, sizeof(signature));
  at::Tensor all = at::empty({2 * world}, at::kLong);
  group->all_gather_into_tensor(all, at::from_blob(mine, {2}, at::kLong))->wait();
  const auto* v = all.const_data_ptr<int64_t>();
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK(v[2 * r] == mine[0] && v[2 * r + 1] == mine[1], what, " failed: rank ", r,
                " stores other parameters or optimizer states than rank ", group->rank(), " (",
                v[2 * r], " tensors against ", mine[0],
                "); every rank must save the same model and optimizer");
  }
}

}  // namespace fsdp::checkpoint::detail
