#!/usr/bin/env python3
"""PyTorch reference for fsdp-train: the same GPT-2 or Llama, weights and token batches, trained
with PyTorch FSDP2 (fully_shard), DDP or a single process, on the CPU over gloo, or with
--device cuda on GPUs over NCCL.

A reference, not product code. It exists so that fsdp-train's numbers can be checked step by
step against PyTorch's own FSDP2 (tests/tools/test_fsdp2_parity.cpp) and timed side by side
with it (bench/fsdp2_side_by_side.sh).

    # fsdp-train writes the initial weights and the batches it trains on:
    fsdp-train --nproc 1 --steps 0 --export init/model.safetensors
    fsdp-train --nproc 2 --steps 10 --dump-batches b.bin --metrics ours.jsonl --export ours/model.safetensors
    # the same run in FSDP2:
    python3 bench/reference/fsdp2_reference.py --mode fsdp2 --nproc 2 \
        --init init/model.safetensors --batches b.bin --metrics ref.jsonl --export ref.safetensors

What has to match fsdp-train (tools/fsdp_train/trainer.cpp, models/gpt2/gpt2.cpp,
models/llama/llama.cpp); config.json beside --init (written by --export) says which model:
- GPT-2: pre-LayerNorm blocks, GELU (tanh), causal scaled_dot_product_attention, learned
  positions, lm_head tied to wte, no dropout, nn.Linear's [out, in] weights, LayerNorm eps
  from config.json;
- Llama (model_type "llama"): LlamaForCausalLM's names, RMSNorm in float32, rotary embeddings
  (rope_theta, llama3 rope_scaling) computed with transformers' float32 operations,
  rotate_half, key/value heads repeated for grouped-query attention, causal
  scaled_dot_product_attention, SwiGLU, no biases, lm_head tied or not; every decoder layer a
  fully_shard unit;
- the weights: --init is fsdp-train's --export (Hugging Face layout: Conv1D weights c_attn,
  c_proj, c_fc stored [in, out], transposed here);
- the data: --batches is fsdp-train's --dump-batches: per step, K micro-batches of B rows
  over all ranks; rank r trains on rows [r*B/W, (r+1)*B/W) of each, each micro-batch loss
  divided by K before backward (K > 1: gradient accumulation, see --accum-mode);
- the optimizer: AdamW(lr, betas (0.9, 0.95), eps 1e-8 (torch::optim::AdamW's default too),
  weight_decay on 2-D and larger parameters only, as fsdp-train; --decay-all: on every one),
  single-tensor implementation (foreach=False; CPU's default anyway; --adamw-foreach: the
  multi-tensor one, torch's default on CUDA, for speed comparisons); gradient
  clipping with torch.nn.utils.clip_grad_norm_(max_norm), norm reported before clipping;
- the reported loss: the mean over ranks and micro-batches of the micro-batch mean losses;
- fp16 (--param-dtype fp16): torch.amp.GradScaler(init_scale, growth_factor, backoff_factor,
  growth_interval as fsdp-train's flags): each micro-batch's loss scaled, unscale_ before
  clipping, step and update; the scale each step used is written as loss_scale, and a step whose
  gradients overflowed has grad_norm null;
- threads: each of W local ranks uses cpu_count // W intra-op threads, as fsdp-train does.
- --device cuda: rank r trains on GPU r mod the GPU count, over NCCL. With more ranks than GPUs
  each rank gets its own NCCL_HOSTID (and NCCL_SOCKET_IFNAME=lo unless set), so that NCCL
  accepts several ranks on one GPU, as bench/gpu/run.sh does for fsdp-train.

Modes: fsdp2 (fully_shard on every block, then the root, over a 1-D mesh of W ranks, or with
--replicate R an (R, W / R) HSDP mesh; FSDP2's per-unit reduction settings from flags), ddp
(DistributedDataParallel, the counterpart of --strategy no_shard) and single (one process on
the whole global batch, no torch.distributed: the counterpart of --no-fsdp).

Output: --metrics gets one JSON object per step, like fsdp-train's: step, loss, grad_norm,
tokens_per_s, step_s and ranks (per rank: param_bytes, grad_bytes, optim_bytes, payload bytes
of the all_gather_into_tensor / reduce_scatter_tensor calls FSDP2 makes (all-gather: output
size, reduce-scatter: input size, as fsdp-train counts them), all_reduce_bytes (DDP: the
gradients), sent_bytes (what this process wrote to sockets and files during the step, from
/proc/self/io wchar) and peak_rss_bytes (VmHWM); with --device cuda also
cuda_peak_allocated_bytes and cuda_peak_reserved_bytes, the caching allocator's peaks so far).
--export writes the final parameters in the same Hugging Face layout as fsdp-train's --export.

Checkpoints in PyTorch DCP's Hugging Face layout, to move a job between FSDP2 and fsdp-train
(--mode fsdp2, torch.optim.AdamW): --save-dcp DIR --save-dcp-step K saves the model and the
AdamW state after step K with torch.distributed.checkpoint's HuggingFaceStorageWriter
(save_distributed=True) into DIR/model and DIR/optim, which fsdp-train --resume DIR continues;
--resume-dcp DIR loads them with HuggingFaceStorageReader from such a directory (fsdp-train
--checkpoint-format dcp-hf writes one per step, ROOT/step_<n>) and trains the steps after the
checkpoint's. See save_dcp for what goes where and why.

A failure is never silent: an exception in any rank ends the run with a non-zero exit and the
PyTorch error on stderr.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensor_parallel  # noqa: E402  (beside this file)

# ---- safetensors (tiny, dependency-free) -------------------------------------------------------

_ST_DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16,
              "F16": torch.float16, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        dtype = _ST_DTYPES[e["dtype"]]
        raw = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ---- the model: models/gpt2/gpt2.cpp in PyTorch --------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.head_dim = c["n_embd"] // c["n_head"]
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"])

    def forward(self, x):
        b, t, _ = x.shape
        # Thirds, not widths of x: under tensor parallelism c_attn's output is this rank's
        # [q_r, k_r, v_r] (tensor_parallel.interleave_packed), and the heads are heads / tp.
        q, k, v = self.c_attn(x).chunk(3, dim=2)

        def heads(z):
            return z.view(b, t, -1, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"])
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c["layer_norm_epsilon"]
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=eps)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=eps)
        self.mlp = MLP(c)

    def forward(self, x):
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])

    def forward(self, idx):
        pos = torch.arange(idx.size(1), dtype=idx.dtype, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, one Parameter

    def forward(self, idx):
        return self.lm_head(self.transformer(idx))


_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def from_hf(name, t, config):
    """(our name, tensor) of a Hugging Face entry, or None for entries we do not hold."""
    if config.get("model_type") == "llama":
        if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and
                                                     config["tie_word_embeddings"]):
            return None
        return name, t
    if not name.startswith("transformer.") and not name.startswith("lm_head."):
        name = "transformer." + name
    if name == "lm_head.weight" or name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
        return None
    return name, (t.t().contiguous() if name.endswith(_CONV1D) else t)


def to_hf(name, t, config):
    if config.get("model_type") == "llama":
        return None if name == "lm_head.weight" and config["tie_word_embeddings"] else (name, t)
    if name == "lm_head.weight":
        return None
    return name, (t.t().contiguous() if name.endswith(_CONV1D) else t)


def load_config(init_path):
    path = os.path.join(os.path.dirname(os.path.abspath(init_path)), "config.json")
    with open(path) as f:
        hf = json.load(f)
    if hf.get("model_type") == "llama":
        return dict({k: hf.get(k) for k in _LLAMA_KEYS}, model_type="llama")
    return {k: hf[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
                               "layer_norm_epsilon")}


def build_model(config, init_path):
    torch.manual_seed(0)  # values are overwritten below; this only makes construction repeatable
    model = LlamaForCausalLM(config) if config.get("model_type") == "llama" else GPT2LMHead(config)
    state = {}
    for name, t in load_safetensors(init_path).items():
        kv = from_hf(name, t, config)
        if kv is not None:
            state[kv[0]] = kv[1].to(torch.float32)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    if missing or unexpected:
        raise RuntimeError(f"{init_path}: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(p.shape) != tuple(state[name].shape):
                raise RuntimeError(f"{init_path}: {name} has shape {tuple(state[name].shape)}, "
                                   f"the model wants {tuple(p.shape)}")
            p.copy_(state[name])
    return model


# ---- the model: models/llama/llama.cpp in PyTorch -----------------------------------------------

def llama_inv_freq(c):
    """transformers' default / llama3 rope inverse frequencies, with its float32 operations."""
    dim = c["hidden_size"] // c["num_attention_heads"]
    base = c["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    s = c["rope_scaling"]
    if not s:
        return inv_freq
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaRMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, c, inv_freq):
        super().__init__()
        d = c["hidden_size"]
        self.n_heads, self.n_kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = d // self.n_heads
        self.inv_freq = inv_freq  # a plain attribute: no buffer, nothing to shard or save
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape

        def heads(z):  # the head count from z: tensor parallelism leaves heads / tp per rank
            return z.view(b, t, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        positions = torch.arange(t, dtype=torch.int64, device=x.device).to(torch.float)
        freqs = positions.unsqueeze(1) * self.inv_freq.to(x.device).unsqueeze(0)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).contiguous().view(b, t, -1))


class LlamaMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c, inv_freq):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = LlamaAttention(c, inv_freq)
        self.post_attention_layernorm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = LlamaMLP(c)

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        inv_freq = llama_inv_freq(c)
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(c, inv_freq)
                                    for _ in range(c["num_hidden_layers"]))
        self.norm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = LlamaModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, idx):
        return self.lm_head(self.model(idx))


_LLAMA_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
               "rope_scaling", "tie_word_embeddings")


# ---- batches: fsdp-train --dump-batches ----------------------------------------------------------

def load_batches(path):
    """(B, T, K, steps): steps is a list of (step, [(inputs, targets)] * K), each [B, T] int64,
    from the format documented at TrainerOptions::dump_batches_path (tools/fsdp_train/trainer.h)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"FSDPBAT1":
        raise RuntimeError(f"{path}: not an fsdp-train --dump-batches file (magic {data[:8]!r})")
    b, t, k = struct.unpack("<qqq", data[8:32])
    record = 16 + 16 * b * t
    body = data[32:]
    if len(body) % (record * k):
        raise RuntimeError(f"{path}: {len(body)} bytes after the header is not a whole number "
                           f"of steps of {k} x {record}-byte records (B={b}, T={t})")
    steps = []
    for i in range(len(body) // record):
        chunk = bytearray(body[i * record:(i + 1) * record])
        step, micro = struct.unpack("<qq", chunk[:16])
        v = torch.frombuffer(chunk[16:], dtype=torch.int64)
        pair = (v[:b * t].reshape(b, t).clone(), v[b * t:].reshape(b, t).clone())
        if micro == 0:
            steps.append((step, []))
        if micro != len(steps[-1][1]) or step != steps[-1][0]:
            raise RuntimeError(f"{path}: record {i} is step {step} micro-batch {micro}, expected "
                               f"step {steps[-1][0]} micro-batch {len(steps[-1][1])}")
        steps[-1][1].append(pair)
    return b, t, k, steps


# ---- accounting ------------------------------------------------------------------------------

def _proc_field(path, key):
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def peak_rss_bytes():
    return _proc_field("/proc/self/status", "VmHWM:") * 1024


def written_bytes():
    return _proc_field("/proc/self/io", "wchar:")


class CommCounter:
    """Counts the payload bytes of the collectives FSDP2 calls through torch.distributed."""

    def __init__(self):
        self.all_gather = 0
        self.reduce_scatter = 0
        ag, rs = dist.all_gather_into_tensor, dist.reduce_scatter_tensor

        def counted_ag(output_tensor, input_tensor, *a, **k):
            self.all_gather += output_tensor.numel() * output_tensor.element_size()
            return ag(output_tensor, input_tensor, *a, **k)

        def counted_rs(output, input, *a, **k):
            self.reduce_scatter += input.numel() * input.element_size()
            return rs(output, input, *a, **k)

        dist.all_gather_into_tensor = counted_ag
        dist.reduce_scatter_tensor = counted_rs

    def reset(self):
        self.all_gather = self.reduce_scatter = 0


def quantize_int8_blockwise(x, block):
    """Blockwise symmetric int8 of a flat tensor (fsdp::quantize_int8_blockwise's rule, written
    here from torch ops): scale = absmax(block) / 127, q = round(x / scale) clamped to +-127."""
    x = x.float()
    blocks = -(-x.numel() // block)
    padded = F.pad(x, (0, blocks * block - x.numel())).view(blocks, block)
    scales = padded.abs().amax(dim=1) / 127.0
    divisors = torch.where(scales == 0, torch.ones_like(scales), scales).unsqueeze(1)
    q = (padded / divisors).round().clamp(-127, 127).to(torch.int8)
    return q.view(-1)[:x.numel()].contiguous(), scales


def dequantize_int8_blockwise(q, scales, block, out):
    blocks = scales.numel()
    padded = F.pad(q.float(), (0, blocks * block - q.numel())).view(blocks, block)
    out.copy_((padded * scales.unsqueeze(1)).view(-1)[:q.numel()])


def int8_all_gather_class():
    """ZeRO++ qwZ as an FSDP2 custom AllGather (FSDPModule.set_custom_all_gather): each rank
    quantizes its all-gather input, the int8 values and fp32 scales are all-gathered, and every
    rank's part is dequantized into FSDP2's output buffer. Synchronous (returns no Work)."""
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather

    class Int8AllGather(AllGather):
        def __init__(self, block):
            self.block = block

        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            world, n = group.size(), input_tensor.numel()
            # FSDP2's input is a view into the output: quantize before anything overwrites it.
            q, scales = quantize_int8_blockwise(input_tensor, self.block)
            all_q = torch.empty(world * n, dtype=torch.int8, device=q.device)
            all_scales = torch.empty(world * scales.numel(), dtype=torch.float32, device=q.device)
            dist.all_gather_into_tensor(all_q, q, group=group)
            dist.all_gather_into_tensor(all_scales, scales, group=group)
            for r in range(world):
                dequantize_int8_blockwise(all_q[r * n:(r + 1) * n],
                                          all_scales[r * scales.numel():(r + 1) * scales.numel()],
                                          self.block, output_tensor[r * n:(r + 1) * n])
            return None

    return Int8AllGather


def parse_all_gather(value):
    """--all-gather: None for fp, the block size for int8 (256) or int8:BLOCK."""
    if value == "fp":
        return None
    if value == "int8":
        return 256
    if value.startswith("int8:") and value[5:].isdigit() and int(value[5:]) >= 1:
        return int(value[5:])
    raise argparse.ArgumentTypeError(f"--all-gather must be fp, int8 or int8:BLOCK, got {value!r}")


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class LibTorchAdamW(torch.optim.Optimizer):
    """torch::optim::AdamW's arithmetic, operation for operation (torch/csrc/api/src/optim/
    adamw.cpp), for --adamw libtorch. It differs from torch.optim.AdamW only in updating the
    first moment with mul_ and add_ where Python uses lerp_, which rounds differently in the
    last bit. Alone that is invisible (1e-7), but with bf16 parameters a last-bit difference
    in an fp32 master weight sometimes flips its bf16 rounding, and AdamW then amplifies the
    gradient difference on elements with near-zero gradients; so to compare FSDP runtimes in
    bf16, both sides must use the same optimizer arithmetic."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = (group["lr"], group["betas"], group["eps"],
                                           group["weight_decay"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                param, grad = local(p), local(p.grad)
                if wd != 0:
                    param.mul_(1 - lr * wd)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                bias_correction1 = 1 - math.pow(beta1, state["step"])
                bias_correction2 = 1 - math.pow(beta2, state["step"])
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)


