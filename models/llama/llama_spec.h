// Llama behind the model interface (fsdp/models/model.h), for configurations other than the
// registered ones (models/hf/ builds them from a config.json).
#pragma once

#include <fsdp/models/model.h>
#include <models/llama/llama_config.h>

#include <memory>
#include <string>

namespace fsdp::models {

// config (validated) as a ModelSpec called name, built as LlamaForCausalLM with its decoder
// layers as the FSDP units.
std::shared_ptr<const ModelSpec> make_llama_spec(std::string name, const LlamaConfig& config);

}  // namespace fsdp::models
