"""MLP kinds (registry `mlp`): GELU, SwiGLU and SANA's Mix-FFN, their widths and analytic FLOP count, and the
`TokenGrid` a grid-aware MLP (Mix-FFN) reads to find the patch grid in a token sequence."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry
from genlab.nn.kernels import KernelSpec


@dataclass(frozen=True, kw_only=True)
class MlpSpec(KernelSpec):  # kernel variants (swiglu_liger) refuse CPU training like the other kernel keys
    needs_grid: bool = False               # convolves over the 2-D patch grid
    hidden_of: Callable = lambda hidden: hidden  # its own width from the GELU width of model.mlp_ratio
    matrices: int = 2                      # dim x hidden matrices it multiplies (FLOPs)
    grid_flops: Callable | None = None     # grid_flops(grid_tokens, hidden): extra FLOPs over the patch grid


mlp_registry = Registry("mlp", MlpSpec)


class TokenGrid(NamedTuple):
    """Where the patch grid sits in a token sequence: tokens [start, start + h*w) in row-major order. Tokens
    outside it (conditioning tokens) have no neighbours; a layer that mixes neighbours (Mix-FFN) skips them."""
    start: int
    h: int
    w: int


class Mlp(nn.Module):
    """Two-layer MLP, kind gelu or swiglu; SwiGLU (Shazeer 2020) packs its gate and value into fc1."""

    def __init__(self, dim: int, hidden: int, kind: str = "gelu", bias: bool = True):
        super().__init__()
        self.kind = kind
        self.fc1 = nn.Linear(dim, 2 * hidden if kind == "swiglu" else hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x, grid: TokenGrid | None = None):  # grid: unused (Mix-FFN reads it)
        h = self.fc1(x)
        return self.fc2(swiglu_plain(h) if self.kind == "swiglu" else F.gelu(h, approximate="tanh"))


def swiglu_plain(h: torch.Tensor) -> torch.Tensor:
    """silu(a) * b of fc1's packed output h = [a | b] (gate first)."""
    a, b = h.chunk(2, dim=-1)
    return F.silu(a) * b


# MLP entries: (dim, hidden, bias) -> module, where `hidden` is the GELU-MLP width of model.mlp_ratio; each entry
# maps it to its own width (`hidden_of`) and says how many dim x hidden matrices it multiplies (`matrices`, FLOPs).
@mlp_registry.register("gelu", "Linear -> GELU (tanh) -> Linear", matrices=2)
def gelu_mlp(dim: int, hidden: int, bias: bool = True) -> Mlp:
    return Mlp(dim, hidden, "gelu", bias)


def two_thirds(hidden: int) -> int:
    """Three matrices at 2/3 of the width keep the parameter count of a GELU MLP (rounded up to 64)."""
    return 64 * -(-(2 * hidden // 3) // 64)


@mlp_registry.register("swiglu", "SwiGLU: Linear -> silu(a) * b -> Linear, 2/3 of the width (same parameters as GELU)",
                       hidden_of=two_thirds, matrices=3)
def swiglu_mlp(dim: int, hidden: int, bias: bool = True) -> Mlp:
    return Mlp(dim, two_thirds(hidden), "swiglu", bias)


class MixFFN(nn.Module):
    """SANA's Mix-FFN (Xie et al. 2024, the GLUMBConv of EfficientViT): 1x1 conv expand to 2 x hidden with SiLU,
    3x3 depthwise conv over the token grid, GLU (value * silu(gate)), 1x1 conv project. The 1x1 convs are
    Linears over tokens (the same maths); the depthwise conv runs on the grid's tokens only (`TokenGrid`)."""

    needs_grid = True

    def __init__(self, dim: int, hidden: int, bias: bool = True, conv: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden, bias=bias)
        # conv=False: a stream whose tokens never form a grid (MMDiT's conditioning stream) has no conv to train
        self.dw = nn.Conv2d(2 * hidden, 2 * hidden, 3, padding=1, groups=2 * hidden, bias=True) if conv else None
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x, grid: TokenGrid | None = None):
        if grid is None:
            raise GenlabError("model.mlp=mixffn needs the token grid (H, W) of an image backbone; "
                              "this model has none: choose model.mlp=gelu or swiglu")
        h = F.silu(self.fc1(x))
        s, gh, gw = grid
        if gh * gw and self.dw is not None:  # conditioning tokens around the grid are no image positions: the conv skips them
            B, _, C = h.shape
            tokens = h[:, s:s + gh * gw].transpose(1, 2).reshape(B, C, gh, gw)
            conv = self.dw(tokens).flatten(2).transpose(1, 2)
            h = conv if h.shape[1] == gh * gw else torch.cat([h[:, :s], conv, h[:, s + gh * gw:]], dim=1)
        a, gate = h.chunk(2, dim=-1)
        return self.fc2(a * F.silu(gate))


@mlp_registry.register("mixffn", "SANA Mix-FFN: 1x1 expand (SiLU) -> 3x3 depthwise conv over the patch grid -> GLU -> "
                                 "1x1 project, 2/3 of the width (Xie et al. 2024); image backbones only", needs_grid=True,
                       hidden_of=two_thirds, matrices=3,  # like SwiGLU (the conv adds 10 parameters per channel)
                       grid_flops=lambda grid_tokens, hidden: 2 * grid_tokens * 2 * hidden * 9)  # the 3x3 depthwise conv
def mixffn_mlp(dim: int, hidden: int, bias: bool = True, grid: bool = True) -> MixFFN:
    return MixFFN(dim, two_thirds(hidden), bias, conv=grid)


def mlp_flops(name: str, n: int, dim: int, hidden: int, grid_tokens: int = 0) -> int:
    """Forward FLOPs of one sample's MLP over n tokens, grid_tokens of them on the patch grid; `hidden` is the
    GELU width of model.mlp_ratio (each entry maps it to its own)."""
    spec = mlp_registry.spec(name)
    h = spec.hidden_of(hidden)
    return 2 * spec.matrices * n * dim * h + (spec.grid_flops(grid_tokens, h) if spec.grid_flops else 0)
