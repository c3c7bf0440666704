"""Shared transformer parts: attention backends, MLPs and norms (registries `attention`, `mlp`, `norm`), embeddings."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.errors import GenlabError
from genlab.registry import attention_registry, mlp_registry, norm_registry


@attention_registry.register("sdpa", "softmax attention via F.scaled_dot_product_attention (flash/cuDNN/efficient kernels)")
def sdpa_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, dropout_p=dropout_p)


def _sdpa_with(backend_name):
    """SDPA restricted to one kernel on CUDA (same function; for ablating flash vs cuDNN vs efficient)."""
    def attend(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
        if not q.is_cuda:
            return sdpa_attention(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                                  dropout_p=dropout_p)
    return attend


attention_registry.register("sdpa_flash", "SDPA forced to the flash kernel on CUDA (plain sdpa on CPU)")(_sdpa_with("FLASH_ATTENTION"))
attention_registry.register("sdpa_cudnn", "SDPA forced to cuDNN attention on CUDA (plain sdpa on CPU)")(_sdpa_with("CUDNN_ATTENTION"))
attention_registry.register("sdpa_efficient", "SDPA forced to the memory-efficient kernel on CUDA (plain sdpa on CPU)")(_sdpa_with("EFFICIENT_ATTENTION"))


@attention_registry.register("sdpa_contiguous", "SDPA on contiguous copies of q/k/v instead of strided views of the fused QKV output")
def sdpa_contiguous_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    # A standalone H100 test timed cuDNN SDPA fwd+bwd at 1.35 ms on contiguous q/k/v against 2.46 ms on the
    # packed views (docs/benchmarks.md); whether the copies pay for themselves end to end is what this ablates.
    return sdpa_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, mask=mask, dropout_p=dropout_p)


@attention_registry.register("math", "naive softmax attention in plain torch ops (reference)")
def math_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    scale = q.shape[-1] ** -0.5
    att = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n, m = q.shape[-2], k.shape[-2]
        keep = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
        att = att.masked_fill(~keep, float("-inf"))
    if mask is not None:
        att = att.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else att + mask
    att = att.softmax(-1)
    return (F.dropout(att, dropout_p) if dropout_p > 0 else att) @ v


_BLOCK_MASKS = {}


@attention_registry.register("flex", "FlexAttention (torch.nn.attention.flex_attention; compiled on CUDA, forward-only on CPU)")
def flex_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as flex
    if mask is not None or dropout_p > 0:
        raise GenlabError("model.attention=flex supports neither explicit masks nor attention dropout; use sdpa or math")
    block_mask = None
    if causal:
        n, m = q.shape[-2], k.shape[-2]
        key = (n, m, str(q.device))
        if key not in _BLOCK_MASKS:  # built once per shape: creating a block mask costs more than the attention
            _BLOCK_MASKS[key] = create_block_mask(lambda b, h, qi, ki: qi + (m - n) >= ki, None, None, n, m, device=q.device)
        block_mask = _BLOCK_MASKS[key]
    run = _compiled_flex() if q.is_cuda else flex  # eager flex is a slow reference; its kernels come from compile
    return run(q, k, v, block_mask=block_mask)


flex_attention.cpu_backward = False  # torch implements FlexAttention's backward for CUDA only


_FLEX = []


def _compiled_flex():
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention as flex
        _FLEX.append(torch.compile(flex, dynamic=False))
    return _FLEX[0]


class Attention(nn.Module):
    """Multi-head self-attention with one fused QKV projection. Causality is a call argument, never a default."""

    def __init__(self, dim: int, heads: int, backend: str = "sdpa", qk_norm: bool = False, bias: bool = True,
                 attn_dropout: float = 0.0):
        super().__init__()
        self.attn_dropout = attn_dropout  # dropout on the attention probabilities (nanoGPT's attn_dropout)
        assert dim % heads == 0, f"dim {dim} not divisible by heads {heads}"
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.q_norm = nn.RMSNorm(dim // heads) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(dim // heads) if qk_norm else nn.Identity()
        self.attend = attention_registry.get(backend)
        getattr(self.attend, "check", lambda head_dim: None)(dim // heads)  # e.g. triton: GenlabError before training

    def forward(self, x, causal: bool = False, rope=None, mask=None):
        B, N, D = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        extra = {"dropout_p": self.attn_dropout} if self.attn_dropout > 0 and self.training else {}
        out = self.attend(q, k, v, causal=causal, mask=mask, **extra)
        return self.proj(out.transpose(1, 2).reshape(B, N, D))


class Mlp(nn.Module):
    """Two-layer MLP; SwiGLU (Shazeer 2020) packs its gate and value into fc1."""

    def __init__(self, dim: int, hidden: int, kind: str = "gelu", bias: bool = True):
        super().__init__()
        self.kind = kind
        if kind == "swiglu":
            self.fc1 = nn.Linear(dim, 2 * hidden, bias=bias)
        elif kind == "gelu":
            self.fc1 = nn.Linear(dim, hidden, bias=bias)
        else:
            raise ValueError(f"unknown mlp '{kind}'; valid: gelu, swiglu")
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        h = self.fc1(x)
        if self.kind == "swiglu":
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


# MLP entries: (dim, hidden, bias) -> module, where `hidden` is the GELU-MLP width of model.mlp_ratio; each entry
# maps it to its own width (`hidden_of`) and says how many dim x hidden matrices it multiplies (`matrices`, FLOPs).
@mlp_registry.register("gelu", "Linear -> GELU (tanh) -> Linear")
def gelu_mlp(dim: int, hidden: int, bias: bool = True) -> Mlp:
    return Mlp(dim, hidden, "gelu", bias)


gelu_mlp.hidden_of = lambda hidden: hidden
gelu_mlp.matrices = 2


@mlp_registry.register("swiglu", "SwiGLU: Linear -> silu(a) * b -> Linear, 2/3 of the width (same parameters as GELU)")
def swiglu_mlp(dim: int, hidden: int, bias: bool = True) -> Mlp:
    return Mlp(dim, swiglu_mlp.hidden_of(hidden), "swiglu", bias)


# three matrices: 2/3 of the width keeps the parameter count of a GELU MLP, rounded up to 64
swiglu_mlp.hidden_of = lambda hidden: 64 * -(-(2 * hidden // 3) // 64)
swiglu_mlp.matrices = 3


# norm entries: (dim, bias, affine, eps) -> module; affine=False for adaLN, which brings its own scale and shift
@norm_registry.register("layernorm", "LayerNorm (Ba et al. 2016)")
def layernorm(dim: int, bias: bool = True, affine: bool = True, eps: float | None = None) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps or 1e-5, elementwise_affine=affine, bias=bias and affine)


@norm_registry.register("rmsnorm", "RMSNorm (Zhang & Sennrich 2019): no mean subtraction, no bias")
def rmsnorm(dim: int, bias: bool = True, affine: bool = True, eps: float | None = None) -> nn.Module:
    return nn.RMSNorm(dim, eps=eps, elementwise_affine=affine)


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of a float timestep per sample (Vaswani et al.; as in DiT)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbedder(nn.Module):
    """t in [0, 1] -> sinusoidal features (scaled to [0, 1000] like DiT) -> MLP."""

    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t):
        return self.mlp(timestep_embedding(t * 1000.0, self.freq_dim).to(self.mlp[0].weight.dtype))


def sincos_2d(dim: int, grid_h: int, grid_w: int) -> np.ndarray:
    """Fixed 2-D sin-cos positional embedding [grid_h*grid_w, dim] (MAE / DiT): half the channels per axis."""
    assert dim % 4 == 0, "sin-cos 2-D embedding needs dim divisible by 4"

    def one_axis(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    gh, gw = np.meshgrid(np.arange(grid_h, dtype=np.float64), np.arange(grid_w, dtype=np.float64), indexing="ij")
    return np.concatenate([one_axis(dim // 2, gw), one_axis(dim // 2, gh)], axis=1).astype(np.float32)


def rope_cache(seq_len: int, head_dim: int, base: float = 10000.0, device=None):
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, rope):
    """Rotary position embedding (Su et al. 2021) on the last dim, pairs (even, odd)."""
    cos, sin = rope
    n = x.shape[-2]
    cos, sin = cos[:n].to(x.dtype), sin[:n].to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.flatten(-2)
