"""Speed switches chosen by name: precision, compile, activation checkpointing.

Each is a small function so the sweep can ablate it with one override.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from genlab.errors import GenlabError
from genlab.registry import ac_registry, compile_registry, precision_registry


# -- precision --------------------------------------------------------------------------------
@dataclass
class Precision:
    name: str
    autocast_dtype: torch.dtype | None = None   # None = no autocast
    loss_scaling: bool = False                  # fp16 needs a GradScaler
    tf32: bool = False
    float8: str | None = None                   # torchao recipe name

    def autocast(self, device: torch.device):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype)


@precision_registry.register("auto", "bf16 autocast on CUDA, fp32 on CPU")
def _auto(device):
    return _bf16(device) if device.type == "cuda" else _fp32(device)


@precision_registry.register("fp32", "full float32 (matmuls in IEEE fp32)")
def _fp32(device):
    return Precision("fp32")


@precision_registry.register("tf32", "float32 weights, TF32 tensor-core matmuls (CUDA)")
def _tf32(device):
    return Precision("tf32", tf32=True)


@precision_registry.register("bf16", "bf16 autocast, fp32 master weights and optimizer state")
def _bf16(device):
    return Precision("bf16", autocast_dtype=torch.bfloat16)


@precision_registry.register("fp16", "fp16 autocast with dynamic loss scaling (skips overflowing steps)")
def _fp16(device):
    return Precision("fp16", autocast_dtype=torch.float16, loss_scaling=True)


def build_precision(name: str, device: torch.device) -> Precision:
    p = precision_registry.get(name)(device)
    torch.backends.cuda.matmul.allow_tf32 = p.tf32
    torch.backends.cudnn.allow_tf32 = p.tf32
    return p


# -- activation checkpointing -------------------------------------------------------------------
class Checkpointed(nn.Module):
    """Recompute the wrapped block in the backward pass instead of storing its activations."""

    def __init__(self, block: nn.Module, context_fn=None):
        super().__init__()
        self.block = block
        self.context_fn = context_fn

    def forward(self, *args, **kwargs):
        extra = {"context_fn": self.context_fn} if self.context_fn is not None else {}
        return checkpoint(self.block, *args, use_reentrant=False, **extra, **kwargs)


# ops whose outputs the selective policy keeps (the expensive ones); everything else is recomputed
_SAVE_OPS = {
    torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def _wrap_blocks(model, which, context_fn=None):
    blocks = model.blocks
    for i in range(len(blocks)):
        if which(i):
            blocks[i] = Checkpointed(blocks[i], context_fn)
    return model


@ac_registry.register("none", "store all activations")
def ac_none(model, tcfg):
    return model


@ac_registry.register("full", "recompute every block in the backward pass")
def ac_full(model, tcfg):
    return _wrap_blocks(model, lambda i: True)


@ac_registry.register("every_k", "recompute every train.ac_every-th block")
def ac_every_k(model, tcfg):
    k = max(1, tcfg.ac_every)
    return _wrap_blocks(model, lambda i: i % k == 0)


@ac_registry.register("selective", "op-level policy: keep matmul/attention outputs, recompute the rest")
def ac_selective(model, tcfg):
    return _wrap_blocks(model, lambda i: True, context_fn=_selective_context)


# -- compile ------------------------------------------------------------------------------------
@compile_registry.register("off", "eager")
def compile_off(model, tcfg):
    return model


@compile_registry.register("model", "torch.compile the whole model")
def compile_model(model, tcfg):
    return torch.compile(model)


@compile_registry.register("blocks", "torch.compile each block (composes with FSDP and checkpointing)")
def compile_blocks(model, tcfg):
    for i, block in enumerate(model.blocks):
        model.blocks[i] = torch.compile(block)
    return model


def apply_switches(model, tcfg):
    model = ac_registry.get(tcfg.activation_checkpointing)(model, tcfg)
    return model


def compile_model_by_name(model, tcfg):
    return compile_registry.get(tcfg.compile)(model, tcfg)


