"""Hugging Face interop check for Llama, run by tests/checkpoint/test_llama_hf.cpp.

usage: llama_interop.py OURS OURS_TIED THEIRS THEIRS_TIED

OURS and OURS_TIED each hold weights + config.json written by us (the first model.safetensors
by fsdp-train --export, untied; the second with tied embeddings, split into shards with
model.safetensors.index.json) and expected.safetensors
(input_ids and the logits our C++ model computes from that file). Each must load with
transformers' LlamaForCausalLM.from_pretrained with no missing, unexpected or mismatched keys,
use grouped-query attention and llama3 rope scaling, and give the same logits (fp32, 1e-5).
Then we save randomly initialized LlamaForCausalLM models of the same configs (untied into
THEIRS, tied into THEIRS_TIED) with save_pretrained split into several shards
(model.safetensors.index.json), with their logits on the same input, for the C++ side to load
and compare. Exits non-zero with a message on any failure.
"""
import os
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # never skip silently
    sys.exit(f"llama_interop.py: {e}; install the Python packages with "
             f"'{sys.executable} -m pip install transformers safetensors'")

ours, ours_tied, theirs, theirs_tied = sys.argv[1:5]
transformers.logging.set_verbosity_error()
TOLERANCE = 1e-5


def check_ours(path, tied):
    model, info = transformers.LlamaForCausalLM.from_pretrained(
        path, output_loading_info=True, dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"llama_interop.py: from_pretrained({path}) reported {problems}")
    c = model.config
    if not c.num_key_value_heads < c.num_attention_heads:
        sys.exit(f"llama_interop.py: {path} is not grouped-query: {c.num_key_value_heads} kv heads")
    rope = c.rope_parameters
    if rope.get("rope_type") != "llama3":
        sys.exit(f"llama_interop.py: {path} has rope parameters {rope}, not llama3 scaling")
    if bool(c.tie_word_embeddings) != tied:
        sys.exit(f"llama_interop.py: {path} has tie_word_embeddings={c.tie_word_embeddings}")
    if tied and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        sys.exit(f"llama_interop.py: {path}: lm_head is not tied to embed_tokens")
    model.eval()
    expected = load_file(f"{path}/expected.safetensors")
    with torch.no_grad():
        logits = model(expected["input_ids"]).logits
    diff = (logits - expected["logits"]).abs().max().item()
    print(f"transformers {transformers.__version__}: {os.path.basename(path)} loads with no missing "
          f"or unexpected keys (tied={tied}, {c.num_attention_heads} heads / "
          f"{c.num_key_value_heads} kv, rope {rope}); max |logits difference| = {diff:.3g}")
    if not diff <= TOLERANCE:
        sys.exit(f"llama_interop.py: logits differ by {diff} (> {TOLERANCE})")
    return model.config, expected["input_ids"]


def save_theirs(config, input_ids, path, seed):
    torch.manual_seed(seed)
    fresh = transformers.LlamaForCausalLM(config).to(torch.float32)
    fresh.eval()
    fresh.save_pretrained(path, safe_serialization=True, max_shard_size="40KB")
    if not os.path.exists(f"{path}/model.safetensors.index.json"):
        sys.exit(f"llama_interop.py: save_pretrained wrote no sharded index into {path}")
    shards = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    with torch.no_grad():
        logits = fresh(input_ids).logits
    save_file({"input_ids": input_ids, "logits": logits.contiguous()},
              f"{path}/expected.safetensors")
    print(f"saved a transformers LlamaForCausalLM (tied={config.tie_word_embeddings}) to {path} "
          f"in {len(shards)} shards")


config, input_ids = check_ours(ours, tied=False)
config_tied, _ = check_ours(ours_tied, tied=True)
save_theirs(config, input_ids, theirs, seed=0)
save_theirs(config_tied, input_ids, theirs_tied, seed=1)
