#!/usr/bin/env bash
# Bounded libFuzzer runs of the parsers that need no LibTorch, built with clang's
# -fsanitize=fuzzer,address,undefined: the checkpoint formats (src/checkpoint/format.cpp: the
# safetensors header parser and the sharded checkpoint's index parser; dcp_format.cpp: DCP's
# DCP_SHARDING_INFO, the chunks' assembly and our fsdp.json beside them), the data library
# (src/data/: the tokenizer.json loader, encoding arbitrary bytes with two built-in
# tokenizers, and the llm.c token shard parser) and Hugging Face config.json parsing
# (models/hf/hf_config.cpp, with the configurations' own checks).
#
#   bash tests/fuzz/run_fuzz.sh [SECONDS_PER_TARGET]   (default 60)
#   FSDP_FUZZ_RUNS=1000000 bash tests/fuzz/run_fuzz.sh   (a number of executions per target
#                                                        instead, however long it takes)
#   FSDP_FUZZ_TARGETS="index safetensors"                (only these targets)
#   FSDP_FUZZ_MAX_LEN=65536                              (the largest input libFuzzer makes)
#
# Needs Debian's clang and libclang-rt-14-dev (the fuzzer runtime) and libxxhash-dev; installs
# them when missing. Seeds: a real export and checkpoint index from build/fsdp-train when it
# exists, plus small hand-written ones. Prints, per target, the runs, the time and the crashes
# found; exits non-zero when a crash was found (the reproducer is left in the work directory).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
work="${FSDP_FUZZ_DIR:-/tmp/fsdp_fuzz}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
for p in clang libclang-rt-14-dev libxxhash-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

rm -rf "$work" && mkdir -p "$work/obj"
# Each source compiled once, through the shared compiler cache (see
# [Note: one compiler cache for every clone]), then each target linked with libFuzzer's main.
. scripts/lib/ccache_env.sh
sanitizers="address,undefined -fno-sanitize-recover=undefined"
compile() {  # compile SOURCE: prints the object's path
  local obj="$work/obj/$(echo "$1" | tr / _).o"
  ${FSDP_CCACHE:-} clang++ -std=c++17 -O1 -g -fsanitize=fuzzer-no-link,$sanitizers -Iinclude -Isrc \
    -Itests -I. -c "$1" -o "$obj" && echo "$obj"
}
export -f compile; export work sanitizers FSDP_CCACHE
hf_sources=(models/hf/hf_config.cpp models/llama/llama_config.cpp models/gpt2/gpt2_config.cpp)
checkpoint_sources=(src/checkpoint/format.cpp src/checkpoint/json_checks.cpp
                    src/checkpoint/dcp_format.cpp)
sources=("${checkpoint_sources[@]}" src/data/*.cpp "${hf_sources[@]}" tests/fuzz/fuzz_*.cpp)
printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -I{} bash -c 'compile {}' >/dev/null
obj() { for f in "$@"; do echo "$work/obj/$(echo "$f" | tr / _).o"; done; }
link() {  # link TARGET LIBS... from its entry point and the sources it tests
  local target="$1"; shift
  # shellcheck disable=SC2046  # the object list, split on purpose
  clang++ -fsanitize=fuzzer,$sanitizers $(obj tests/fuzz/fuzz_$target.cpp) "$@" -o "$work/fuzz_$target"
  mkdir -p "$work/corpus_$target"
}
for target in safetensors index dcp_hf; do link $target $(obj "${checkpoint_sources[@]}") -lxxhash; done
for target in tokenizer_json tokenizer_encode token_shard; do
  link $target $(obj src/data/*.cpp) -lpcre2-8 -lutf8proc
done
link hf_config $(obj "${hf_sources[@]}")

# Seeds.
printf '\x02\x00\x00\x00\x00\x00\x00\x00{}' > "$work/corpus_safetensors/empty"
python3 - "$work/corpus_safetensors/small" <<'PY'
import json, struct, sys
h = json.dumps({"__metadata__": {"format": "pt"},
                "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(22))
PY
if [ -x build/fsdp-train ]; then
  seeds="$work/seed_run"
  build/fsdp-train --nproc 2 --steps 1 --global-batch 2 --seq-len 8 --quiet \
    --save "$seeds/ckpt" --export "$seeds/model.safetensors" >/dev/null
  # Real headers with their data cut short enough to keep inputs small.
  python3 - "$seeds" "$work" <<'PY'
import glob, struct, sys
seeds, work = sys.argv[1], sys.argv[2]
for i, path in enumerate([f"{seeds}/model.safetensors"] + sorted(glob.glob(f"{seeds}/ckpt/step_*/rank_*"))):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    open(f"{work}/corpus_safetensors/real_{i}", "wb").write(b[:8 + n])
    open(f"{work}/corpus_safetensors/real_full_{i}", "wb").write(b[:65536])
PY
  cp "$seeds"/ckpt/step_*/metadata.json "$work/corpus_index/real_index"
fi
# DCP-HF seeds: a rank file as FSDP2 writes it (an empty chunk, a 0-D step), then 0xff and a
# manifest.
python3 - "$work/corpus_dcp_hf/fsdp2_rank" <<'PY'
import json, struct, sys
info = {"w": {"saved_offsets": [2, 0]}, "e": {"saved_offsets": [4]}, "s": {"saved_offsets": []}}
h = json.dumps({"__metadata__": {"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0",
                                 "format": "pt"},
                "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                "e": {"dtype": "F32", "shape": [0], "data_offsets": [24, 24]},
                "s": {"dtype": "F32", "shape": [], "data_offsets": [24, 28]}}).encode()
manifest = {"format": "fsdp-dcp-hf-checkpoint", "version": 1, "world_size": 2, "step": 3,
            "files": [{"path": "model/shard-00001-model-00001-of-00001.safetensors", "bytes": 9}],
            "rng_cpu": ["00ff"], "user": {}, "xxh3_64": "0000000000000000"}
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(28) + b"\xff" +
                              json.dumps(manifest).encode())
