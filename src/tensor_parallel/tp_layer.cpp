// A parallelized layer's style and its parameters' placements; see tp_layer.h.
//
// [Note: placements by tensor identity]
// Gradient clipping needs to know which parameters tensor parallelism splits, given only the
// parameter tensors. parallelize_module records each split parameter's TensorImpl, which stays
// the parameter's for its life: its own slicing and FSDP's sharding both swap the data with
// set_data, keeping the impl. An entry also holds a weak reference to the impl, so an address
// reused by a later tensor is not mistaken for the dead parameter's, and dead entries are
// dropped when new ones are recorded.
#include "tensor_parallel/tp_layer.h"

#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace fsdp::detail {
namespace {

constexpr const char* kTpModuleName = "_fsdp_tp";

class TpLayerHolder : public torch::nn::Module {
 public:
  explicit TpLayerHolder(TpLayer l)
      : torch::nn::Module("TensorParallelStyle"), layer(std::move(l)) {}
  TpLayer layer;
};

struct PlacementEntry {
  c10::weak_intrusive_ptr<c10::TensorImpl> impl;
  TensorParallelPlacement placement;
};

struct PlacementRegistry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, PlacementEntry> entries;
};

PlacementRegistry& registry() {
  static PlacementRegistry* instance = new PlacementRegistry();  // never destroyed: see below
  // Leaked on purpose: parameters may outlive static destruction (a model held by a static).
  return *instance;
}

bool alive_as(const PlacementEntry& entry, const c10::TensorImpl* impl) {
  auto strong = entry.impl.lock();
  return strong && strong.get() == impl;
}

}  // namespace

const TpLayer* tp_layer_of(const torch::nn::Module& module) {
  for (const auto& child : module.named_children()) {
    if (child.key() == kTpModuleName) return &static_cast<TpLayerHolder&>(*child.value()).layer;
  }
  return nullptr;
}

TpLayer* tp_layer_of(torch::nn::Module& module) {
  return const_cast<TpLayer*>(tp_layer_of(static_cast<const torch::nn::Module&>(module)));
}

void attach_tp_layer(torch::nn::Module& module, TpLayer layer) {
  module.register_module(kTpModuleName, std::make_shared<TpLayerHolder>(std::move(layer)));
}

void record_placement(const at::Tensor& param, TensorParallelPlacement placement) {
  PlacementRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.entries.begin(); it != r.entries.end();) {
    it = alive_as(it->second, it->first) ? std::next(it) : r.entries.erase(it);
  }
  r.entries.insert_or_assign(
      param.unsafeGetTensorImpl(),
      PlacementEntry{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()),
                     std::move(placement)});
}

}  // namespace fsdp::detail

namespace fsdp {

const TensorParallelPlacement* tensor_parallel_placement(const at::Tensor& param) {
  detail::PlacementRegistry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.entries.find(param.unsafeGetTensorImpl());
  if (it == r.entries.end() || !detail::alive_as(it->second, it->first)) return nullptr;
  return &it->second.placement;
}

}  // namespace fsdp
