// The lookup from shards; see sharded_lookup.h.
//
// [Note: a lookup from shards]
// Rank s of a shard group of S holds rows [first, first + rows) of the table (its Shard(0)
// layout; under a whole-tensor placement the owner holds every row and the others none).
// Forward: the group all-gathers every rank's ids (padded to the longest with -1, which no rank
// holds), each rank looks up from its shard the ids it holds and zeros the others, and a
// reduce-scatter sums the S partial lookups, rank r receiving rank r's ids: each row is one
// rank's value plus zeros, so the sum is exact and equals at::embedding of the gathered table.
// Backward: the ids' gradients are all-gathered over the shard group and then across replicas,
// so each rank sees the tokens of every data-parallel rank; it sums the gradients of the tokens
// it holds into its rows (at::embedding_dense_backward, tokens in rank order, in the master
// dtype), divides by the unit's factor F as the unit's own reduction divides, and hands the
// result to the unit (see [Note: a lookup's gradient joins the unit's]). Replicas compute the
// same rows from the same tokens, so no all-reduce follows. The bytes moved scale with the
// tokens (about S x n x width a direction), not with the table: for GPT-2's 50,257 x 768 table
// and 2,048 tokens a rank at S = 2, 6.3 MB in place of the 77 MB that the table's all-gather and
// its reduce-scatter each move.
//
// [Note: a lookup's collectives on side groups]
// The lookup waits for each of its collectives at once, and the forward's first op (or the
// backward's last) cannot go on without them. On the shard group they would queue behind
// whatever the units issued before (FIFO: the root's gather and the gathers prefetched after it;
// in backward the last units' reduce-scatters): on a 1 Gbit/s link with --prefetch 4 that was
// 1.1-1.3 s a step of waiting for ids and rows of a few MB. So they run on the mesh's side groups
// (DeviceMesh::side_groups): the same ranks, a queue and connections of their own, sharing the
// link with the unit's collectives instead of waiting for them to finish.
//
// The function's only differentiable input is an empty anchor tensor, never the table: an edge
// to the table's AccumulateGrad would hold the unit's other gradient (the tied head's) back
// until this, the backward's last op, had run.
#include "runtime/sharded_lookup.h"

#include "runtime/param_group.h"

#include <fsdp/comm/process_group.h>
#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::detail {
namespace {

struct Site : torch::CustomClassHolder {
  std::shared_ptr<ParamGroup> owner;
  size_t index = 0;
  int64_t first = 0;     // the first global row this rank holds
  int64_t rows = 0;      // how many rows it holds
  int64_t chunk = 0;     // rows of its padded shard
  int64_t width = 0;     // the table's row width
  int64_t n = 0;         // this rank's ids
  int64_t n_max = 0;     // the shard group's longest ids
  at::Tensor group_ids;  // [S, n_max]: the shard group's ids, -1 padded
  std::vector<int64_t> out_shape;

  FSDPParam& param() const { return owner->params()[index]; }
  const DeviceMesh& mesh() const { return owner->mesh(); }
};

// Waits for the collective start() issues on group, counting the wait as the unit's exposed
// communication (its observer's, as UnitContext::wait_for counts the unit's own collectives);
// a failure names the parameter, the unit, the op and the rank in group.
void run_collective(const Site& site, ProcessGroup& group, const char* op, const char* what,
                    const std::function<WorkHandle()>& start) {
  const CollectiveLabel label("lookup " + site.param().name() + " of " + site.owner->label());
  const auto began = std::chrono::steady_clock::now();
  try {
    start()->wait();
    site.owner->context().observer().waited(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "fsdp: lookup from shards of parameter '", site.param().name(),
                "' of unit '", site.owner->label(), "': ", op, " of ", what, " on rank ",
                group.rank(), " of ", group.size(), " failed: ", error_message(e));
  }
}

// [n] on every rank of group -> [size, n], in rank order.
at::Tensor all_gathered(const Site& site, ProcessGroup& group, const at::Tensor& t,
                        const char* what) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape.insert(shape.begin(), group.size());
  at::Tensor out = at::empty(shape, t.options());
  const at::Tensor in = t.contiguous();
  run_collective(site, group, "all-gather", what,
                 [&] { return group.all_gather_into_tensor(out, in); });
  return out;
}

