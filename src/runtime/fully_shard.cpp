// fully_shard and the FSDPModule handle.
//
// fully_shard decides which parameters a unit manages: those registered at or under the module
// that no already-sharded descendant manages, each tensor once (tied parameters are one
// tensor registered under several names). The choice is made here, once; the runtime never
// re-discovers parameters.
#include <fsdp/fully_shard.h>

#include "runtime/param_group.h"

#include <fsdp/runtime/whole_tensor.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <unordered_set>

namespace fsdp {

using detail::FSDPParam;
using detail::ParamGroup;

std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(
    const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> result;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      result.emplace_back(item.key(), item.value());
    }
  }
  return result;
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> result;
  for (auto& item : unique_named_parameters(module)) result.push_back(std::move(item.second));
  return result;
}

namespace {

// The dtypes our collectives move on every backend (gloo reduces bf16 and fp16 through fp32).
bool communicable(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

void check_policy(const MixedPrecisionPolicy& mp, const DeviceMesh& mesh) {
  const auto check = [&](const char* field, const std::optional<at::ScalarType>& dtype) {
    TORCH_CHECK(!dtype.has_value() || communicable(*dtype), "fully_shard: MixedPrecisionPolicy.",
                field, " is ", *dtype, ", which the ", mesh.shard_group().backend_name(),
                " backend cannot all-gather and reduce; use Float, BFloat16, Half or Double");
  };
  check("param_dtype", mp.param_dtype());
  check("reduce_dtype", mp.reduce_dtype());
  TORCH_CHECK(!mp.output_dtype().has_value() || at::isFloatingType(*mp.output_dtype()),
              "fully_shard: MixedPrecisionPolicy.output_dtype must be a floating-point dtype, got ",
              *mp.output_dtype());
  TORCH_CHECK(!mp.buffer_dtype().has_value() || at::isFloatingType(*mp.buffer_dtype()),
              "fully_shard: MixedPrecisionPolicy.buffer_dtype must be a floating-point dtype, got ",
              *mp.buffer_dtype());
}

// The buffers of module and of its submodules that no sharded descendant holds.
void collect_unit_buffers(torch::nn::Module& module, std::vector<at::Tensor>& buffers) {
  for (auto& buffer : module.buffers(/*recurse=*/false)) buffers.push_back(buffer);
  for (const auto& child : module.children()) {
    if (detail::param_group_of(*child) == nullptr) collect_unit_buffers(*child, buffers);
  }
}

// MixedPrecisionPolicy.buffer_dtype: floating-point buffers take it in place (set_data keeps
// each buffer the module's own tensor); integer and bool buffers keep theirs, as in FSDP1.
void cast_unit_buffers(torch::nn::Module& module, const MixedPrecisionPolicy& mp) {
  if (!mp.buffer_dtype().has_value()) return;
  std::vector<at::Tensor> buffers;
  collect_unit_buffers(module, buffers);
  at::NoGradGuard no_grad;
  for (auto& buffer : buffers) {
    if (buffer.defined() && buffer.is_floating_point() &&
        buffer.scalar_type() != *mp.buffer_dtype()) {
      buffer.set_data(buffer.to(*mp.buffer_dtype()));
    }
  }
}

// A whole-tensor placement needs a 1-D mesh (no replicas to all-reduce across) and a bool
// reshard_after_forward (hpZ's pieces are rows of every rank's shard).
void check_whole_tensor(const FullyShardOptions& options, const DeviceMesh& mesh,
                        const torch::nn::Module& module) {
  if (!options.whole_tensor()) return;
  TORCH_CHECK(!options.shard_placement_fn(), "fully_shard: module '", module.name(),
              "' has both a whole-tensor placement and a shard_placement_fn; whole tensors are "
              "not split along any dim, so pass only one of the two");
  TORCH_CHECK(mesh.ndim() == 1, "fully_shard: module '", module.name(),
              "' has a whole-tensor placement but the mesh is 2-D (", mesh.replicate_size(), " x ",
              mesh.shard_size(),
              "); inter-tensor ZeRO-3 owns each tensor on one rank of a 1-D mesh");
  const auto& reshard = options.reshard_after_forward();
  const int w = mesh.shard_size();
  TORCH_CHECK(!reshard.has_value() || reshard->group_size(w) == 1 || reshard->group_size(w) == w,
              "fully_shard: module '", module.name(),
              "' has a whole-tensor placement, whose "
              "tensors are broadcast whole, so reshard_after_forward must be true or false, not "
              "the group size ",
              reshard->group_size(w));
  // The owners' broadcasts read the shards where they live; offloaded shards on the host would
  // need the copy-in that only Shard(0)'s gather has.
  TORCH_CHECK(!options.offload_policy().has_value() || mesh.device().is_cpu(),
              "fully_shard: module '", module.name(),
              "' has a whole-tensor placement and a CPUOffloadPolicy on a ", mesh.device(),
              " mesh; inter-tensor ZeRO-3 does not offload (drop one of the two)");
}

// The dim shard_placement_fn picks for a parameter, normalised into [0, ndim); 0 without one,
// for nullopt, and for a 0-D parameter's 0 or -1 (it is sharded as a 1-element vector).
int64_t shard_dim_of(const std::string& name, const at::Tensor& tensor,
                     const FullyShardOptions& options, const torch::nn::Module& module) {
  if (!options.shard_placement_fn()) return 0;
  const std::optional<int64_t> picked = options.shard_placement_fn()(name, tensor);
  if (!picked.has_value()) return 0;
  const int64_t ndim = std::max<int64_t>(tensor.dim(), 1);
  const int64_t dim = *picked < 0 ? *picked + ndim : *picked;
  TORCH_CHECK(dim >= 0 && dim < ndim, "fully_shard: shard_placement_fn gives Shard(", *picked,
              ") for parameter '", name, "' of module '", module.name(), "' with shape ",
              tensor.sizes(), ", but its dims are [", -ndim, ", ", ndim, ")");
  return dim;
}

// The parameter's layout under options: Shard(d), or whole on the owner the placement names.
FSDPParam make_param(const std::string& name, const at::Tensor& tensor, const DeviceMesh& mesh,
                     const FullyShardOptions& options, const torch::nn::Module& module) {
  const at::ScalarType compute = options.mp_policy().param_dtype().value_or(tensor.scalar_type());
  if (!options.whole_tensor()) {
    return FSDPParam(name, tensor, mesh.shard_rank(), mesh.shard_size(), compute,
                     shard_dim_of(name, tensor, options, module));
  }
  const int owner = options.whole_tensor()->owner_of(tensor);
  TORCH_CHECK(owner >= 0 && owner < mesh.shard_size(), "fully_shard: parameter '", name,
              "' of module '", module.name(), "' ",
              owner < 0 ? std::string("has no owner in the whole-tensor placement")
                        : "is placed on rank " + std::to_string(owner) + ", outside the mesh's " +
                              std::to_string(mesh.shard_size()) + " ranks");
  return FSDPParam(name, tensor, whole_tensor_layout(tensor.sizes(), owner == mesh.shard_rank()),
                   compute);
}

// FullyShardOptions::ignored_params, each checked to be a parameter of module (FSDP2 skips one
// that is not silently; a typo would then shard what the caller meant to keep whole).
std::unordered_set<const c10::TensorImpl*> ignored_parameters(const torch::nn::Module& module,
                                                              const FullyShardOptions& options) {
  std::unordered_set<const c10::TensorImpl*> in_module;
  for (const auto& item : unique_named_parameters(module)) {
    in_module.insert(item.second.unsafeGetTensorImpl());
  }
  std::unordered_set<const c10::TensorImpl*> ignored;
  const auto& tensors = options.ignored_params();
  for (size_t i = 0; i < tensors.size(); ++i) {
    TORCH_CHECK(tensors[i].defined(), "fully_shard: ignored_params[", i, "] of module '",
                module.name(), "' is an undefined tensor");
    TORCH_CHECK(in_module.count(tensors[i].unsafeGetTensorImpl()) != 0,
                "fully_shard: ignored_params[", i, "] (shape ", tensors[i].sizes(), ", ",
                tensors[i].scalar_type(), ") is not a parameter of module '", module.name(),
                "' or of its submodules");
    ignored.insert(tensors[i].unsafeGetTensorImpl());
  }
  return ignored;
}

// The parameters the unit of module manages, in registration order: those neither a nested
// unit manages or ignores nor this unit ignores, each checked and given its layout.
std::vector<FSDPParam> unit_params(const torch::nn::Module& module, const DeviceMesh& mesh,
                                   const FullyShardOptions& options) {
  // Parameters a nested unit manages or ignores, and those this unit ignores, stay out.
  std::unordered_set<const c10::TensorImpl*> claimed = ignored_parameters(module, options);
  for (const auto& item : module.named_modules()) {
    if (item.key().empty()) continue;
    if (ParamGroup* group = detail::param_group_of(*item.value())) {
      for (const auto& p : group->params()) claimed.insert(p.param().unsafeGetTensorImpl());
      for (const auto& t : group->ignored_params()) claimed.insert(t.unsafeGetTensorImpl());
    }
  }

  std::vector<FSDPParam> params;
  for (auto& [name, tensor] : unique_named_parameters(module)) {
    if (claimed.count(tensor.unsafeGetTensorImpl()) != 0) continue;
    TORCH_CHECK(tensor.device() == mesh.device(), "fully_shard: parameter '", name, "' of module '",
                module.name(), "' is on ", tensor.device(), " but the mesh communicates on ",
                mesh.device(), "; move the module to the mesh's device before sharding it");
    TORCH_CHECK(tensor.is_floating_point(), "fully_shard: parameter '", name, "' has dtype ",
                tensor.scalar_type(), "; only floating-point parameters can be sharded");
    if (!params.empty()) {
      TORCH_CHECK(tensor.scalar_type() == params.front().param().scalar_type(),
                  "fully_shard: parameters of one unit must share a dtype, but '",
                  params.front().name(), "' is ", params.front().param().scalar_type(), " and '",
                  name, "' is ", tensor.scalar_type());
    }
    params.push_back(make_param(name, tensor, mesh, options, module));
  }

  return params;
}

// Checks reshard_after_forward's group size against the mesh: only an int can fail (true and
// false give W and 1).
void check_reshard_after_forward(const FullyShardOptions& options, const DeviceMesh& mesh,
                                 const torch::nn::Module& module) {
  const auto& reshard = options.reshard_after_forward();
  if (!reshard) return;
  const int w = mesh.shard_size();
  const int size = reshard->group_size(w);
  TORCH_CHECK(size >= 1 && w % size == 0, "fully_shard: reshard_after_forward=", size,
              " (an int: how many ranks to reshard to after forward) does not divide the shard "
              "group of ",
              w, " ranks of module '", module.name(), "'; give a divisor of ", w, " (", w,
              " acts as true, 1 as false)");
}

}  // namespace

FSDPModule fully_shard(const std::shared_ptr<torch::nn::Module>& module, const DeviceMesh& mesh,
                       const FullyShardOptions& options) {
  TORCH_CHECK(module != nullptr, "fully_shard: module is null");
  TORCH_CHECK(detail::param_group_of(*module) == nullptr, "fully_shard: module '", module->name(),
              "' is already sharded; fully_shard must be applied once per module");

  check_policy(options.mp_policy(), mesh);
  if (options.offload_policy().has_value() && options.offload_policy()->pin_memory() &&
      mesh.device().is_cpu()) {
    // FSDP2's default is true, and a CPU mesh has no device to copy to: accept, say why it is
    // ignored.
    TORCH_WARN("fully_shard: CPUOffloadPolicy.pin_memory is ignored on a ", mesh.device(),
               " mesh: the state is in host memory already and nothing is copied to a "
               "device; pass CPUOffloadPolicy().pin_memory(false) to silence this");
  }
  check_whole_tensor(options, mesh, *module);
  check_reshard_after_forward(options, mesh, *module);

  std::vector<FSDPParam> params = unit_params(*module, mesh, options);
  cast_unit_buffers(*module, options.mp_policy());
  auto group = std::make_shared<ParamGroup>(module.get(), std::move(params), mesh, options);
  detail::attach_param_group(*module, group);
  // Name every unit by its path under this module; an enclosing fully_shard renames them.
  for (const auto& item : module->named_modules()) {
    if (ParamGroup* unit = detail::param_group_of(*item.value())) {
      unit->set_path(item.key(), unit == group.get());
    }
  }
  return FSDPModule(group);
}

std::optional<FSDPModule> fsdp_module_of(const torch::nn::Module& module) {
  ParamGroup* group = detail::param_group_of(module);
  if (group == nullptr) return std::nullopt;
  return FSDPModule(group->shared_from_this());
}

std::vector<FSDPModule> fsdp_modules_under(const torch::nn::Module& module) {
  std::vector<FSDPModule> result;
  if (auto self = fsdp_module_of(module)) result.push_back(*self);
  for (const auto& child : module.modules(/*include_self=*/false)) {
    if (auto unit = fsdp_module_of(*child)) result.push_back(*unit);
  }
  return result;
}

std::vector<ShardedParameter> FSDPModule::sharded_parameters() const {
  std::vector<ShardedParameter> result;
  const DeviceMesh& mesh = group_->mesh();
  for (const auto& p : group_->params()) {
    result.push_back({p.name(), p.param(), p.metadata(mesh.shard_rank(), mesh.shard_size())});
  }
  return result;
}

int64_t FSDPModule::sharded_param_bytes() const { return group_->flat_shards().nbytes(); }

const std::string& FSDPModule::path() const { return group_->path(); }

void UnshardHandle::wait() { group_->wait_unshard(); }

UnshardHandle FSDPModule::unshard(bool async_op) {
  if (async_op) {
    group_->issue_unshard();
  } else {
    group_->wait_unshard();
  }
  return UnshardHandle(group_);
}

void FSDPModule::reshard() { group_->reshard(); }
bool FSDPModule::is_unsharded() const { return group_->is_unsharded(); }
bool FSDPModule::gather_in_flight() const { return group_->gather_in_flight(); }

std::vector<ParamGroup*> FSDPModule::groups_of(const std::vector<FSDPModule>& modules) {
  std::vector<ParamGroup*> groups;
  for (const auto& m : modules) groups.push_back(m.group_.get());
  return groups;
}

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  group_->set_forward_prefetch(groups_of(modules));
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  group_->set_backward_prefetch(groups_of(modules));
}