# ---- DCP checkpoints in the Hugging Face layout -------------------------------------------------

_FLAT = None  # StateDictOptions(flatten_optimizer_state_dict=True), made on first use


def _flat_options():
    global _FLAT
    if _FLAT is None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions
        _FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
    return _FLAT


def dcp_model_state(model):
    """The model's state dict with each parameter once: a tied one (lm_head.weight is
    transformer.wte.weight) only under its first name, since the HF writer refuses tensors that
    share memory (safetensors' rule)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    names = dict(model.named_parameters())
    return {k: v for k, v in get_model_state_dict(model).items() if k in names}


def dcp_optimizer_state(model, optimizer):
    """(the flattened optimizer state dict, its tensors): "state.<param>.exp_avg", "...exp_avg_sq"
    (DTensors sharded like their parameter) and "...step" (0-D). Its other entries
    (param_groups.<param>.lr, betas, ...) are plain values, which DCP writes as pickled BYTE_IO
    items into the same file stream as the safetensors bytes, corrupting an HF file: they stay
    out, and come from this run's flags on both sides (fsdp-train's checkpoints hold no learning
    rate either)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    state = get_optimizer_state_dict(model, optimizer, options=_flat_options())
    return state, {k: v for k, v in state.items() if torch.is_tensor(v)}


