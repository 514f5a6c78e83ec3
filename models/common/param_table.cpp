// ParamTable's look-ups and initialization; see param_table.h. Initial values depend only on
// (seed, canonical name, spec): the order parameters are built in, sharding and threads never
// change them.
#include <models/common/modules.h>
#include <models/common/param_table.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <optional>

namespace fsdp::models {
namespace {

// The rest of name after "<prefix><layer>.", layer a decimal number without leading zeros,
// below n_layers; nullopt when name has no such form.
std::optional<std::string> layer_rest(const std::string& name, const std::string& prefix,
                                      int64_t n_layers) {
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const size_t pos = prefix.size();
  const size_t dot = name.find('.', pos);
  if (dot == std::string::npos || dot == pos || dot - pos > 9) return std::nullopt;
  int64_t layer = 0;
  for (size_t i = pos; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    layer = layer * 10 + (name[i] - '0');
  }
  if ((dot - pos > 1 && name[pos] == '0') || layer >= n_layers) return std::nullopt;
  return name.substr(dot + 1);
}

const ParamSpec* named(const std::vector<ParamSpec>& specs, const std::string& name) {
  for (const auto& spec : specs) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<std::vector<int64_t>> shapes_of(const std::vector<ParamSpec>& specs) {
  std::vector<std::vector<int64_t>> out;
  out.reserve(specs.size());
  for (const auto& spec : specs) out.push_back(spec.shape);
  return out;
}

}  // namespace

std::string ParamTable::canonical(const std::string& name) const {
  for (const auto& [alias, param] : tied) {
    if (name == alias) return param;
  }
  return name;
}

const ParamSpec* ParamTable::find(const std::string& name) const {
  const std::string full = canonical(name);
  if (const ParamSpec* spec = named(root, full)) return spec;
  const std::optional<std::string> rest = layer_rest(full, layer_prefix, n_layers);
  return rest ? named(layer, *rest) : nullptr;
}

const ParamSpec* ParamTable::layer_param(const std::string& local) const {
  return named(layer, local);
}

int64_t ParamTable::num_parameters() const {
  int64_t per_layer = 0, total = 0;
  for (const auto& spec : layer) per_layer += numel(spec.shape);
  for (const auto& spec : root) total += numel(spec.shape);
  return total + n_layers * per_layer;
}

std::vector<std::vector<int64_t>> ParamTable::root_shapes() const { return shapes_of(root); }

std::vector<std::vector<int64_t>> ParamTable::layer_shapes() const { return shapes_of(layer); }

at::Tensor ParamTable::initial_value(const std::string& name, at::IntArrayRef shape,
                                     uint64_t seed) const {
  const ParamSpec* spec = find(name);
  TORCH_CHECK(spec != nullptr, "'", name, "' is not a parameter of ", model);
  TORCH_CHECK(shape == at::IntArrayRef(spec->shape), "parameter '", name, "' has shape ", shape,
              " but ", model, " gives it shape ", at::IntArrayRef(spec->shape),
              " (initial values are full, unsharded values)");
  const auto options = at::TensorOptions().dtype(at::kFloat);
  switch (spec->init) {
    case InitKind::kZeros:
      return at::zeros(shape, options);
    case InitKind::kOnes:
      return at::ones(shape, options);
    case InitKind::kNormal:
      return seeded_normal(shape, spec->std, seed, canonical(name));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled init kind for ", name);
}

void ParamTable::init_module(torch::nn::Module& module, const std::string& prefix,
                             uint64_t seed) const {
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor param = item.value();
    param.copy_(initial_value(prefix + item.key(), param.sizes(), seed));
  }
}

}  // namespace fsdp::models
