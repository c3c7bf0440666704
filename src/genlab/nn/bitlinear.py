"""BitLinear of BitNet b1.58 (Ma et al. 2024, arXiv:2402.17764): ternary absmean weights (one scale per matrix),
int8 absmax activations per token, both with straight-through gradients; parameter names are nn.Linear's. The input
RMSNorm of `train.bitlinear_norm=rmsnorm` (b1.58's "Training Tips, Code and FAQ"; docs/precision.md) is added when the
model is built (`add_input_norm`, so checkpoints load into it) as `<linear>.norm`: the blocks' own pre-norms sit only
before qkv and fc1, so without it proj and fc2 quantise unnormalised activations.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf

NORM_EPS = 1e-5
NORMS = ("rmsnorm", "none")


# declared by the bitlinear converter (nn/convert.py); bitnet_torchao (nn/quantized_training.py) reads it too
class BitlinearKeys(cf.Keys, section="train"):
    bitlinear_norm: str = cf.F("rmsnorm", "bitlinear / bitnet_torchao: BitNet's input norm before every converted linear "
                                          "(rmsnorm: RMSNorm with a learnable gain, in float32, before the int8 absmax); none: "
                                          "only the blocks' own pre-norms (before qkv and fc1), as runs before it had",
                               choices=NORMS)


def ternary(w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    s = w.abs().mean().clamp_min(eps)
    return (w / s).round().clamp(-1, 1) * s


def absmax_int8(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    s = 127.0 / x.abs().amax(dim=-1, keepdim=True).clamp_min(eps)
    return (x * s).round().clamp(-128, 127) / s


def ste(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """q in the forward pass, the identity's gradient in the backward pass."""
    return x + (q - x).detach()


class InputRMSNorm(nn.RMSNorm):
    """x / rms(x) * gain, computed in float32 (float64 for a float64 model) outside autocast, returned in x's dtype."""
    # said when a checkpoint lacks its gain (training/step.py: check_model_shapes)
    missing_hint = ("BitNet's input norm, which runs saved without train.bitlinear_norm=rmsnorm lack; "
                    "train.bitlinear_norm=none builds the model without it")

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            cdt = torch.promote_types(x.dtype, torch.float32)
            return F.rms_norm(x.to(cdt), self.normalized_shape, self.weight.to(cdt), self.eps).to(x.dtype)


class NormedLinear(nn.Linear):
    """nn.Linear with BitNet's input norm in front (`add_input_norm`); the converters then quantise it."""

    def forward(self, x):
        return F.linear(self.norm(x), self.weight, self.bias)


def add_input_norm(linear: nn.Linear) -> NormedLinear:
    """Give a linear its input RMSNorm (a parameter `norm.weight` beside its own), in place."""
    w = linear.weight
    linear.norm = InputRMSNorm(linear.in_features, eps=NORM_EPS, elementwise_affine=True, device=w.device, dtype=w.dtype)
    linear.__class__ = NormedLinear
    return linear


class BitLinear(nn.Linear):
    norm: nn.Module  # InputRMSNorm, or nn.Identity where the linear has none (train.bitlinear_norm=none)

    def forward(self, x):
        x = self.norm(x)
        w = ste(self.weight, ternary(self.weight))
        return F.linear(ste(x, absmax_int8(x)), w, self.bias)


def to_bitlinear(linear: nn.Linear) -> BitLinear:
    """The same module object's parameters (its input norm included, if `add_input_norm` gave it one), now quantised
    in the forward pass."""
    if "norm" not in linear._modules:
        linear.norm = nn.Identity()
    linear.__class__ = BitLinear
    return linear
