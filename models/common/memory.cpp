// See memory.h: the units of a model's identical layers, split by tensor parallelism or not.
#include <models/common/memory.h>

#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>

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

// Whether the module at path is under a module whose input the plan gathers from sequence shards
// (with column layers: [Note: one gradient sum for a gathered input]).
bool under_sequence_gather(const TensorParallelPlan& plan, const std::string& path) {
  for (const auto& [outer, style] : plan) {
    if (style.kind() == ParallelStyle::Kind::kPrepareInput &&
        style.from() == Layout::kSequenceShard && style.to() == Layout::kReplicate &&
        path.rfind(outer + ".", 0) == 0)
      return true;
  }
  return false;
}

bool holds_column_layers(const TensorParallelPlan& plan, const std::string& path) {
  for (const auto& [inner, style] : plan) {
    if (style.kind() == ParallelStyle::Kind::kColwise && inner.rfind(path + ".", 0) == 0)
      return true;
  }
  return false;
}

// The gradients of the layer's parameters under the module at path (of `name` alone when name is
// given: a row layer's "bias"), one all-reduce per parameter.
TensorParallelTraffic gradient_traffic(const ParamTable& params, const std::string& path,
                                       int64_t element_size, const std::string& name = "") {
  const std::string prefix = path + "." + name;
  TensorParallelTraffic traffic;
  for (const ParamSpec& p : params.layer) {
    const bool match = name.empty() ? p.name.rfind(prefix, 0) == 0 : p.name == prefix;
    if (match) traffic.add(c10::multiply_integers(p.shape) * element_size);
  }
  return traffic;
}

// What the module at path under style moves in one pass (see fsdp/tensor_parallel.h).
void add_style_bytes(const ParamTable& params, const LayerSplit& split, const std::string& path,
                     const ParallelStyle& style, LayerTpBytes& out) {
  const int64_t act = split.activation_bytes;
  const bool moves = style.from() != style.to();
  switch (style.kind()) {
    case ParallelStyle::Kind::kRowwise:
      if (style.to() == Layout::kReplicate) {
        out.forward.all_reduce.add(act);
      } else {  // reduce-scatter; its gradient gathered, the whole bias's gradient summed
        out.forward.reduce_scatter.add(act);
        out.backward.all_gather.add(act);
        out.backward.all_reduce += gradient_traffic(params, path, split.element_size, "bias");
      }
      break;
    case ParallelStyle::Kind::kColwise:
      if (!under_sequence_gather(split.plan, path)) out.backward.all_reduce.add(act);
      break;
    case ParallelStyle::Kind::kPrepareInput:
    case ParallelStyle::Kind::kPrepareOutput:
      if (moves && style.to() == Layout::kReplicate) {  // a gather
        out.forward.all_gather.add(act);
        if (holds_column_layers(split.plan, path)) out.backward.reduce_scatter.add(act);
      } else if (moves) {  // a scatter: its gradient gathered
        out.backward.all_gather.add(act);
      }
      break;
    case ParallelStyle::Kind::kReplicate:
    case ParallelStyle::Kind::kSequence:
      out.backward.all_reduce += gradient_traffic(params, path, split.element_size);
      break;
  }
}

}  // namespace

LayerTpBytes layer_tp_bytes(const ParamTable& params, const LayerSplit& split) {
  LayerTpBytes out;
  if (split.tp <= 1) return out;
  for (const auto& [path, style] : split.plan) add_style_bytes(params, split, path, style, out);
  if (split.recomputed) out.backward += out.forward;
  return out;
}

