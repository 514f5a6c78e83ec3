"""transformers' side of tests/models/test_hf_families.cpp: every Hugging Face family fsdp builds
from a config.json, against transformers itself.

usage: hf_families.py OURS THEIRS

OURS holds one directory per case, written by the C++ test: config.json (our hf_config_json of
the spec built from the case's config.json) and case.json ({"seed", "batch", "seq",
"max_shard_size"}); for the cases we export, also our weights (model.safetensors or a sharded
set with its index, from save_full) and expected.safetensors (input_ids and the logits our
model computed from those weights). For each case:

1. our export, if there is one, must load with AutoModelForCausalLM.from_pretrained as the class
   config.json names, with no missing, unexpected or mismatched keys, and give our logits
   (fp32, 1e-5 relative to the largest logit);
2. transformers builds the case's model at random from the same config.json (every parameter
   redrawn so that biases and norm weights are not 0 and 1, and logits are of order one), saves
   it with save_pretrained in bfloat16 split into shards of max_shard_size (an index file), and
   loads it back in float32: THEIRS/<case>/ then holds those files and expected.safetensors with
   input_ids and targets (a fixed random batch), the logits and the loss (cross-entropy of the
   float32 logits against targets, as fsdp's models::loss; float64).

Exits non-zero with a message on any failure.
"""
import json
import math
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # never skip silently
    sys.exit(f"hf_families.py: {e}; install the Python packages with "
             f"'{sys.executable} -m pip install transformers safetensors'")

ours_root, theirs_root = sys.argv[1:3]
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
TOLERANCE = 1e-5
torch.set_num_threads(2)


def relative_difference(got, want):
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()


def check_ours(name, path, class_name):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, output_loading_info=True, dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"hf_families.py: {name}: from_pretrained reported {problems}")
    if type(model).__name__ != class_name:
        sys.exit(f"hf_families.py: {name}: loaded as {type(model).__name__}, not {class_name}")
    model.eval()
    expected = load_file(f"{path}/expected.safetensors")
    with torch.no_grad():
        logits = model(expected["input_ids"]).logits
    diff = relative_difference(logits, expected["logits"])
    print(f"{name}: our export loads as {class_name} with no missing or unexpected keys; "
          f"max relative logits difference {diff:.3g}")
    if not diff <= TOLERANCE:
        sys.exit(f"hf_families.py: {name}: logits differ by {diff} (> {TOLERANCE}) relative")


def randomize(model, generator):
    """Every parameter redrawn: weights N(0, 1/fan_in), biases N(0, 0.1^2), norm weights 1 + that."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if p.dim() >= 2:
                p.copy_(noise / math.sqrt(p.shape[-1]))
            elif pname.endswith("weight"):  # a norm's
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)


def save_theirs(name, config_dir, out, spec):
    config = transformers.AutoConfig.from_pretrained(config_dir)
    generator = torch.Generator().manual_seed(spec["seed"])
    fresh = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(fresh, generator)
    fresh.to(torch.bfloat16).save_pretrained(out, max_shard_size=spec["max_shard_size"])
    if not os.path.exists(f"{out}/model.safetensors.index.json"):
        sys.exit(f"hf_families.py: {name}: save_pretrained wrote no sharded index")
    shards = [f for f in os.listdir(out) if f.endswith(".safetensors")]
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.eval()
    vocab = config.vocab_size
    shape = (spec["batch"], spec["seq"])
    input_ids = torch.randint(vocab, shape, generator=generator)
    targets = torch.randint(vocab, shape, generator=generator)
    with torch.no_grad():
        logits = model(input_ids).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    save_file({"input_ids": input_ids, "targets": targets, "logits": logits.contiguous(),
               "loss": loss.double().reshape(1)}, f"{out}/expected.safetensors")
    print(f"{name}: saved a random {type(model).__name__} in {len(shards)} bfloat16 shards; "
          f"loss {loss.item():.6f}")


for name in sorted(os.listdir(ours_root)):
    path = os.path.join(ours_root, name)
    with open(f"{path}/case.json") as f:
        spec = json.load(f)
    with open(f"{path}/config.json") as f:
        class_name = json.load(f)["architectures"][0]
    if os.path.exists(f"{path}/expected.safetensors"):
        check_ours(name, path, class_name)
    save_theirs(name, path, os.path.join(theirs_root, name), spec)
print(f"transformers {transformers.__version__}, torch {torch.__version__}: all cases done")
