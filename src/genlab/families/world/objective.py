"""What a world objective is: how the next-frame denoiser is trained and how it generates a frame.

An objective sees the backbone as `net(x, t)`, the frame's conditioning (context frames, actions, context-noise
level) already bound, so it knows nothing of worlds; it is chosen by method.objective from the
`world_objective` registry (flow.py, edm.py, l1.py beside this file).
"""
from __future__ import annotations

from typing import Callable

import torch

Net = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class WorldObjective:
    """Base of every entry of `world_objective_registry`. `world` is the WorldModel: an objective may read its
    config (world.mcfg) and its timestep sampler (world.sample_t)."""

    def loss(self, world, net: Net, target: torch.Tensor, noise: torch.Tensor, gen) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, one-step estimate of the clean target) for a batch of targets [B, C, H, W] and the Gaussian
        noise drawn for them."""
        raise NotImplementedError

    def generate(self, world, net: Net, x: torch.Tensor, steps: int) -> torch.Tensor:
        """The generated target from the starting noise x (already scaled by method.sample_temperature)."""
        raise NotImplementedError


def per_sample(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-sample scalar [B] shaped to broadcast over `like` [B, ...], in its dtype."""
    return v.view(-1, *([1] * (like.ndim - 1))).to(like.dtype)