PY
echo '{"format":"fsdp-sharded-checkpoint","version":1,"world_size":1,"step":0,"files":[{"name":"rank_00000-of-00001.safetensors","bytes":8,"xxh3_64":"0000000000000000"}],"tensors":{},"xxh3_64":"0000000000000000"}' \
  > "$work/corpus_index/minimal"

# Data seeds: small byte-level tokenizers (GPT-2 and Llama 3 style, both merge forms, added
# tokens), text with invalid UTF-8, and shards of both formats.
python3 - "$work" <<'PY'
import json, struct, sys
work = sys.argv[1]
def ch(b):
    n, table = 0, {}
    for x in range(256):
        if 33 <= x <= 126 or 161 <= x <= 172 or x >= 174: table[x] = chr(x)
        else: table[x] = chr(256 + n); n += 1
    return table[b]
vocab = {ch(b): b for b in range(256)}
vocab.update({ch(32) + "t": 256, "he": 257, ch(32) + "the": 258})
model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
         "vocab": vocab, "merges": [ch(32) + " t", "h e", ch(32) + "t he"]}
added = [{"id": 259, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True}]
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
gpt2 = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": bl, "post_processor": None, "decoder": bl, "model": model}
open(f"{work}/corpus_tokenizer_json/gpt2", "w").write(json.dumps(gpt2))
llama = json.loads(json.dumps(gpt2))
llama["model"]["merges"] = [m.split(" ") for m in model["merges"]]
llama["model"]["ignore_merges"] = True
llama["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
llama["added_tokens"].append({"id": 260, "content": "<|res", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": True, "special": False})
open(f"{work}/corpus_tokenizer_json/llama3", "w").write(json.dumps(llama))
for i, text in enumerate([b"\x00Hello world, it's 2024!   \n\n\tdon'T", b"\x01The\xff\xe4\xb8\xad\xf0\x9f\x98 x  \r\n y",
                          b"\x00" + " ".join(["the"] * 50).encode()]):
    open(f"{work}/corpus_tokenizer_encode/seed{i}", "wb").write(text)
def shard(magic, version, fmt, toks):
    return struct.pack("<3i", magic, version, len(toks)) + bytes(1012) + struct.pack(f"<{len(toks)}{fmt}", *toks)
open(f"{work}/corpus_token_shard/u16", "wb").write(shard(20240520, 1, "H", [1, 2, 50256, 7]))
open(f"{work}/corpus_token_shard/u32", "wb").write(shard(20240801, 7, "I", [1, 128000, 5]))
PY

# config.json seeds: each family as the hub and transformers 4.x / 5.x write it.
python3 - "$work/corpus_hf_config" <<'PY'
import json, sys
out = sys.argv[1]
llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
         "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
         "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
         "rms_norm_eps": 1e-05, "rope_theta": 100000, "rope_scaling": None,
         "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 0,
         "rope_interleaved": False, "pretraining_tp": 1, "torch_dtype": "bfloat16"}
llama31 = dict(llama, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192},
               attention_bias=True, mlp_bias=True, head_dim=64)
v5 = dict(llama, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})
del v5["rope_theta"], v5["rope_scaling"]
mistral = dict(llama, architectures=["MistralForCausalLM"], model_type="mistral",
               sliding_window=4096, head_dim=128)
qwen2 = dict(llama, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
             use_sliding_window=False, sliding_window=32768, max_window_layers=21)
qwen3 = dict(qwen2, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=128,
             layer_types=["full_attention"] * 30)
gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
        "n_positions": 1024, "n_ctx": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
        "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
        "resid_pdrop": 0.1, "scale_attn_weights": True, "tie_word_embeddings": True}
for name, c in dict(llama=llama, llama31=llama31, v5=v5, mistral=mistral, qwen2=qwen2,
                    qwen3=qwen3, gpt2=gpt2).items():
    open(f"{out}/{name}", "w").write(json.dumps(c, indent=2))
PY

status=0
limit=(-max_total_time="$seconds")
[ -z "${FSDP_FUZZ_RUNS:-}" ] || limit=(-runs="$FSDP_FUZZ_RUNS")
for target in ${FSDP_FUZZ_TARGETS:-safetensors index dcp_hf tokenizer_json tokenizer_encode token_shard hf_config}; do
  log="$work/fuzz_$target.log"
  dict=()
  case "$target" in
    safetensors|index|dcp_hf|tokenizer_json|hf_config) dict=(-dict="$PWD/tests/fuzz/json.dict") ;;
  esac
  ( cd "$work" && ./fuzz_$target "${limit[@]}" -max_len="${FSDP_FUZZ_MAX_LEN:-65536}" -timeout=10 \
      -rss_limit_mb=2048 "${dict[@]}" -print_final_stats=1 \
      -artifact_prefix="$work/crash_${target}_" "corpus_$target" ) >"$log" 2>&1 || status=1
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  crashes=$(find "$work" -maxdepth 1 -name "crash_${target}_*" | wc -l)
  corpus=$(ls "$work/corpus_$target" | wc -l)
  took=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | grep -o 'in [0-9]*' | tail -1 || true)
  echo "fuzz_$target: $runs runs ${took:-in ${seconds}}s, corpus $corpus inputs, crashes found: $crashes"
  if [ "$crashes" != 0 ]; then tail -40 "$log"; status=1; fi
done
exit $status
