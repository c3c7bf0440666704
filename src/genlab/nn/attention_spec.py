"""The attention registry (`model.attention`) and what an attention entry declares about itself. Its own module:
the entries live in nn/attention.py, nn/cudnn_attention.py and nn/triton_attention.py (which imports nothing of
nn/attention.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from genlab.core.registry import Registry, Spec
from genlab.nn.kernels import refuse_missing_package


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(Spec):
    cpu_backward: bool = True              # has a backward pass on the CPU
    flops: Callable | None = None          # flops(n, m, head_dim) of one head, n queries over m keys (None: softmax's)
    causal_flops: Callable | None = None   # the causal form's, where it runs different matmuls
    check: Callable | None = None          # check(head_dim): GenlabError at build time where it cannot run
    head_multiple: int = 1                 # the head width must be a multiple of this (checked with the config)
    # forward-mode AD (a JVP: MeanFlow's target) through the entry as it runs in training: plain torch ops have it,
    # fused kernels (SDPA's flash/cuDNN/efficient, flex, Triton) do not; attention.forward_ad_attention
    # then holds SDPA to its math kernel and runs `jvp_fallback` in the entry's place (the same function in ops
    # that have it; None = the entry itself, whose SDPA calls the math kernel then serves)
    forward_ad: bool = True
    jvp_fallback: Callable | None = None
    # the same function in ops that run under torch.vmap where the entry's kernels do not (SDPA's, for a bf16 model
    # on CUDA: batched seeds); attention.plain_softmax_attention swaps it in
    vmap_fallback: Callable | None = None
    # packed(h, heads, causal) -> o [B, heads, N, hd] straight from the fused QKV projection's output h [B, N, 3C],
    # which Attention runs where the layer allows it (no qk-norm, RoPE, mask or dropout; nn/cudnn_attention.py)
    packed: Callable | None = None
    package: str = ""                      # top-level module it imports on CUDA (checked with the config)

    def check_choice(self, cfg, key, name, registry):
        refuse_missing_package(self.package, key, name, registry)


attention_registry = Registry("attention", AttentionSpec)
