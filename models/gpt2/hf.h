// GPT-2 in Hugging Face's file layout, so that a full checkpoint (fsdp::checkpoint::save_full)
// is a model.safetensors that transformers' GPT2LMHeadModel.from_pretrained loads as is, and
// load_full reads one written by transformers.
//
// Our parameter names already are HF's (transformer.h.0.attn.c_attn.weight, ...). What differs:
// - HF's Conv1D stores c_attn, c_proj and c_fc weights as [in, out]; our torch::nn::Linear
//   holds [out, in], so those four weights per block are stored transposed;
// - lm_head.weight is tied to transformer.wte.weight: we store it once, under the wte name, as
//   save_pretrained does (untied, tie_word_embeddings false, it is stored as it is);
// - reading, we accept keys with or without the "transformer." prefix (the hub's original gpt2
//   file has none) and skip attn.bias / attn.masked_bias (the causal-mask buffers old versions
//   saved) and, tied, a stored lm_head.weight.
#pragma once

#include <fsdp/checkpoint/checkpoint.h>
#include <models/gpt2/gpt2.h>

#include <string>

namespace fsdp::models {

fsdp::checkpoint::FullLayout gpt2_hf_layout(const GPT2Config& config = GPT2Config());

// The config.json transformers needs beside model.safetensors for a GPT2LMHeadModel of config
// (no dropout).
std::string gpt2_hf_config_json(const GPT2Config& config);

}  // namespace fsdp::models