def save_dcp(path, model, optimizer):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    dcp.save(dcp_model_state(model),
             storage_writer=HuggingFaceStorageWriter(f"{path}/model", save_distributed=True))
    dcp.save(dcp_optimizer_state(model, optimizer)[1],
             storage_writer=HuggingFaceStorageWriter(f"{path}/optim", save_distributed=True))


def load_dcp(path, model, optimizer):
    """Loads save_dcp's layout (or fsdp-train's) into model and optimizer, each rank reading its
    own rows; returns the checkpoint's step (its AdamW steps)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    weights = dcp_model_state(model)
    dcp.load(weights, storage_reader=HuggingFaceStorageReader(f"{path}/model"))
    # strict=False: the tied lm_head.weight is not in it, and is wte's tensor anyway.
    set_model_state_dict(model, weights, options=StateDictOptions(strict=False))
    # get_optimizer_state_dict gives a fresh optimizer its state (a step at lr 0) to load into.
    state, tensors = dcp_optimizer_state(model, optimizer)
    dcp.load(tensors, storage_reader=HuggingFaceStorageReader(f"{path}/optim"))
    state.update(tensors)
    set_optimizer_state_dict(model, optimizer, state, options=_flat_options())
    return max(int(v.item()) for k, v in tensors.items() if k.endswith(".step"))


# ---- one rank ------------------------------------------------------------------------------

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def rank_device(rank, world, args):
    """This rank's device; on CUDA also set as current, with NCCL told to accept shared GPUs."""
    if args.device == "cpu":
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise RuntimeError("--device cuda: torch.cuda.device_count() is 0")
    if world > gpus:
        os.environ["NCCL_HOSTID"] = f"fsdp2-reference-rank-{rank}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    device = torch.device("cuda", rank % gpus)
    torch.cuda.set_device(device)
    return device


