// Auto-wrap policies and fully_shard_tree.
//
// Selection is one post-order walk of the module tree. A parameter tensor is "claimed" once a
// unit owns it: a unit chosen earlier in the walk, or one sharded before the call. A module's
// unwrapped count is the elements of the distinct tensors of its subtree that nobody has
// claimed yet, which is exactly what fully_shard would give it, so the count the predicate sees
// and the unit fully_shard builds always agree. A module that registers a tensor also
// registered outside its subtree (a tied weight) is never chosen: a unit must enclose every
// user of its parameters, because only the module FSDP gathers sees full parameters.
#include <fsdp/wrap_policy.h>

#include "runtime/hooks.h"

#include <c10/util/Exception.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>

#include <algorithm>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace fsdp {

namespace {

// The child fully_shard registers on a unit to hold its state (runtime/hooks.cpp); it has no
// parameters and is never a candidate.
constexpr const char* kStateChildName = "_fsdp_state";

bool has_type(const torch::nn::Module& module, const std::vector<std::type_index>& types) {
  const std::type_index type(typeid(module));
  return std::find(types.begin(), types.end(), type) != types.end();
}

// How many times each tensor is registered in module's subtree (a tied tensor once per name).
std::unordered_map<const c10::TensorImpl*, int> registrations(const torch::nn::Module& module) {
  std::unordered_map<const c10::TensorImpl*, int> count;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    ++count[item.value().unsafeGetTensorImpl()];
  }
  return count;
}

class Selector {
 public:
  Selector(const torch::nn::Module& root, const WrapPolicy& policy)
      : policy_(policy), tree_registrations_(registrations(root)) {
    for (const auto& item : root.named_modules()) {
      if (detail::param_group_of(*item.value()) != nullptr) {
        for (const auto& p : item.value()->parameters(/*recurse=*/true)) {
          claimed_.insert(p.unsafeGetTensorImpl());
        }
      }
    }
  }

  std::vector<WrapUnit> select(const torch::nn::Module& root) {
    for (const auto& child : root.named_children()) {
      if (child.key() == kStateChildName) continue;
      visit(child.key(), child.value());
    }
    return std::move(units_);
  }

 private:
  // Elements of the distinct, unclaimed tensors of module's subtree.
  int64_t unclaimed_elements(const torch::nn::Module& module) const {
    std::unordered_set<const c10::TensorImpl*> seen;
    int64_t n = 0;
    for (const auto& p : module.parameters(/*recurse=*/true)) {
      const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
      if (claimed_.count(impl) == 0 && seen.insert(impl).second) n += p.numel();
    }
    return n;
  }

  // Whether a tensor of module's subtree is registered outside it too.
  bool shares_outside(const torch::nn::Module& module) const {
    for (const auto& [impl, count] : registrations(module)) {
      if (tree_registrations_.at(impl) != count) return true;
    }
    return false;
  }

  void visit(const std::string& path, const std::shared_ptr<torch::nn::Module>& module) {
    if (detail::param_group_of(*module) != nullptr) return;  // already a unit: claimed above
    const bool recurse =
        !policy_.recurse() || policy_.recurse()(path, *module, unclaimed_elements(*module));
    if (recurse) {
      for (const auto& child : module->named_children()) {
        if (child.key() == kStateChildName) continue;
        visit(path + "." + child.key(), child.value());
      }
    }
    const int64_t unwrapped = unclaimed_elements(*module);
    if (!policy_.wrap()(path, *module, unwrapped) || shares_outside(*module)) return;
    for (const auto& p : module->parameters(/*recurse=*/true)) {
      claimed_.insert(p.unsafeGetTensorImpl());
    }
    units_.push_back(WrapUnit{path, module, unwrapped});
  }

  const WrapPolicy& policy_;
  const std::unordered_map<const c10::TensorImpl*, int> tree_registrations_;
  std::unordered_set<const c10::TensorImpl*> claimed_;
  std::vector<WrapUnit> units_;
};

}  // namespace

std::vector<std::type_index> SizeBasedWrapPolicyOptions::default_exclude_wrap_modules() {
  return {typeid(torch::nn::ModuleListImpl), typeid(torch::nn::ModuleDictImpl)};
}

std::vector<std::type_index> SizeBasedWrapPolicyOptions::default_force_leaf_modules() {
  return {typeid(torch::nn::MultiheadAttentionImpl)};
}

WrapPolicy module_type_wrap_policy(const std::vector<std::type_index>& types) {
  return WrapPolicy().wrap([types](const std::string&, const torch::nn::Module& module, int64_t) {
    return has_type(module, types);
  });
}

WrapPolicy size_based_wrap_policy(const SizeBasedWrapPolicyOptions& options) {
  const int64_t min = options.min_num_params();
  TORCH_CHECK(min >= 1, "size_based_wrap_policy: min_num_params must be at least 1, got ", min);
  const auto exclude = options.exclude_wrap_modules();
  const auto leaves = options.force_leaf_modules();
  return WrapPolicy()
      .wrap([min, exclude](const std::string&, const torch::nn::Module& module, int64_t unwrapped) {
        return unwrapped >= min && !has_type(module, exclude);
      })
      .recurse([min, leaves](const std::string&, const torch::nn::Module& module, int64_t total) {
        return total >= min && !has_type(module, leaves);
      });
}

WrapPolicy predicate_wrap_policy(WrapPredicate predicate) {
  return WrapPolicy().wrap(std::move(predicate));
}

std::vector<WrapUnit> select_wrap_units(const torch::nn::Module& root, const WrapPolicy& policy) {
  TORCH_CHECK(policy.wrap() != nullptr, "select_wrap_units: the WrapPolicy has no wrap predicate");
  return Selector(root, policy).select(root);
}

FSDPModule fully_shard_tree(const std::shared_ptr<torch::nn::Module>& module,
                            const DeviceMesh& mesh, const WrapPolicy& policy,
                            const FullyShardTreeOptions& options) {
  TORCH_CHECK(module != nullptr, "fully_shard_tree: module is null");
  for (const WrapUnit& unit : select_wrap_units(*module, policy)) {
    fully_shard(unit.module, mesh, options.unit_options());
  }
  return fully_shard(module, mesh, options.root_options().value_or(options.unit_options()));
}

}  // namespace fsdp
