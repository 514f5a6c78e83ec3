#!/usr/bin/env bash
# End to end on real text: Debian's fortunes, a tokenizer trained here, llama-debug on 2 ranks
# with held-out loss, the export loaded by transformers, which generates from it.
#
#   bash scripts/demo_fortunes.sh OUT_DIR [STEPS] [extra fsdp-train flags...]
#
# Needs a build (scripts/run.sh build) and the project's .venv with tokenizers and transformers
# (scripts/run.sh test installs them). Writes under OUT_DIR: tok/ (tokenizer.json and
# tokenizer_config.json), train.jsonl and val.jsonl (every fortune a document, 5% held out by a
# fixed shuffle), train.bin and val.bin (llm.c token shards), metrics.jsonl, model/ (the export)
# and generate.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: demo_fortunes.sh OUT_DIR [STEPS] [fsdp-train flags...]}"
steps="${2:-1000}"
shift $(( $# >= 2 ? 2 : 1 ))
py="${FSDP_PYTHON:-$ROOT/.venv/bin/python3}"
bin="${FSDP_BIN_DIR:-$ROOT/build}"  # the programs (tests pass their build directory)
mkdir -p "$out"

echo "== 1. tokenizer and documents"
"$py" "$ROOT/scripts/train_tokenizer.py" --vocab-size 2048 --output "$out/tok" /usr/share/games/fortunes
"$py" - "$out" <<'PY'
import glob, json, os, random, sys
out = sys.argv[1]
docs = []
for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if os.path.isfile(f) and not f.endswith((".dat", ".u8")):
        text = open(f, "rb").read().decode("utf-8", "replace")
        docs += [d.strip("\n") for d in text.split("\n%\n") if d.strip()]
random.Random(0).shuffle(docs)
held = max(1, len(docs) // 20)
for name, part in (("val", docs[:held]), ("train", docs[held:])):
    with open(os.path.join(out, name + ".jsonl"), "w") as f:
        for d in part:
            f.write(json.dumps({"text": d}) + "\n")
print(f"{len(docs)} fortunes: {len(docs) - held} to train on, {held} held out")
PY
for part in train val; do
  "$bin/fsdp-tokenize" --tokenizer "$out/tok/tokenizer.json" --output "$out/$part.bin" "$out/$part.jsonl"
done

echo "== 2. train llama-debug on 2 ranks, with held-out loss"
"$bin/fsdp-train" --nproc 2 --model llama-debug --tokenizer "$out/tok/tokenizer.json" \
  --data "$out/train.bin" --val-data "$out/val.bin" --val-every 100 --val-batches 8 \
  --steps "$steps" --global-batch 16 --seq-len 128 --lr 3e-3 --lr-schedule cosine \
  --warmup-steps 50 --min-lr 3e-4 --metrics "$out/metrics.jsonl" \
  --export "$out/model/model.safetensors" "$@"

echo "== 3. transformers loads the export and generates"
"$py" - "$out" <<'PY' | tee "$out/generate.txt"
import sys, torch, transformers
out = sys.argv[1]
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
model = transformers.LlamaForCausalLM.from_pretrained(f"{out}/model")
tok = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{out}/tok/tokenizer.json",
                                           bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
for prompt in ["The ", "A computer ", "Love is"]:
    ids = tok(prompt, return_tensors="pt").input_ids
    ids = torch.cat([torch.tensor([[tok.bos_token_id]]), ids], dim=1)
    torch.manual_seed(0)
    gen = model.generate(ids, max_new_tokens=24, do_sample=True, top_k=20,
                         pad_token_id=tok.eos_token_id)
    print(repr(tok.decode(gen[0, 1:], skip_special_tokens=True)))
PY

echo "== 4. against a unigram baseline"
"$py" - "$out" <<'PY' | tee "$out/summary.txt"
import json, math, sys
import numpy as np
out = sys.argv[1]
def tokens(path):
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype=np.int32)
    return np.frombuffer(raw[1024:], dtype=np.uint16 if header[1] == 1 else np.uint32)
train, val = tokens(f"{out}/train.bin"), tokens(f"{out}/val.bin")
vocab = int(max(train.max(), val.max())) + 1
counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0  # add-one smoothing
p = counts / counts.sum()
unigram = float(-np.log(p[val]).mean())
lines = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
vals = [(l["step"], l["val_loss"]) for l in lines if "val_loss" in l]
print(f"tokens: {len(train)} train, {len(val)} held out; unigram cross-entropy of the held-out "
      f"text under the training text's unigram distribution: {unigram:.3f} nats")
print(f"train loss: step 1 {lines[0]['loss']:.3f}, step {lines[-1]['step']} {lines[-1]['loss']:.3f}")
for step, v in vals:
    print(f"val loss at step {step}: {v:.3f}")
PY
