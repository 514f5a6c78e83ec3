// The model registry: one line per model folder in FSDP_MODEL_FAMILIES. Each folder defines
// std::vector<std::shared_ptr<const ModelSpec>> <family>_model_specs(), its named
// configurations. Names are unique across families (checked when the registry is first used).
#include <fsdp/models/model.h>
#include <models/common/modules.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <set>

// Adding a model: its folder, plus its name here.
#define FSDP_MODEL_FAMILIES(X) \
  X(gpt2)                      \
  X(llama)

namespace fsdp::models {

#define FSDP_DECLARE_FAMILY(family) \
  std::vector<std::shared_ptr<const ModelSpec>> family##_model_specs();
FSDP_MODEL_FAMILIES(FSDP_DECLARE_FAMILY)
#undef FSDP_DECLARE_FAMILY

namespace {

const std::vector<std::shared_ptr<const ModelSpec>>& registry() {
  static const std::vector<std::shared_ptr<const ModelSpec>> specs = [] {
    std::vector<std::shared_ptr<const ModelSpec>> all;
#define FSDP_APPEND_FAMILY(family) \
  for (auto& spec : family##_model_specs()) all.push_back(spec);
    FSDP_MODEL_FAMILIES(FSDP_APPEND_FAMILY)
#undef FSDP_APPEND_FAMILY
    std::set<std::string> seen;
    for (const auto& spec : all) {
      TORCH_INTERNAL_ASSERT(seen.insert(spec->name()).second, "model name '", spec->name(),
                            "' is registered twice");
    }
    return all;
  }();
  return specs;
}

}  // namespace

at::Tensor Model::loss(const at::Tensor& logits, const at::Tensor& targets) const {
  return models::loss(logits, targets);
}

at::Tensor Model::summed_loss(const at::Tensor& logits, const at::Tensor& targets) const {
  return models::summed_loss(logits, targets);
}

TensorParallelPlan ModelSpec::unit_tp_plan(int tp, bool) const {
  TORCH_CHECK(false, "model '", name(), "' (family ", family(),
              ") has no tensor-parallel plan, which tensor parallelism over ", tp, " ranks needs");
}

TensorParallelPlan ModelSpec::root_tp_plan(int tp, bool sequence_parallel) const {
  TORCH_CHECK(!sequence_parallel, "model '", name(), "' (family ", family(),
              ") has no sequence-parallel plan for its root, which sequence parallelism over ", tp,
              " ranks needs");
  return {};
}

std::shared_ptr<const ModelSpec> model_spec(const std::string& name) {
  for (const auto& spec : registry()) {
    if (spec->name() == name) return spec;
  }
  TORCH_CHECK(false, "unknown model '", name, "'; valid names are: ", model_names_joined());
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& spec : registry()) names.push_back(spec->name());
  return names;
}

std::string model_names_joined() {
  std::string out;
  for (const auto& name : model_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace fsdp::models
