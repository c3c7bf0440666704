"""Position entries (registry `position`): `(dim, heads, grid) -> module`, grid = (T,) for sequences or (H, W) for
patch grids; a module adds its table to the tokens (`forward(h, offset)`) and/or hands rotary tables to attention
(`rope(offset)`), and `axes` says which grid ranks it serves. The sin-cos and rotary tables and `apply_rope` too."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry, Spec


@dataclass(frozen=True, kw_only=True)
class PositionSpec(Spec):
    axes: tuple[int, ...] = ()             # token-grid ranks it fits (1: sequences, 2: patch grids)
    head_multiple: int = 1                 # the head width must be a multiple of this (rotations in pairs per axis)
    dim_multiple: int = 1                  # the model width must be a multiple of this (sin-cos per axis)


position_registry = Registry("position", PositionSpec)


def sincos_2d(dim: int, grid_h: int, grid_w: int) -> np.ndarray:
    """Fixed 2-D sin-cos positional embedding [grid_h*grid_w, dim] (MAE / DiT): half the channels per axis."""
    assert dim % 4 == 0, "sin-cos 2-D embedding needs dim divisible by 4"

    def one_axis(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    gh, gw = np.meshgrid(np.arange(grid_h, dtype=np.float64), np.arange(grid_w, dtype=np.float64), indexing="ij")
    return np.concatenate([one_axis(dim // 2, gw), one_axis(dim // 2, gh)], axis=1).astype(np.float32)


def rope_angles(pos: torch.Tensor, width: int, base: float = 10000.0) -> torch.Tensor:
    """[n, width // 2] rotation angles of `width` channels (width // 2 pairs) at float positions `pos` [n]."""
    inv = 1.0 / base ** (torch.arange(0, width, 2, device=pos.device, dtype=torch.float32) / width)
    return torch.outer(pos.float(), inv)


def rope_cache(seq_len: int, head_dim: int, base: float = 10000.0, device=None):
    ang = rope_angles(torch.arange(seq_len, device=device), head_dim, base)
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, rope):
    """Rotary position embedding (Su et al. 2021) on the last dim, pairs (even, odd)."""
    cos, sin = rope
    n = x.shape[-2]
    cos, sin = cos[:n].to(x.dtype), sin[:n].to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.flatten(-2)


class LearnedPosition(nn.Module):
    """A trained table, one row per position (GPT-2); `weight` keeps nn.Embedding's parameter name."""

    def __init__(self, dim: int, heads: int, grid: tuple):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(math.prod(grid), dim).normal_(std=0.02))

    def forward(self, h, offset: int = 0):
        return h + self.weight[offset:offset + h.shape[1]].to(h.dtype)

    def rope(self, offset: int = 0):
        return None


class SinCos2d(LearnedPosition):
    """Fixed 2-D sin-cos table (MAE / DiT), not saved (it is a function of the grid); no rotary tables either."""

    def __init__(self, dim: int, heads: int, grid: tuple):
        nn.Module.__init__(self)
        self.register_buffer("table", torch.from_numpy(sincos_2d(dim, *grid)), persistent=False)

    def forward(self, h, offset: int = 0):
        return h + self.table[offset:offset + h.shape[1]].to(h.dtype)


class Rotary(nn.Module):
    """RoPE (Su et al. 2021): nothing added to the tokens; queries and keys rotate by position in attention."""

    def __init__(self, dim: int, heads: int, grid: tuple):
        super().__init__()
        hd = dim // heads
        if len(grid) == 1 and hd % 2:
            raise GenlabError(f"rope needs an even head width, got {hd}")
        cos, sin = rope_cache(grid[0], hd) if len(grid) == 1 else rope_2d(grid, hd)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, h, offset: int = 0):
        return h

    def rope(self, offset: int = 0):
        return self.cos[offset:], self.sin[offset:]


def rope_2d(grid: tuple, head_dim: int, base: float = 10000.0):
    """Axial 2-D RoPE: the first half of the rotated pairs turn with the row, the second half with the column."""
    if head_dim % 4:
        raise GenlabError(f"rope2d needs a head width divisible by 4, got {head_dim}")
    gh, gw = grid
    rows = torch.arange(gh).repeat_interleave(gw)
    cols = torch.arange(gw).repeat(gh)
    ang = torch.cat([rope_angles(rows, head_dim // 2, base), rope_angles(cols, head_dim // 2, base)], dim=-1)
    return torch.cos(ang), torch.sin(ang)


# entries: the module classes themselves, built with (dim, heads, grid)
position_registry.register("learned", "a trained table, one row per position", axes=(1, 2))(LearnedPosition)
position_registry.register("sincos2d", "fixed 2-D sin-cos table over the patch grid (DiT)", axes=(2,),
                           dim_multiple=4)(SinCos2d)
position_registry.register("rope", "rotary embedding of the sequence position (queries and keys)", axes=(1,),
                           head_multiple=2)(Rotary)
position_registry.register("rope2d", "axial 2-D rotary embedding over the patch grid (row and column)", axes=(2,),
                           head_multiple=4)(Rotary)


def build_position(name: str, dim: int, heads: int, grid: tuple, model: str):
    """The position module for a model whose tokens form `grid`; a name not fitting the grid fails with the fitting
    ones (unknown names: the registry's message)."""
    entry = position_registry.get(name)
    fits = fitting_positions(len(grid)) if grid else position_registry.names()
    if name not in fits:
        raise GenlabError(f"model.pos_emb={name} does not fit model {model}; valid choices: auto, {', '.join(fits)}")
    return entry(dim, heads, grid)


def fitting_positions(rank: int) -> list[str]:
    return [n for n, s in position_registry.specs() if rank in s.axes]