def train(rank, world, args):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = rank_device(rank, world, args)
    distributed = args.mode != "single"
    if distributed:
        # A file store needs no port: several runners started at once (ctest -j) cannot collide
        # on one, as they could between picking a free port and binding it.
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"file://{args.rendezvous_file}", rank=rank,
                                world_size=world)
    counter = CommCounter() if args.mode == "fsdp2" else None
    vocab_split = False  # --tp: logits split over the vocabulary (Shard(-1) DTensors)

    config = load_config(args.init)
    model = build_model(config, args.init).to(device)
    if args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.tensor import Shard
        # --replicate R: HSDP, an (R, W / R) mesh (fsdp-train --strategy hybrid_shard).
        # Both put consecutive ranks in a shard group.
        mesh = (init_device_mesh(device.type, (args.replicate, world // args.replicate),
                                 mesh_dim_names=("replicate", "shard"))
                if args.replicate > 1 else init_device_mesh(device.type, (world,)))
        if args.tp > 1:  # --tp N: the layers split over "tp" first, FSDP over "dp"
            world_mesh = tensor_parallel.mesh_2d(device.type, world, args.tp)
            layers = (model.model.layers if config.get("model_type") == "llama"
                      else model.transformer.h)
            tensor_parallel.parallelize_layers(layers, world_mesh["tp"], args.sequence_parallel)
            vocab_split = tensor_parallel.parallelize_root(model, world_mesh["tp"],
                                                           args.sequence_parallel)
            mesh = world_mesh["dp"]
        # --shard-dim D: FSDP2's shard_placement_fn, Shard(D) for parameters with more than D dims.
        d = args.shard_dim
        placement = (lambda p: Shard(d) if p.dim() > d else Shard(0)) if d > 0 else None
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[args.param_dtype] if args.param_dtype else None,
                                  reduce_dtype=DTYPES[args.reduce_dtype] if args.reduce_dtype else None)
        units = model.model.layers if config.get("model_type") == "llama" else model.transformer.h
        for block in units:
            fully_shard(block, mesh=mesh, reshard_after_forward=bool(args.reshard_after_forward),
                        mp_policy=mp, shard_placement_fn=placement)
        fully_shard(model, mesh=mesh, mp_policy=mp, shard_placement_fn=placement)
        for unit in list(units) + [model]:  # FSDP2's per-unit reduction settings
            if args.gradient_divide_factor:
                unit.set_gradient_divide_factor(args.gradient_divide_factor)
            unit.set_force_sum_reduction_for_comms(args.force_sum_reduction)
        if args.all_gather is not None:
            int8_all_gather = int8_all_gather_class()(args.all_gather)
            for unit in [*units, model]:
                unit.set_custom_all_gather(int8_all_gather)
        train_model = model
    elif args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        train_model = DistributedDataParallel(model)
    else:
        train_model = model

    params = list(model.parameters())  # the tied weight once, in named_parameters order
    # fsdp-train's param groups: weight decay on matrices and embeddings (2-D and up), none on
    # biases and norm weights; with --decay-all one group, everything decays.
    decays = [args.decay_all or p.dim() >= 2 for p in params]
    groups = [{"params": [p for p, d in zip(params, decays) if d],
               "weight_decay": args.weight_decay}]
    if not all(decays):
        groups.append({"params": [p for p, d in zip(params, decays) if not d],
                       "weight_decay": 0.0})
    if args.adamw == "torch":
        optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                      weight_decay=args.weight_decay,
                                      foreach=args.adamw_foreach)
    else:
        optimizer = LibTorchAdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=args.weight_decay)
    # fp16: dynamic loss scaling with torch.amp.GradScaler, as FSDP2's documentation prescribes
    # (its found_inf is all-reduced over the mesh by DTensor); fsdp-train's --init-scale etc.
    scaler = None
    if args.param_dtype == "fp16":
        scaler = torch.amp.GradScaler(
            device.type, init_scale=args.init_scale, growth_factor=args.growth_factor,
            backoff_factor=args.backoff_factor, growth_interval=args.growth_interval)
    b, t, accum, batches = load_batches(args.batches)
    if args.steps is not None:
        batches = batches[:args.steps]
    if args.resume_dcp:
        resumed = load_dcp(args.resume_dcp, model, optimizer)
        batches = [(step, micro) for step, micro in batches if step > resumed]
    # Under --tp a tp group's ranks train on the same rows: the batch is split over dp.
    data_world, data_rank = world // args.tp, rank // args.tp
    if b % data_world:
        raise RuntimeError(f"global batch {b} is not divisible by {data_world} ranks")
    rows = b // data_world

    metrics = open(args.metrics, "w") if rank == 0 and args.metrics else None
    for step, micro_batches in batches:
        start = time.perf_counter()
        sent0 = written_bytes()
        if counter:
            counter.reset()
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for k, (inputs, targets) in enumerate(micro_batches):
            sync = k == accum - 1 or args.accum_mode == "sync"
            if args.mode == "fsdp2" and args.accum_mode == "no-all-reduce":
                train_model.set_requires_all_reduce(k == accum - 1)
            elif args.mode == "fsdp2":
                train_model.set_requires_gradient_sync(sync)
            x = inputs[data_rank * rows:(data_rank + 1) * rows].to(device)
            y = targets[data_rank * rows:(data_rank + 1) * rows].to(device)
            if args.mode == "ddp" and not sync:
                with train_model.no_sync():
                    logits = train_model(x)
                    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                           y.reshape(-1))
                    (loss / accum).backward()
            else:
                logits = train_model(x)
                # In float32 whatever the logits' dtype, as fsdp's models::loss (and
                # transformers' and torchtitan's losses); vocabulary-split logits under
                # loss_parallel(), backward included, as torchtitan.
                with tensor_parallel.loss_parallel_if(vocab_split):
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), y.reshape(-1))
                    (scaler.scale(loss / accum) if scaler else loss / accum).backward()
                loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
            loss_sum += loss.detach().double().item()
        loss_scale = scaler.get_scale() if scaler else None
        if scaler:
            scaler.unscale_(optimizer)  # clipping sees the unscaled gradients
        norm = (tensor_parallel.clip_grad_norm_full(params, args.max_grad_norm) if args.tp > 1
                else torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm = norm.item()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        mean_loss = torch.tensor([loss_sum / accum], dtype=torch.float64, device=device)
        if distributed:
            dist.all_reduce(mean_loss)
        mean_loss = mean_loss.item() / world
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_s = time.perf_counter() - start
        sent = written_bytes() - sent0

        grads = [p.grad for p in params if p.grad is not None]
        state_bytes = sum(local(v).numel() * local(v).element_size()
                          for s in optimizer.state.values() for v in s.values()
                          if torch.is_tensor(v) and v.dim() > 0)
        mine = [
            sum(local(p).numel() * local(p).element_size() for p in params),
            sum(local(g).numel() * local(g).element_size() for g in grads),
            state_bytes,
            counter.all_gather if counter else 0,
            counter.reduce_scatter if counter else 0,
            sum(local(g).numel() * local(g).element_size() for g in grads) if args.mode == "ddp" else 0,
            sent,
            peak_rss_bytes(),
        ]
        keys = ["param_bytes", "grad_bytes", "optim_bytes", "all_gather_bytes",
                "reduce_scatter_bytes", "all_reduce_bytes", "sent_bytes", "peak_rss_bytes"]
        if device.type == "cuda":
            mine += [torch.cuda.max_memory_allocated(device),
                     torch.cuda.max_memory_reserved(device)]
            keys += ["cuda_peak_allocated_bytes", "cuda_peak_reserved_bytes"]
        stats = torch.tensor(mine, dtype=torch.float64, device=device)
        if distributed:
            everyone = [torch.empty_like(stats) for _ in range(world)]
            dist.all_gather(everyone, stats)
        else:
            everyone = [stats]
        if metrics:
            ranks = [dict(rank=r, **{k: int(v) for k, v in zip(keys, s.cpu().tolist())})
                     for r, s in enumerate(everyone)]
            # A step that overflowed in fp16 has no finite norm: null, as fsdp-train writes it.
            line = {"step": step, "loss": mean_loss,
                    "grad_norm": norm if math.isfinite(norm) else None,
                    "tokens_per_s": accum * b * t / step_s, "step_s": step_s, "ranks": ranks}
            if scaler:
                line["loss_scale"] = loss_scale
            metrics.write(json.dumps(line) + "\n")
            metrics.flush()
        if args.save_dcp and step == args.save_dcp_step:
            save_dcp(args.save_dcp, model, optimizer)
        if rank == 0 and not args.quiet:
            print(f"{args.mode} W={world} step {step} | loss {mean_loss:.6f} | grad norm "
                  f"{norm:.6f} | {accum * b * t / step_s:.0f} tokens/s", flush=True)

    if args.export:
        final = {}
        for name, p in model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            if args.tp > 1:  # GPT-2's c_attn rows back in [q; k; v] order
                full = tensor_parallel.global_rows(name, full, args.tp)
            kv = to_hf(name, full.detach().to(torch.float32), config)
            if kv is not None:
                final[kv[0]] = kv[1]
        if rank == 0:
            save_safetensors(args.export, final)
    if metrics:
        metrics.close()
    if distributed:
        dist.barrier()
        # Every file is written and closed, so leave without tearing the gloo group down: in
        # PyTorch 2.11 that teardown now and then aborts a rank ("terminate called without an
        # active exception", SIGABRT; seen once in about a dozen runs of the no-sync case).
        if world == 1:  # no parent outlives us to remove the rendezvous directory
            shutil.rmtree(os.path.dirname(args.rendezvous_file), ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _rank_main(rank, world, args):
    try:
        train(rank, world, args)
    except BaseException:
        sys.stderr.write(f"fsdp2_reference.py: rank {rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        os._exit(1)  # no waiting on peers that may be stuck in a collective


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["fsdp2", "ddp", "single"], default="fsdp2")
    p.add_argument("--nproc", type=int, default=1, help="ranks (single: must be 1)")
    p.add_argument("--init", required=True, help="fsdp-train --export of the initial weights "
                   "(config.json beside it)")
    p.add_argument("--batches", required=True, help="fsdp-train --dump-batches file")
    p.add_argument("--steps", type=int, default=None, help="train on the first N batches only")
    p.add_argument("--metrics", help="one JSON object per step (rank 0)")
    p.add_argument("--export", help="final parameters, in fsdp-train --export's layout")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--decay-all", action="store_true",
                   help="weight decay on every parameter, as fsdp-train --decay-all (default: "
                        "2-D and larger parameters only)")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--reshard-after-forward", type=int, choices=[0, 1], default=1)
    p.add_argument("--shard-dim", type=int, default=0,
                   help="fsdp2: Shard(D) for every parameter with more than D dims, Shard(0) for "
                        "the others (shard_placement_fn; FSDP2 needs W to divide those sizes)")
    p.add_argument("--param-dtype", choices=list(DTYPES), default=None)
    p.add_argument("--reduce-dtype", choices=list(DTYPES), default=None)
    p.add_argument("--init-scale", type=float, default=2.0**16,
                   help="fp16: torch.amp.GradScaler's init_scale (as fsdp-train's flag)")
    p.add_argument("--growth-factor", type=float, default=2.0)
    p.add_argument("--backoff-factor", type=float, default=0.5)
    p.add_argument("--growth-interval", type=int, default=2000)
    p.add_argument("--accum-mode", choices=["no-sync", "sync", "no-all-reduce"],
                   default="no-sync",
                   help="with K > 1 micro-batches per step in --batches: no-sync reduces "
                        "gradients only after the last (FSDP2 set_requires_gradient_sync(False) "
                        "/ DDP no_sync before it); sync after every one; no-all-reduce (HSDP, "
                        "--replicate): reduce-scatters after every one and all-reduces across "
                        "replicas after the last (FSDP2 set_requires_all_reduce(False) before it)")
    p.add_argument("--tp", type=int, default=1,
                   help="fsdp2, Llama: tensor parallelism over N consecutive ranks "
                        "(bench/reference/tensor_parallel.py), FSDP over the W / N others, as "
                        "fsdp-train --tp N")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp N: sequence parallelism (torchtitan's plan), as fsdp-train "
                        "--sequence-parallel")
    p.add_argument("--replicate", type=int, default=1,
                   help="fsdp2: HSDP over an (R, W / R) mesh, as fsdp-train --strategy "
                        "hybrid_shard --replicate R")
    p.add_argument("--gradient-divide-factor", type=float, default=None,
                   help="fsdp2: set_gradient_divide_factor(F) on every unit. On gloo a factor "
                        "other than the shard size needs --force-sum-reduction (PyTorch then "
                        "sums and divides; without it FSDP2 asks gloo for NCCL's PreMulSum)")
    p.add_argument("--force-sum-reduction", action="store_true",
                   help="fsdp2: set_force_sum_reduction_for_comms(True) on every unit")
    p.add_argument("--adamw", choices=["torch", "libtorch"], default="torch",
                   help="torch: torch.optim.AdamW; libtorch: torch::optim::AdamW's arithmetic "
                        "(see LibTorchAdamW)")
    p.add_argument("--adamw-foreach", action="store_true",
                   help="torch.optim.AdamW's multi-tensor implementation (its default on CUDA), "
                        "for speed comparisons; without it the single-tensor one, for equality")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu (gloo) or cuda (NCCL; rank r on GPU r mod the GPU count)")
    p.add_argument("--all-gather", type=parse_all_gather, default=None,
                   help="fp (default) or int8[:BLOCK]: every unit's all-gather through an FSDP2 "
                        "custom AllGather that quantizes blockwise, as fsdp-train --all-gather")
    p.add_argument("--save-dcp", metavar="DIR",
                   help="fsdp2: after step --save-dcp-step, save the model and AdamW state with "
                        "DCP's HuggingFaceStorageWriter into DIR/model and DIR/optim")
    p.add_argument("--save-dcp-step", type=int, default=None)
    p.add_argument("--resume-dcp", metavar="DIR",
                   help="fsdp2: load the model and AdamW state from DIR/model and DIR/optim "
                        "with DCP's HuggingFaceStorageReader, then train the steps after its step")
    p.add_argument("--quiet", action="store_true")
    return p


def parse(p, argv):
    """The arguments of one run, checked; p.error (SystemExit 2) on a bad combination."""
    args = p.parse_args(argv)
    if args.mode == "single" and args.nproc != 1:
        p.error("--mode single runs one process; use --nproc 1")
    if args.mode != "fsdp2" and args.all_gather is not None:
        p.error("--all-gather int8 is an FSDP2 custom all-gather; use --mode fsdp2")
    if args.mode != "fsdp2" and (args.param_dtype or args.reduce_dtype):
        p.error("--param-dtype/--reduce-dtype are FSDP2's MixedPrecisionPolicy; use --mode fsdp2")
    if args.mode != "fsdp2" and (args.replicate != 1 or args.gradient_divide_factor or
                                 args.force_sum_reduction or args.accum_mode == "no-all-reduce"):
        p.error("--replicate, --gradient-divide-factor, --force-sum-reduction and --accum-mode "
                "no-all-reduce are FSDP2's; use --mode fsdp2")
    if args.replicate < 1 or args.nproc % args.replicate:
        p.error(f"--replicate {args.replicate} does not divide --nproc {args.nproc}")
    if (args.save_dcp or args.resume_dcp) and (args.mode != "fsdp2" or args.adamw != "torch"):
        p.error("--save-dcp/--resume-dcp are for --mode fsdp2 with --adamw torch")
    if bool(args.save_dcp) != (args.save_dcp_step is not None):
        p.error("--save-dcp DIR and --save-dcp-step K go together")
    if args.accum_mode == "no-all-reduce" and args.replicate == 1:
        p.error("--accum-mode no-all-reduce skips the all-reduce across replicas: give --replicate")
    return args


def run(args, isolated):
    """One run: its ranks forked (CPU) or spawned (CUDA). With isolated, a one-rank run is forked
    too, so that nothing it sets (threads, the process group, random state) reaches the next."""
    with tempfile.TemporaryDirectory(prefix="fsdp2_reference_") as tmp:
        args.rendezvous_file = os.path.join(tmp, "rendezvous")
        if args.nproc == 1 and not (isolated and args.device == "cpu"):
            train(0, 1, args)
            return
        import torch.multiprocessing as mp
        # On CPU the ranks are forked from this process, which has imported torch (and FSDP2)
        # but run no op yet, so no thread pool exists to be copied half-locked: each rank saves
        # the 3-4 s of CPU an import costs, most of a 10-step test's time. CUDA cannot be
        # forked into, so --device cuda spawns.
        if args.device == "cpu":
            import torch.distributed.fsdp  # noqa: F401  (imported once, before the fork)
        mp.start_processes(_rank_main, args=(args.nproc, args), nprocs=args.nproc, join=True,
                           start_method="fork" if args.device == "cpu" else "spawn")


def run_captured(fn):
    """Runs fn with this process's stdout and stderr (and so its forked ranks') going to a file;
    returns (whether it succeeded, what it printed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            fn()
            ok = True
        except BaseException:  # a rank's failure (ProcessRaisedException), SystemExit from p.error
            traceback.print_exc()
            ok = False
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out.seek(0)
        return ok, out.read().decode(errors="replace")


def run_jobs(p, path):
    """--jobs FILE: a JSON list of command lines (strings, shell-quoted), each one run as if it
    were this script's arguments, one after the other in this process, so Python and torch start
    once (tests/support/reference_cache.h). Writes FILE.status: per job, ok and its output.
    Exits 1 if any job failed, after running every one."""
    import shlex
    with open(path) as f:
        jobs = json.load(f)
    status = []
    for job in jobs:
        ok, output = run_captured(lambda: run(parse(p, shlex.split(job)), isolated=True))
        status.append({"ok": ok, "output": output})
        if not ok:
            sys.stderr.write(f"fsdp2_reference.py: job {job!r} failed:\n{output}\n")
    with open(path + ".status", "w") as f:
        json.dump(status, f)
    sys.exit(0 if all(s["ok"] for s in status) else 1)


def main():
    p = parser()
    if len(sys.argv) == 3 and sys.argv[1] == "--jobs":
        run_jobs(p, sys.argv[2])
    run(parse(p, sys.argv[1:]), isolated=False)


if __name__ == "__main__":
    main()
