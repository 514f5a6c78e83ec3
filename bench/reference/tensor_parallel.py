"""FSDP2 + tensor parallelism for the reference runner (fsdp2_reference.py --tp N): PyTorch's own
parallelize_module with ColwiseParallel / RowwiseParallel on each Llama decoder layer over the
"tp" dimension of a (W / N, N) mesh, then fully_shard over "dp", as torchtitan composes them
and fsdp-train --tp does: the embedding table split over the vocabulary (RowwiseParallel), the
head too (ColwiseParallel into Shard(-1) logits) with the loss under loss_parallel() (when the
vocabulary divides by N; else both stay replicated here, while fsdp-train splits them unevenly:
no parity case uses such a vocabulary). With sequence parallelism (fsdp-train
--sequence-parallel), torchtitan's layer plan: the norms under SequenceParallel, attention's and
the MLP's inputs gathered by PrepareModuleInput, o and down reduce-scattering into sequence
shards; the embeddings' output in sequence shards, the final norm under SequenceParallel and the
head's input gathered. GPT-2 likewise (c_attn and c_fc column-wise, the c_proj row-wise, ln_1 and
ln_2 under SP, the positions' output scattered too, the tied head tied again after the split);
its packed c_attn is reordered so that a plain ColwiseParallel cuts rank r's q, k and v heads,
and put back in order for the export. A reference, not product code.
"""
import contextlib

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, loss_parallel,
                                               parallelize_module)

# Each decoder layer's plan: q/k/v and gate/up column-wise, o and down row-wise.
LLAMA_LAYER_PLAN = {
    "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise",
}


# GPT-2's block plan (fsdp-train's gpt2_block_tp_plan): c_attn (q, k and v packed) and c_fc
# column-wise, the two c_proj row-wise.
GPT2_LAYER_PLAN = {
    "attn.c_attn": "colwise", "attn.c_proj": "rowwise",
    "mlp.c_fc": "colwise", "mlp.c_proj": "rowwise",
}


def interleave_packed(t, tp):
    """c_attn's rows [q; k; v] reordered as [q_0; k_0; v_0; q_1; ...], rank r's blocks together,
    so that ColwiseParallel's contiguous Shard(0) gives rank r its q, k and v heads (as
    fsdp-train's packed column split does). PyTorch has no packed column style."""
    return t.reshape(3, tp, t.shape[0] // (3 * tp), *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def global_rows(name, full, tp):
    """A full parameter in the model's own layout: c_attn's rows back in [q; k; v] order."""
    if ".attn.c_attn." not in name:
        return full
    return full.reshape(tp, 3, full.shape[0] // (3 * tp), *full.shape[1:]).transpose(0, 1) \
        .reshape(full.shape)


def mesh_2d(device_type, world, tp):
    """A (dp, tp) mesh, tp innermost: consecutive ranks share a tp group, as fsdp-train's."""
    if world % tp:
        raise RuntimeError(f"--tp {tp} does not divide the world size {world}")
    return init_device_mesh(device_type, (world // tp, tp), mesh_dim_names=("dp", "tp"))


def gather_input():
    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))


def parallelize_layers(layers, tp_mesh, sequence_parallel=False):
    gpt2 = hasattr(layers[0], "attn")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {path: styles[kind]()
            for path, kind in (GPT2_LAYER_PLAN if gpt2 else LLAMA_LAYER_PLAN).items()}
    if sequence_parallel:
        attention, mlp = ("attn", "mlp") if gpt2 else ("self_attn", "mlp")
        rows = ("attn.c_proj", "mlp.c_proj") if gpt2 else ("self_attn.o_proj", "mlp.down_proj")
        norms = ("ln_1", "ln_2") if gpt2 else ("input_layernorm", "post_attention_layernorm")
        for row in rows:
            plan[row] = RowwiseParallel(output_layouts=Shard(1))
        for norm in norms:
            plan[norm] = SequenceParallel()
        plan[attention] = gather_input()
        plan[mlp] = gather_input()
    for layer in layers:
        if gpt2:
            with torch.no_grad():
                for p in layer.attn.c_attn.parameters():
                    p.copy_(interleave_packed(p, tp_mesh.size()))
        parallelize_module(layer, tp_mesh, plan)


def parallelize_root(model, tp_mesh, sequence_parallel):
    """The root's plan (fsdp-train's llama_root_tp_plan / gpt2_root_tp_plan). Returns whether the
    logits are split over the vocabulary, so that the loss must run under loss_parallel()."""
    gpt2 = hasattr(model, "transformer")
    embedding, norm = ("transformer.wte", "transformer.ln_f") if gpt2 else ("model.embed_tokens",
                                                                            "model.norm")
    vocab_split = model.lm_head.weight.shape[0] % tp_mesh.size() == 0
    stream = Shard(1) if sequence_parallel else Replicate()
    plan = {}
    if vocab_split:
        plan[embedding] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        plan["lm_head"] = ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1),
                                          use_local_output=False)
    elif sequence_parallel:
        plan[embedding] = PrepareModuleOutput(output_layouts=Replicate(),
                                              desired_output_layouts=Shard(1),
                                              use_local_output=True)
        plan["lm_head"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                             desired_input_layouts=(Replicate(),),
                                             use_local_output=True)
    if sequence_parallel:
        plan[norm] = SequenceParallel()
        if gpt2:  # the positions' [T, d] scattered along T beside the tokens' embeddings
            plan["transformer.wpe"] = PrepareModuleOutput(output_layouts=Replicate(),
                                                          desired_output_layouts=Shard(0),
                                                          use_local_output=True)
    if plan:
        parallelize_module(model, tp_mesh, plan)
    if gpt2:  # parallelize_module gave the head a Parameter of its own: tie it again
        model.lm_head.weight = model.transformer.wte.weight
    return vocab_split


def loss_parallel_if(on):
    return loss_parallel() if on else contextlib.nullcontext()


def clip_grad_norm_full(params, max_norm):
    """torch.nn.utils.clip_grad_norm_'s result and clipping, computed on full gradients: the
    parameters are DTensors on two meshes ((dp, tp) for the layers, dp alone for the root),
    whose norms torch's own function cannot stack together. Norm in float32, as torch's."""
    grads = [p.grad for p in params if p.grad is not None]
    full = [g.full_tensor() if isinstance(g, DTensor) else g for g in grads]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in full]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
