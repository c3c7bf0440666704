"""What a world objective is: how the next-frame denoiser is trained, and the flow velocity and time grid a
registered sampler (sampling/samplers.py, method.world_sampler) generates a frame with.

An objective sees the backbone as `net(x, t)`, the frame's conditioning (context frames, actions, context-noise
level) already bound, so it knows nothing of worlds; it is chosen by method.objective from the
`world_objective` registry (flow.py, edm.py, l1.py beside this file).
"""
from __future__ import annotations

from typing import Callable

import torch

from genlab.sampling.samplers import time_grid

Net = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class WorldObjective:
    """Base of every entry of `world_objective_registry`. `world` is the WorldModel: an objective may read its
    config (world.mcfg) and its timestep sampler (world.sample_t)."""

    def loss(self, world, net: Net, target: torch.Tensor, noise: torch.Tensor, gen) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, one-step estimate of the clean target) for a batch of targets [B, C, H, W] and the Gaussian
        noise drawn for them."""
        raise NotImplementedError

    def grid(self, steps: int, device) -> torch.Tensor:
        """The sampler's flow times t_0 < ... < t_N = 1 (t=0 noise, t=1 data); the start is (1 - t_0) * noise."""
        return time_grid(steps, device=device)

    def velocity(self, world, net: Net, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The flow velocity dx/dt at x_t = (1-t) noise + t target, t [B]."""
        raise NotImplementedError


def velocity_to(x_hat: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The velocity that takes x_t straight to a predicted target x_hat at t=1: (x_hat - x_t) / (1 - t)."""
    return (x_hat - x) / per_sample(1 - t, x)


def per_sample(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-sample scalar [B] shaped to broadcast over `like` [B, ...], in its dtype."""
    return v.view(-1, *([1] * (like.ndim - 1))).to(like.dtype)
