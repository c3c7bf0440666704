"""BitLinear of BitNet b1.58 (Ma et al. 2024, arXiv:2402.17764): ternary weights, 8-bit activations.

Weights: W_q = clip(round(W / s), -1, 1) * s with s = mean|W| (absmean, one scale per matrix).
Activations: absmax per token to int8, x_q = clip(round(x * 127 / max|x|), -128, 127) * max|x| / 127.
Both quantisers pass gradients straight through (STE: d x_q / d x = 1), so the full-precision master
weights are what the optimizer updates. Parameter names are those of nn.Linear, so a checkpoint loads
into the plain and the converted model alike. (The paper's extra LayerNorm before the quantiser is not
added: the blocks' own pre-norm already sits there.)
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def ternary(w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    s = w.abs().mean().clamp_min(eps)
    return (w / s).round().clamp(-1, 1) * s


def absmax_int8(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    s = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp_min(eps)
    return (x * s).round().clamp(-128, 127) / s


def ste(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """q in the forward pass, the identity's gradient in the backward pass."""
    return x + (q - x).detach()


class BitLinear(nn.Linear):
    def forward(self, x):
        w = ste(self.weight, ternary(self.weight))
        return F.linear(ste(x, absmax_int8(x)), w, self.bias)


def to_bitlinear(linear: nn.Linear) -> BitLinear:
    """The same module object's parameters, now quantised in the forward pass."""
    linear.__class__ = BitLinear
    return linear
