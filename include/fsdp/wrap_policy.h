// Auto-wrap policies: which modules of a tree become FSDP units, and fully_shard_tree, which
// shards them bottom-up and then the root (FSDP1's auto_wrap_policy, applied with FSDP2's
// fully_shard).
//
//   auto root = fsdp::fully_shard_tree(model, mesh, fsdp::module_type_wrap_policy(
//                                          {typeid(fsdp::models::BlockImpl)}));
//   auto root = fsdp::fully_shard_tree(model, mesh, fsdp::size_based_wrap_policy(
//                                          fsdp::SizeBasedWrapPolicyOptions(1'000'000)));
//
// A unit only works if the model calls it through fsdp::forward (LibTorch has no forward
// hooks), so a policy should pick modules the model calls that way; the example models
// (models/gpt2, models/llama) call every module with parameters through it.
//
// A module that shares a parameter with a module outside it (GPT-2's wte, tied to lm_head) is
// never made a unit, whatever the policy says: the shared tensor must live in the unit that
// encloses every module using it, so it stays with an enclosing unit (at worst the root). This
// is where we differ from FSDP1, which leaves that to the user.
#pragma once

#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <typeindex>
#include <vector>

namespace fsdp {

// Whether the module at path (relative to the tree's root, "h.0.mlp") becomes a unit, given
// unwrapped_params: how many parameter elements of its subtree (each tensor once) are not
// already in a unit chosen below it, i.e. the elements it would own as a unit.
using WrapPredicate = std::function<bool(const std::string& path, const torch::nn::Module& module,
                                         int64_t unwrapped_params)>;

// A policy: the predicate, and which modules' descendants are looked at (FSDP1's recurse=True
// call). Modules are visited in post-order (children before parents, in registration order),
// so unwrapped_params already excludes every unit chosen below.
struct WrapPolicy {
  // Whether a module becomes a unit. Required.
  TORCH_ARG(WrapPredicate, wrap) = nullptr;
  // Whether to look below a module at all, given its subtree's parameter elements not in units
  // sharded before the call (FSDP1's nonwrapped_numel); a module below which nothing is looked
  // at is a leaf for the policy. (optional) defaults to always.
  TORCH_ARG(WrapPredicate, recurse) = nullptr;
};

// FSDP's transformer_auto_wrap_policy / ModuleWrapPolicy: every module whose dynamic type is
// one of types becomes a unit, e.g. {typeid(fsdp::models::BlockImpl)} (the Impl class, which
// is also what Module::name() names). Types match exactly: unlike Python's isinstance, a
// subclass of a listed type does not match.
WrapPolicy module_type_wrap_policy(const std::vector<std::type_index>& types);

// FSDP1's size_based_auto_wrap_policy.
struct SizeBasedWrapPolicyOptions {
  /* implicit */ SizeBasedWrapPolicyOptions(int64_t min_num_params)  // NOLINT
      : min_num_params_(min_num_params) {}
  // A module becomes a unit when its unwrapped parameter elements reach this many. Must be at
  // least 1.
  TORCH_ARG(int64_t, min_num_params);
  // Modules never made units; their parameters count towards their parent. (optional)
  // defaults to FSDP1's: ModuleList and ModuleDict (containers, which have no forward).
  TORCH_ARG(std::vector<std::type_index>, exclude_wrap_modules) = default_exclude_wrap_modules();
  // Modules whose descendants are never units (they may be units themselves). (optional)
  // defaults to FSDP1's: MultiheadAttention.
  TORCH_ARG(std::vector<std::type_index>, force_leaf_modules) = default_force_leaf_modules();

 public:
  static std::vector<std::type_index> default_exclude_wrap_modules();
  static std::vector<std::type_index> default_force_leaf_modules();
};

// FSDP1's rule: looking only below modules whose subtree holds at least min_num_params
// elements (and that are not force_leaf_modules), a module becomes a unit when the elements not
// already in units below it reach min_num_params, unless it is one of exclude_wrap_modules.
// Throws if min_num_params < 1.
WrapPolicy size_based_wrap_policy(const SizeBasedWrapPolicyOptions& options);

// Any predicate, looked at on every module (FSDP1's lambda_auto_wrap_policy, with the path and
// the unwrapped count as well).
WrapPolicy predicate_wrap_policy(WrapPredicate predicate);

// One module the policy chose.
struct WrapUnit {
  std::string path;  // relative to the tree's root
  std::shared_ptr<torch::nn::Module> module;
  int64_t params = 0;  // parameter elements it owns as a unit (its unwrapped count)
};

// The modules policy makes units under root, in the order they are to be sharded (post-order:
// every unit after the units below it); root itself is not among them. Modules already
// sharded count as units and are not listed again. Does not change the model.
std::vector<WrapUnit> select_wrap_units(const torch::nn::Module& root, const WrapPolicy& policy);

struct FullyShardTreeOptions {
  // Options of every unit the policy chooses. (optional) defaults to FullyShardOptions().
  TORCH_ARG(FullyShardOptions, unit_options) = FullyShardOptions();
  // Options of the root. (optional) defaults to unit_options.
  TORCH_ARG(std::optional<FullyShardOptions>, root_options) = std::nullopt;
};

// Applies fully_shard to every module of select_wrap_units(*module, policy) (bottom-up), then
// to module itself, which always becomes a unit (FSDP1's auto-wrap wraps the root too). Returns
// the root's FSDPModule; fsdp_modules_under(*module) lists every unit. Collective: every rank
// must call it on the same model. Throws as fully_shard does, and if module is null.
FSDPModule fully_shard_tree(const std::shared_ptr<torch::nn::Module>& module,
                            const DeviceMesh& mesh, const WrapPolicy& policy,
                            const FullyShardTreeOptions& options = {});
template <typename ModuleType>
FSDPModule fully_shard_tree(const torch::nn::ModuleHolder<ModuleType>& module,
                            const DeviceMesh& mesh, const WrapPolicy& policy,
                            const FullyShardTreeOptions& options = {}) {
  return fully_shard_tree(std::static_pointer_cast<torch::nn::Module>(module.ptr()), mesh, policy,
                          options);
}

}  // namespace fsdp
