// GPT-2 behind the model interface (fsdp/models/model.h), for configurations other than the
// registered ones (models/hf/ builds them from a config.json).
#pragma once

#include <fsdp/models/model.h>
#include <models/gpt2/gpt2_config.h>

#include <memory>
#include <string>

namespace fsdp::models {

// config (validated) as a ModelSpec called name, built as GPT2LMHead with its blocks as the FSDP
// units.
std::shared_ptr<const ModelSpec> make_gpt2_spec(std::string name, const GPT2Config& config);

}  // namespace fsdp::models
