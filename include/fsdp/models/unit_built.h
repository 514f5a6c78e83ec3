// The callback a model's build hands each FSDP unit to (fsdp/models/model.h's BuildOptions),
// apart from model.h so that model implementations, which include models/common/modules.h and
// never model.h (see model.h's top comment), share the one definition.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>

namespace fsdp::models {

// Called during construction right after the unit called name (its full parameter prefix, e.g.
// "model.layers.3") is built and initialized, before the next unit is built.
using UnitBuiltCallback =
    std::function<void(const std::string& name, const std::shared_ptr<torch::nn::Module>& unit)>;

}  // namespace fsdp::models
