"""FSDP2 + tensor parallelism for the reference runner (fsdp2_reference.py --tp N): PyTorch's own
parallelize_module with ColwiseParallel / RowwiseParallel on each Llama decoder layer over the
"tp" dimension of a (W / N, N) mesh, then fully_shard over "dp", as torchtitan composes them
and fsdp-train --tp does: the embedding table split over the vocabulary (RowwiseParallel), the
head too (ColwiseParallel into Shard(-1) logits) with the loss under loss_parallel() (when the
vocabulary divides by N; else both stay replicated). With sequence parallelism (fsdp-train
--sequence-parallel), torchtitan's layer plan: the norms under SequenceParallel, attention's and
the MLP's inputs gathered by PrepareModuleInput, o and down reduce-scattering into sequence
shards; the embeddings' output in sequence shards, the final norm under SequenceParallel and the
head's input gathered. A reference, not product code.
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


def mesh_2d(device_type, world, tp):
    """A (dp, tp) mesh, tp innermost: consecutive ranks share a tp group, as fsdp-train's."""
    if world % tp:
        raise RuntimeError(f"--tp {tp} does not divide the world size {world}")
    return init_device_mesh(device_type, (world // tp, tp), mesh_dim_names=("dp", "tp"))


def gather_input():
    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))


def parallelize_layers(layers, tp_mesh, sequence_parallel=False):
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {path: styles[kind]() for path, kind in LLAMA_LAYER_PLAN.items()}
    if sequence_parallel:
        plan["self_attn.o_proj"] = RowwiseParallel(output_layouts=Shard(1))
        plan["mlp.down_proj"] = RowwiseParallel(output_layouts=Shard(1))
        plan["input_layernorm"] = SequenceParallel()
        plan["post_attention_layernorm"] = SequenceParallel()
        plan["self_attn"] = gather_input()
        plan["mlp"] = gather_input()
    for layer in layers:
        parallelize_module(layer, tp_mesh, plan)


def parallelize_root(model, tp_mesh, sequence_parallel):
    """The root's plan (fsdp-train's llama_root_tp_plan). Returns whether the logits are split
    over the vocabulary, so that the loss must run under loss_parallel()."""
    vocab_split = model.lm_head.weight.shape[0] % tp_mesh.size() == 0
    stream = Shard(1) if sequence_parallel else Replicate()
    plan = {}
    if vocab_split:
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(),
                                                     output_layouts=stream)
        plan["lm_head"] = ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1),
                                          use_local_output=False)
    elif sequence_parallel:
        plan["model.embed_tokens"] = PrepareModuleOutput(output_layouts=Replicate(),
                                                         desired_output_layouts=Shard(1),
                                                         use_local_output=True)
        plan["lm_head"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                             desired_input_layouts=(Replicate(),),
                                             use_local_output=True)
    if sequence_parallel:
        plan["model.norm"] = SequenceParallel()
    if plan:
        parallelize_module(model, tp_mesh, plan)
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
