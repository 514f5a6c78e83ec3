// Tensor parallelism's autograd functions; see tp_collectives.h.
//
// A sequence gather stacks the ranks' shards [batch, shard, ...] as [n, batch, shard, ...] (what
// all_gather_into_tensor writes) and moves the rank dimension next to the shard's; the
// reduce-scatter makes the inverse move before it sends, so rank r receives positions r*shard..
//
// The site (group and names) rides in AutogradContext::saved_data as a capsule, so a graph
// dropped without a backward frees it. Each all-reduce runs on a contiguous copy: the forward's
// input may be a view autograd saved, and the backward's gradient may be shared with other
// consumers, so neither is summed in place.
#include "tensor_parallel/tp_collectives.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <chrono>
#include <exception>
#include <functional>
#include <vector>

namespace fsdp::detail {
namespace {

struct SiteHolder : torch::CustomClassHolder {
  explicit SiteHolder(TpSite s) : site(std::move(s)) {}
  TpSite site;
};

}  // namespace

void run_checked(const TpSite& site, const char* op, const char* what,
                 const std::function<WorkHandle()>& start) {
  const CollectiveLabel label("tp " + site.layer);
  const auto began = std::chrono::steady_clock::now();
  try {
    start()->wait();
    site.group->add_waited(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "fsdp: tensor-parallel ", op, " of ", what, " of layer '", site.layer,
                "' over mesh dimension '", site.dim_name, "' on rank ", site.group->rank(), " of ",
                site.group->size(), " failed: ", error_message(e));
  }
}

namespace {

at::Tensor all_reduced(const at::Tensor& t, const TpSite& site, const char* what) {
  at::Tensor out = t.contiguous().clone();
  run_checked(site, "all-reduce", what,
              [&] { return site.group->all_reduce(out, ReduceOp::kSum); });
  return out;
}

// The length of one rank's sequence shard of x [batch, seq, ...], the whole sequence.
int64_t shard_length(const at::Tensor& x, const TpSite& site) {
  const int n = site.group->size();
  TORCH_CHECK(x.dim() >= 2 && x.size(1) % n == 0, "fsdp: sequence parallelism at layer '",
              site.layer, "' over mesh dimension '", site.dim_name,
              "' splits an activation of shape ", x.sizes(),
              " along its sequence (dimension 1), which must divide by the group's size ", n);
  return x.size(1) / n;
}

// Rank r's shard of every rank's x [batch, shard, ...], in rank order along dimension 1.
at::Tensor all_gathered(const at::Tensor& x, const TpSite& site, const char* what) {
  const at::Tensor in = x.contiguous();
  std::vector<int64_t> stacked = in.sizes().vec(), whole = in.sizes().vec();
  stacked.insert(stacked.begin(), site.group->size());  // [n, batch, shard, ...]
  whole[1] *= site.group->size();
  at::Tensor out = at::empty(stacked, in.options());
  run_checked(site, "all-gather", what,
              [&] { return site.group->all_gather_into_tensor(out, in); });
  return out.movedim(0, 1).reshape(whole);
}

// This rank's sequence shard of x [batch, seq, ...] summed over the group.
at::Tensor reduce_scattered(const at::Tensor& x, const TpSite& site, const char* what) {
  const int64_t shard = shard_length(x, site);
  std::vector<int64_t> blocks = x.sizes().vec(), mine = x.sizes().vec();
  blocks[1] = shard;
  blocks.insert(blocks.begin() + 1, site.group->size());  // [batch, n, shard, ...]
  mine[1] = shard;
  const at::Tensor in = x.reshape(blocks).movedim(1, 0).contiguous();  // rank r's part r-th
  at::Tensor out = at::empty(mine, x.options());
  run_checked(site, "reduce-scatter", what,
              [&] { return site.group->reduce_scatter_tensor(out, in, ReduceOp::kSum); });
  return out;
}

// This rank's sequence shard of x, in a tensor of its own (x's bytes are not kept alive).
at::Tensor own_shard(const at::Tensor& x, const TpSite& site) {
  const int64_t shard = shard_length(x, site);
  return x.narrow(1, site.group->rank() * shard, shard).clone(at::MemoryFormat::Contiguous);
}

}  // namespace

const TpSite& site_of(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<SiteHolder>(ctx->saved_data["site"].toCapsule())->site;
}

c10::IValue site_capsule(const TpSite& site) {
  return c10::IValue::make_capsule(c10::make_intrusive<SiteHolder>(site));
}

namespace {

struct CopyToTensorParallel : torch::autograd::Function<CopyToTensorParallel> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::IValue& site) {
    ctx->saved_data["site"] = site;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {all_reduced(grads[0], site_of(ctx), "the input's gradient"), at::Tensor()};
  }
};

struct ReduceFromTensorParallel : torch::autograd::Function<ReduceFromTensorParallel> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::IValue& site) {
    return all_reduced(x, c10::static_intrusive_pointer_cast<SiteHolder>(site.toCapsule())->site,
                       "the partial outputs");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::IValue& site, bool partial) {
    ctx->saved_data["site"] = site;
    ctx->saved_data["partial"] = partial;
    return all_gathered(x, site_of(ctx), "the input's sequence shards");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const TpSite& site = site_of(ctx);
    at::Tensor grad = ctx->saved_data["partial"].toBool()
                          ? reduce_scattered(grads[0], site, "the input's gradient")
                          : own_shard(grads[0], site);
    return {grad, at::Tensor(), at::Tensor()};
  }
};

struct ScatterSequence : torch::autograd::Function<ScatterSequence> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::IValue& site) {
    ctx->saved_data["site"] = site;
    return own_shard(x, site_of(ctx));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {all_gathered(grads[0], site_of(ctx), "the gradient's sequence shards"), at::Tensor()};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::IValue& site) {
    ctx->saved_data["site"] = site;
    return reduce_scattered(x, site_of(ctx), "the partial outputs");
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {all_gathered(grads[0], site_of(ctx), "the gradient's sequence shards"), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const TpSite& site) {
  return CopyToTensorParallel::apply(x, site_capsule(site));
}

at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const TpSite& site) {
  return ReduceFromTensorParallel::apply(x, site_capsule(site));
}

at::Tensor gather_sequence(const at::Tensor& x, const TpSite& site, GradientKind gradient) {
  return GatherSequence::apply(x, site_capsule(site), gradient == GradientKind::kPartial);
}

at::Tensor scatter_sequence(const at::Tensor& x, const TpSite& site) {
  return ScatterSequence::apply(x, site_capsule(site));
}

at::Tensor reduce_scatter_sequence(const at::Tensor& x, const TpSite& site) {
  return ReduceScatterSequence::apply(x, site_capsule(site));
}

}  // namespace fsdp::detail
