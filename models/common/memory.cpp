// See memory.h: the units of a model's identical layers, split by tensor parallelism or not.
#include <models/common/memory.h>

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

namespace fsdp::models {
namespace {

// The plan's style for the module that holds the layer parameter called local
// ("mlp.c_fc.weight": "mlp.c_fc"), or null when the plan does not split it.
const ParallelStyle* style_of(const TensorParallelPlan& plan, const std::string& local) {
  const std::string module = local.substr(0, local.rfind('.'));
  for (const auto& [path, style] : plan) {
    if (path == module) return &style;
  }
  return nullptr;
}

}  // namespace

std::vector<std::vector<int64_t>> split_layer_shapes(const ParamTable& params,
                                                     const LayerSplit& split) {
  std::vector<std::vector<int64_t>> shapes;
  for (const ParamSpec& p : params.layer) {
    std::vector<int64_t> shape = p.shape;
    const ParallelStyle* style = split.tp > 1 ? style_of(split.plan, p.name) : nullptr;
    if (style && style->kind() == ParallelStyle::Kind::kReplicate) style = nullptr;  // whole
    const bool colwise = style && style->kind() == ParallelStyle::Kind::kColwise;
    const bool is_weight =
        p.name.size() >= 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
    const size_t dim = colwise ? 0 : 1;  // a row layer's bias (dim 0 only) stays whole
    if (style && (colwise || is_weight) && dim < shape.size()) {
      TORCH_CHECK(shape[dim] % split.tp == 0, params.model, ": layer parameter '", p.name,
                  "' of shape ", c10::IntArrayRef(p.shape), " does not split over ", split.tp,
                  " tensor-parallel ranks");
      shape[dim] /= split.tp;
    }
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

std::vector<UnitMemorySpec> layer_units(const ParamTable& params, const std::string& name_prefix,
                                        const LayerMemory& layer, const LayerSplit& split) {
  int64_t forward = 0, backward = 0;
  for (const auto& [path, style] : split.tp > 1 ? split.plan : TensorParallelPlan{}) {
    if (style.kind() == ParallelStyle::Kind::kRowwise) forward += split.activation_bytes;
    if (style.kind() == ParallelStyle::Kind::kColwise) backward += split.activation_bytes;
    if (style.kind() != ParallelStyle::Kind::kReplicate) continue;
    for (const ParamSpec& p : params.layer) {  // the module's parameters' gradients
      if (p.name.rfind(path + ".", 0) == 0) {
        backward += c10::multiply_integers(p.shape) * split.element_size;
      }
    }
  }
  if (split.recomputed) backward += forward;
  const std::vector<std::vector<int64_t>> shapes = split_layer_shapes(params, split);
  std::vector<UnitMemorySpec> units(static_cast<size_t>(params.n_layers));
  for (size_t i = 0; i < units.size(); ++i) {
    units[i].name = name_prefix + std::to_string(i);
    units[i].param_shapes = shapes;
    units[i].saved_bytes = layer.saved_bytes;
    units[i].forward_workspace_bytes = layer.forward_workspace_bytes;
    units[i].backward_peak_bytes = layer.backward_peak_bytes;
    units[i].tp_forward_all_reduce_bytes = forward;
    units[i].tp_backward_all_reduce_bytes = backward;
  }
  return units;
}

}  // namespace fsdp::models