// The shard group's ids, -1 padded to the longest. One small all-gather first carries each
// rank's count and whether its ids are in range, so that every rank knows the sizes, and a bad
// id fails on every rank at once instead of leaving the others waiting.
void gather_group_ids(Site& site, const at::Tensor& ids, int64_t vocabulary) {
  ProcessGroup& group = *site.mesh().side_groups().shard;
  const at::Tensor flat = ids.reshape({-1});
  site.n = flat.numel();
  const bool in_range =
      site.n == 0 || (flat.min().item<int64_t>() >= 0 && flat.max().item<int64_t>() < vocabulary);
  const at::Tensor header = at::tensor({site.n, static_cast<int64_t>(in_range)}, at::kLong);
  const at::Tensor headers =
      all_gathered(site, group, header.to(ids.device()), "the ids' counts").cpu();
  site.n_max = 0;
  for (int r = 0; r < group.size(); ++r) {
    TORCH_CHECK(headers[r][1].item<int64_t>() == 1, "fsdp: lookup from shards of parameter '",
                site.param().name(), "' of unit '", site.owner->label(), "': rank ", r,
                " of the shard group looks up a token id outside [0, ", vocabulary, ")",
                r == group.rank()
                    ? " (this rank: ids from " + std::to_string(flat.min().item<int64_t>()) +
                          " to " + std::to_string(flat.max().item<int64_t>()) + ")"
                    : std::string());
    site.n_max = std::max(site.n_max, headers[r][0].item<int64_t>());
  }
  at::Tensor padded = at::full({site.n_max}, -1, ids.options());
  padded.narrow(0, 0, site.n).copy_(flat);
  site.group_ids =
      group.size() == 1 ? padded.unsqueeze(0) : all_gathered(site, group, padded, "the ids");
}

// Which of ids this rank holds, and their positions in its shard (0 for the others).
std::pair<at::Tensor, at::Tensor> held_positions(const Site& site, const at::Tensor& ids) {
  const at::Tensor held = (ids >= site.first).logical_and(ids < site.first + site.rows);
  return {held, (ids - site.first).masked_fill(held.logical_not(), 0)};
}

at::Tensor lookup(const Site& site) {
  const FSDPParam& p = site.param();
  const at::Tensor ids = site.group_ids.reshape({-1});
  at::Tensor partial;
  if (site.rows == 0) {
    partial = at::zeros({ids.numel(), site.width}, p.sharded().options().dtype(p.compute_dtype()));
  } else {
    const auto [held, positions] = held_positions(site, ids);
    // Rounded to the compute dtype row by row, as the gather of the cast shard would be.
    partial = at::embedding(p.sharded(), positions)
                  .to(p.compute_dtype())
                  .masked_fill(held.logical_not().unsqueeze(-1), 0);
  }
  ProcessGroup& group = *site.mesh().side_groups().shard;
  at::Tensor mine = partial;
  if (group.size() > 1) {
    mine = at::empty({site.n_max, site.width}, partial.options());
    run_collective(site, group, "reduce-scatter", "the looked-up rows",
                   [&] { return group.reduce_scatter_tensor(mine, partial, ReduceOp::kSum); });
  }
  return mine.narrow(0, 0, site.n).reshape(site.out_shape);
}