std::vector<std::vector<int64_t>> split_layer_shapes(const ParamTable& params,
                                                     const LayerSplit& split) {
  std::vector<std::vector<int64_t>> shapes;
  for (const ParamSpec& p : params.layer) {
    std::vector<int64_t> shape = p.shape;
    const ParallelStyle* style = split.tp > 1 ? style_of(split.plan, p.name) : nullptr;
    if (style && style->kind() != ParallelStyle::Kind::kColwise &&
        style->kind() != ParallelStyle::Kind::kRowwise)
      style = nullptr;  // whole parameters
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

namespace {

// Sets spec's root_tp_forward and root_tp_backward: what the root moves over the tp group.
void set_root_tp_bytes(ModelMemorySpec& spec, const RootSplit& split) {
  if (split.tp <= 1) return;
  TensorParallelBytes& forward = spec.root_tp_forward;
  TensorParallelBytes& backward = spec.root_tp_backward;
  const int64_t act = split.activation_bytes;
  const bool sp = split.sequence_parallel;
  if (split.vocab_split) {
    // The embedding's partial lookups summed (into shards under sp, their gradient gathered);
    // the head's input replicated (its gradient summed) or gathered from shards (reduce-scattered).
    (sp ? forward.reduce_scatter : forward.all_reduce).add(act);
    (sp ? backward.all_gather : backward.all_reduce).add(act);
    if (sp) {
      forward.all_gather.add(act);
      backward.reduce_scatter.add(act);
    }
    // The loss: the rows' maxima gathered, their sums of exponentials and target logits summed.
    forward.all_gather.add(split.tp * split.tokens * 4);
    forward.all_reduce.add(2 * split.tokens * 4);
  } else if (sp) {  // the whole embeddings scattered, the head's input gathered
    forward.all_gather.add(act);
    backward.all_gather.add(act);
  }
  if (sp) {
    if (split.position_bytes > 0) backward.all_gather.add(split.position_bytes);
    backward.all_reduce.add(split.norm_gradient_bytes, split.norm_parameters);
  }
}

// The output head (fsdp-train --head-unit): the head's weight, vocabulary_names[1], which when
// tied is the table vocabulary_names[0], from whose shards the stem then looks up `tokens` rows.
HeadUnitSpec head_memory(const ParamTable& params, const RootMemory& root, int64_t tokens,
                         int64_t width) {
  const std::string& name = root.vocabulary_names.at(root.tied ? 0 : 1);
  HeadUnitSpec head;
  for (size_t k = 0; k < params.root.size(); ++k) {
    if (params.root[k].name == name) head.params.push_back(k);
  }
  TORCH_INTERNAL_ASSERT(head.params.size() == 1, "the head's weight ", name, " among the root's");
  if (root.tied) {
    head.lookup_tokens = tokens;
    head.lookup_width = width;
  }
  return head;
}

}  // namespace

ModelMemorySpec root_memory(const ParamTable& params, const RootSplit& split,
                            const RootMemory& root, int64_t element_size) {
  const ParamSpec* table = params.find(root.vocabulary_names.at(0));
  TORCH_INTERNAL_ASSERT(table != nullptr && table->shape.size() == 2, "the vocabulary's table");
  const int64_t vocab = table->shape[0], width = table->shape[1];
  // Rank 0's part under a vocabulary split, the largest when it is uneven.
  const int64_t columns =
      split.vocab_split ? tensor_parallel_range(vocab, split.tp, 0).length : vocab;
  const LossMemory loss = split.vocab_split
                              ? vocab_parallel_loss_memory(split.tokens, columns, element_size)
                              : loss_memory(split.tokens, columns, element_size);
  ModelMemorySpec spec;
  for (const ParamSpec& p : params.root) {
    std::vector<int64_t> shape = p.shape;
    const auto& names = root.vocabulary_names;
    if (split.vocab_split && std::find(names.begin(), names.end(), p.name) != names.end())
      shape[0] = columns;
    spec.root_param_shapes.push_back(std::move(shape));
  }
  spec.root_saved_before_bytes = root.saved_before;
  spec.root_saved_after_bytes = root.saved_after + loss.saved_bytes;
  spec.root_forward_workspace_bytes = loss.forward_workspace_bytes;
  spec.root_backward_peak_bytes = loss.backward_peak_bytes;
  // Tied, the table's gradient comes in two parts: the head's [V, d], held by autograd from the
  // start of backward, and the embedding's, which embedding_dense_backward makes as a dense
  // [V, d] at the very end. Autograd sums a leaf's incoming gradients out of place (its input
  // buffer never writes into a gradient it was handed), so for a moment three [V, d] tensors
  // are alive; the sum then replaces the head's part as the table's gradient. Untied, the
  // embedding's dense gradient is its only one, already counted with the root's gradients.
  // (V: this rank's rows under a vocabulary split.)
  spec.root_stem_backward_peak_bytes = root.tied ? 2 * columns * width * element_size : 0;
  set_root_tp_bytes(spec, split);
  spec.head = head_memory(params, root, split.tokens, width);
  return spec;
}

std::vector<UnitMemorySpec> layer_units(const ParamTable& params, const std::string& name_prefix,
                                        const LayerMemory& layer, const LayerSplit& split) {
  const LayerTpBytes tp = layer_tp_bytes(params, split);
  const std::vector<std::vector<int64_t>> shapes = split_layer_shapes(params, split);
  std::vector<UnitMemorySpec> units(static_cast<size_t>(params.n_layers));
  for (size_t i = 0; i < units.size(); ++i) {
    units[i].name = name_prefix + std::to_string(i);
    units[i].param_shapes = shapes;
    units[i].saved_bytes = layer.saved_bytes;
    units[i].forward_workspace_bytes = layer.forward_workspace_bytes;
    units[i].backward_peak_bytes = layer.backward_peak_bytes;
    units[i].tp_forward = tp.forward;
    units[i].tp_backward = tp.backward;
  }
  return units;
}

}  // namespace fsdp::models
