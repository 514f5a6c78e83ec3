// Llama in Hugging Face's file layout (transformers' LlamaForCausalLM): our parameter names are
// its names and our Linear weights its [out, in] layout, so the layout only
// - skips, reading, model.rotary_emb.inv_freq (a buffer some old files hold) and, when the
//   embeddings are tied, a stored lm_head.weight (save_pretrained writes the tied tensor once,
//   under model.embed_tokens.weight, as save_full does);
// - writes the config.json that LlamaForCausalLM.from_pretrained loads (rope_theta and
//   rope_scaling in the form the hub's Llama 3.1 / 3.2 files use, which transformers 4.x and
//   5.x both read).
#pragma once

#include <fsdp/checkpoint/checkpoint.h>
#include <models/llama/llama.h>

#include <c10/core/ScalarType.h>

#include <string>

namespace fsdp::models {

fsdp::checkpoint::FullLayout llama_hf_layout(const LlamaConfig& config);

// config.json for a LlamaForCausalLM of config whose weights are stored in dtype.
std::string llama_hf_config_json(const LlamaConfig& config, at::ScalarType dtype = at::kFloat);

}  // namespace fsdp::models
