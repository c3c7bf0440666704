"""Timestep embedding: sinusoidal features of t (Vaswani et al.; as in DiT) and the MLP every image backbone puts
on them, with its analytic FLOP count."""
from __future__ import annotations

import math

import torch
import torch.nn as nn


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    half = dim // 2
    work = torch.promote_types(t.dtype, torch.float32)  # float32 at least; float64 stays (finite-difference tests)
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=work) / half)
    args = t.to(work)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbedder(nn.Module):
    """t in [0, 1] -> sinusoidal features (scaled to [0, 1000] like DiT) -> MLP."""

    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t):
        return self.mlp(timestep_embedding(t * 1000.0, self.freq_dim).to(self.mlp[0].weight.dtype))


def embed_flops(t_embed: TimestepEmbedder, dim: int) -> int:
    """The timestep MLP: sinusoidal features -> dim -> dim."""
    return 2 * (t_embed.freq_dim * dim + dim * dim)
