"""Hugging Face interop check, run by tests/checkpoint/test_processes.cpp.

usage: hf_interop.py OURS THEIRS

OURS holds model.safetensors + config.json exported by fsdp-train and expected.safetensors
(input_ids and the logits our C++ model computes from that file). We load OURS with
transformers' GPT2LMHeadModel.from_pretrained, require no missing, unexpected or mismatched
keys, and compare logits. Then we save a randomly initialized GPT2LMHeadModel of the same
config with save_pretrained into THEIRS, with its logits on the same input, for the C++ side
to load and compare. Exits non-zero with a message on any failure.
"""
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # never skip silently
    sys.exit(f"hf_interop.py: {e}; install the Python packages with "
             f"'{sys.executable} -m pip install transformers safetensors' "
             f"(scripts/run.sh test does this)")

ours, theirs = sys.argv[1], sys.argv[2]
transformers.logging.set_verbosity_error()

model, info = transformers.GPT2LMHeadModel.from_pretrained(ours, output_loading_info=True)
problems = {k: v for k, v in info.items() if v}
if problems:
    sys.exit(f"hf_interop.py: from_pretrained({ours}) reported {problems}")
model.eval()
expected = load_file(f"{ours}/expected.safetensors")
with torch.no_grad():
    logits = model(expected["input_ids"]).logits
diff = (logits - expected["logits"]).abs().max().item()
print(f"transformers {transformers.__version__}: our export loads with no missing or unexpected "
      f"keys; max |logits difference| = {diff:.3g}")
if not diff <= 1e-5:
    sys.exit(f"hf_interop.py: logits differ by {diff} (> 1e-5)")

torch.manual_seed(0)
fresh = transformers.GPT2LMHeadModel(model.config)
fresh.eval()
fresh.save_pretrained(theirs, safe_serialization=True)
with torch.no_grad():
    fresh_logits = fresh(expected["input_ids"]).logits
save_file({"input_ids": expected["input_ids"], "logits": fresh_logits.contiguous()},
          f"{theirs}/expected.safetensors")
print(f"saved a transformers GPT2LMHeadModel to {theirs}")
