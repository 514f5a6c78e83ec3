"""transformers' side of tests/tools/test_fsdp_train_finetune.cpp.

usage: finetune_reference.py make OUT_DIR
       finetune_reference.py loss MODEL_DIR BATCHES OUT_JSON

make: a random GPT2LMHeadModel over the test's tiny tokenizer (260 ids), every parameter redrawn
so that logits are of order one (with transformers' 0.02 initialization every token's loss is
close to ln 260, and a wrong mask would hardly move the mean), saved with save_pretrained in
float32.

loss: reads fsdp-train's --dump-batches file (the format in tools/fsdp_train/trainer.h) and
computes, for step 1's global batch (its K micro-batches concatenated), transformers' own loss
on it: model(input_ids, labels=labels).loss with input_ids = the inputs followed by one more
token and labels = -100 followed by the targets, so that transformers' shift gives exactly our
(position, target) pairs. Also the loss with no mask (every target the next input), to show the
mask matters, after checking that each trained target is the next input (prompt/completion
data's labels are their tokens). Writes {"loss", "unmasked_loss", "trained", "targets"} to
OUT_JSON.

Exits non-zero with a message on any failure.
"""
import json
import math
import sys

try:
    import torch
    import transformers
except ImportError as e:  # never skip silently
    sys.exit(f"finetune_reference.py: {e}; install the Python packages with "
             f"'{sys.executable} -m pip install transformers safetensors'")

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
torch.set_num_threads(2)
VOCAB = 260


def make(out):
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    model = transformers.GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if p.dim() >= 2:
                p.copy_(noise / math.sqrt(p.shape[-1]))
            elif name.endswith("weight"):  # a norm's
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    model.save_pretrained(out)
    print(f"saved a random GPT2LMHeadModel ({sum(p.numel() for p in model.parameters())} "
          f"parameters) to {out}")


def step_one_batch(path):
    """(inputs, targets), each [B*K, T] int64: step 1's records of the --dump-batches file."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != b"FSDPBAT1":
        sys.exit(f"finetune_reference.py: {path} is not a --dump-batches file")
    values = torch.frombuffer(bytearray(raw[8:]), dtype=torch.int64)
    b, t, k = values[:3].tolist()
    record = 2 + 2 * b * t
    inputs, targets = [], []
    for i in range(k):
        r = values[3 + i * record: 3 + (i + 1) * record]
        if r[0].item() != 1 or r[1].item() != i:
            sys.exit(f"finetune_reference.py: record {i} is step {r[0]} micro-batch {r[1]}")
        inputs.append(r[2:2 + b * t].view(b, t))
        targets.append(r[2 + b * t:].view(b, t))
    return torch.cat(inputs), torch.cat(targets)


def loss(model_dir, batches, out):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    inputs, targets = step_one_batch(batches)
    trained = targets != -100
    next_inputs = torch.cat([inputs[:, 1:], torch.full_like(inputs[:, :1], -1)], dim=1)
    # The last position's next input is outside the row: it cannot be checked there.
    inside = torch.ones_like(trained)
    inside[:, -1] = False
    wrong = trained & inside & (targets != next_inputs)
    if wrong.any():
        sys.exit(f"finetune_reference.py: {int(wrong.sum())} trained targets are not the next "
                 f"input, first at {wrong.nonzero()[0].tolist()}")
    input_ids = torch.cat([inputs, torch.zeros_like(inputs[:, :1])], dim=1)
    labels = torch.cat([torch.full_like(targets[:, :1], -100), targets], dim=1)
    with torch.no_grad():
        masked = model(input_ids, labels=labels).loss.item()
        logits = model(inputs).logits.float()
        unmasked_targets = torch.where(trained, targets, next_inputs)
        unmasked = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, VOCAB), unmasked_targets[:, :-1].reshape(-1)).item()
    with open(out, "w") as f:
        json.dump({"loss": masked, "unmasked_loss": unmasked, "trained": int(trained.sum()),
                   "targets": targets.numel()}, f)
    print(f"transformers {transformers.__version__}: loss {masked:.6f} over {int(trained.sum())} "
          f"of {targets.numel()} targets; {unmasked:.6f} unmasked")


if sys.argv[1] == "make":
    make(sys.argv[2])
elif sys.argv[1] == "loss":
    loss(*sys.argv[2:5])
else:
    sys.exit(f"finetune_reference.py: unknown mode {sys.argv[1]}")