// See [Note: a lookup from shards]: this rank's rows of the table's gradient, summed over
// every data-parallel rank's tokens and divided by F, handed to the unit.
void reduce_lookup_gradient(const Site& site, const at::Tensor& grad) {
  const DeviceMesh& mesh = site.mesh();
  at::Tensor g = at::zeros({site.n_max, site.width}, grad.options());
  g.narrow(0, 0, site.n).copy_(grad.reshape({site.n, site.width}));
  at::Tensor ids = site.group_ids;  // [S, n_max]
  const DeviceMesh::SideGroups& side = mesh.side_groups();
  if (mesh.shard_size() > 1) g = all_gathered(site, *side.shard, g, "the rows' gradients");
  if (ProcessGroup* replicas = side.replicate.get()) {
    // Shard groups may pad to different lengths: pad to the longest across replicas first.
    const at::Tensor lengths = all_gathered(
        site, *replicas, at::tensor({site.n_max}, at::kLong).to(ids.device()), "the ids' counts");
    const int64_t longest = lengths.max().item<int64_t>();
    if (longest > site.n_max) {
      ids = at::constant_pad_nd(ids, {0, longest - site.n_max}, -1);
      g = at::constant_pad_nd(g.view({-1, site.n_max, site.width}), {0, 0, 0, longest - site.n_max},
                              0);
    }
    ids = all_gathered(site, *replicas, ids, "the ids across replicas");
    g = all_gathered(site, *replicas, g, "the rows' gradients across replicas");
  }
  const FSDPParam& p = site.param();
  const at::Tensor all_ids = ids.reshape({-1});
  const auto [held, positions] = held_positions(site, all_ids);
  const at::Tensor mine = held.nonzero().squeeze(1);
  at::Tensor rows = at::embedding_dense_backward(
      g.reshape({-1, site.width}).index_select(0, mine).to(p.sharded().scalar_type()),
      positions.index_select(0, mine), site.chunk, /*padding_idx=*/-1,
      /*scale_grad_by_freq=*/false);
  rows.div_(site.owner->gradient_divide_factor());
  site.owner->add_reduced_gradient(site.index, rows.to(p.sharded().device()));
}

const Site& site_of(const c10::IValue& capsule) {
  return *c10::static_intrusive_pointer_cast<Site>(capsule.toCapsule());
}

struct LookupFromShards : torch::autograd::Function<LookupFromShards> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& /*anchor*/,
                            const c10::IValue& site) {
    ctx->saved_data["site"] = site;
    return lookup(site_of(site));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    reduce_lookup_gradient(site_of(ctx->saved_data["site"]), grads[0]);
    return {at::Tensor(), at::Tensor()};
  }
};

// The site of table's lookup, checked; null when table is no sharded unit's parameter or its
// unit is gathered for its own forward now.
c10::intrusive_ptr<Site> site_for(const at::Tensor& table) {
  size_t index = 0;
  std::shared_ptr<ParamGroup> owner = ParamGroup::owner_of(table, &index);
  if (!owner || owner->training_state() == TrainingState::kForward) return nullptr;
  auto site = c10::make_intrusive<Site>();
  site->owner = std::move(owner);
  site->index = index;
  const FSDPParam& p = site->param();
  const DimShardLayout& layout = p.layout();
  TORCH_CHECK(p.global_shape().size() == 2 && layout.dim == 0, "fsdp: parameter '", p.name(),
              "' of unit '", site->owner->label(),
              "' is looked up as a table outside its unit's "
              "forward, which reads rows from Shard(0) shards of a 2-D table; it has shape ",
              c10::IntArrayRef(p.global_shape()), " sharded along dim ", layout.dim);
  TORCH_CHECK(!site->owner->offloads_to_host(), "fsdp: parameter '", p.name(), "' of unit '",
              site->owner->label(),
              "' is looked up as a table outside its unit's forward, but "
              "the unit offloads its shards to the host of a ",
              site->mesh().device(),
              " mesh; a lookup from shards reads them where the mesh computes");
  site->first = layout.local_offset;
  site->rows = layout.local_rows;
  site->chunk = layout.chunk_rows;
  site->width = p.global_shape()[1];
  return site;
}

}  // namespace

std::optional<at::Tensor> lookup_from_shards(const at::Tensor& table, const at::Tensor& ids) {
  c10::intrusive_ptr<Site> site = site_for(table);
  if (!site) return std::nullopt;
  TORCH_CHECK(ids.scalar_type() == at::kLong, "fsdp: a lookup of parameter '", site->param().name(),
              "' needs int64 ids, got ", ids.scalar_type());
  gather_group_ids(*site, ids, site->param().global_shape()[0]);
  site->out_shape = ids.sizes().vec();
  site->out_shape.push_back(site->width);
  if (!at::GradMode::is_enabled() || !table.requires_grad()) return lookup(*site);
  const at::Tensor anchor =
      at::empty({0}, site->param().sharded().options().dtype(at::kFloat)).requires_grad_(true);
  return LookupFromShards::apply(anchor, c10::IValue::make_capsule(std::move(site)));
}

}  // namespace fsdp::detail