void FSDPModule::set_implicit_prefetch(int units) { group_->set_implicit_prefetch(units); }

namespace {
template <typename Fn>
void for_units(ParamGroup& group, bool recurse, Fn&& fn) {
  if (!recurse) {
    fn(group);
    return;
  }
  for (ParamGroup* unit : group.units_under()) fn(*unit);
}
}  // namespace

void FSDPModule::set_requires_gradient_sync(bool sync, bool recurse) {
  for_units(*group_, recurse, [&](ParamGroup& g) { g.set_requires_gradient_sync(sync); });
}
void FSDPModule::set_reshard_after_backward(bool reshard, bool recurse) {
  for_units(*group_, recurse, [&](ParamGroup& g) { g.set_reshard_after_backward(reshard); });
}
void FSDPModule::set_reshard_after_forward(bool reshard, bool recurse) {
  for_units(*group_, recurse, [&](ParamGroup& g) { g.set_reshard_after_forward(reshard); });
}
void FSDPModule::set_is_last_backward(bool last) { group_->set_is_last_backward(last); }
void FSDPModule::set_custom_all_gather(std::shared_ptr<AllGather> hook) {
  group_->set_custom_all_gather(std::move(hook));
}
void FSDPModule::set_custom_reduce_scatter(std::shared_ptr<ReduceScatter> hook) {
  group_->set_custom_reduce_scatter(std::move(hook));
}
void FSDPModule::set_unshard_in_backward(bool unshard) { group_->set_unshard_in_backward(unshard); }
void FSDPModule::set_requires_all_reduce(bool all_reduce, bool recurse) {
  for_units(*group_, recurse, [&](ParamGroup& g) { g.set_requires_all_reduce(all_reduce); });
}
void FSDPModule::set_gradient_divide_factor(double factor) {
  group_->set_gradient_divide_factor(factor);
}
void FSDPModule::set_force_sum_reduction_for_comms(bool enable) {
  group_->set_force_sum_reduction_for_comms(enable);
}
void FSDPModule::set_all_reduce_hook(std::function<void(at::Tensor&)> hook) {
  group_->set_all_reduce_hook(std::move(hook));
}
void FSDPModule::set_observer(std::shared_ptr<RuntimeObserver> observer) {
  group_->set_observer(std::move(observer));
}

const std::shared_ptr<RuntimeObserver>& FSDPModule::observer() const { return group_->observer(); }

}  // namespace fsdp
