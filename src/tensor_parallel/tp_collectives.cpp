// Tensor parallelism's autograd functions; see tp_collectives.h.
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

#include <exception>

namespace fsdp::detail {
namespace {

struct SiteHolder : torch::CustomClassHolder {
  explicit SiteHolder(TpSite s) : site(std::move(s)) {}
  TpSite site;
};

at::Tensor all_reduced(const at::Tensor& t, const TpSite& site, const char* what) {
  at::Tensor out = t.contiguous().clone();
  const CollectiveLabel label("tp " + site.layer);
  try {
    site.group->all_reduce(out, ReduceOp::kSum)->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "fsdp: tensor-parallel all-reduce of ", what, " of layer '", site.layer,
                "' over mesh dimension '", site.dim_name, "' on rank ", site.group->rank(), " of ",
                site.group->size(), " failed: ", error_message(e));
  }
  return out;
}

const TpSite& site_of(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<SiteHolder>(ctx->saved_data["site"].toCapsule())->site;
}

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

c10::IValue capsule(const TpSite& site) {
  return c10::IValue::make_capsule(c10::make_intrusive<SiteHolder>(site));
}

}  // namespace

at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const TpSite& site) {
  return CopyToTensorParallel::apply(x, capsule(site));
}

at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const TpSite& site) {
  return ReduceFromTensorParallel::apply(x, capsule(site));
}

}  // namespace fsdp::detail
