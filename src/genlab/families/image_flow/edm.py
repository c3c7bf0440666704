"""EDM preconditioning and noise levels (Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based
Generative Models", arXiv:2206.00364, table 1).

The denoiser is D(x; σ) = c_skip(σ)·x + c_out(σ)·F(c_in(σ)·x; c_noise(σ)) with x = y + σ·n, where F is the
network and σ_data the standard deviation of the data:

    c_skip = σ_data² / (σ² + σ_data²)      c_out = σ·σ_data / √(σ² + σ_data²)
    c_in   = 1 / √(σ² + σ_data²)           c_noise = ¼·ln σ

so the network's input and its training target (y - c_skip·x) / c_out both have unit variance at every σ.
Sampling walks the schedule σ_i = (σ_max^(1/ρ) + i/(N-1)·(σ_min^(1/ρ) - σ_max^(1/ρ)))^ρ, then σ_N = 0.
"""
from __future__ import annotations

import torch


def preconditioning(sigma: torch.Tensor, sigma_data: float = 0.5):
    """(c_skip, c_out, c_in, c_noise) of table 1, each shaped like `sigma`."""
    s2, sd2 = sigma ** 2, sigma_data ** 2
    return sd2 / (s2 + sd2), sigma * sigma_data / (s2 + sd2).sqrt(), 1 / (s2 + sd2).sqrt(), sigma.log() / 4


def karras_sigmas(steps: int, sigma_min: float, sigma_max: float, rho: float, device=None) -> torch.Tensor:
    """The `steps` noise levels of the sampling schedule, from sigma_max down to sigma_min, then a final 0."""
    r = 1 / rho
    i = torch.arange(steps, device=device, dtype=torch.float32)
    sig = (sigma_max ** r + i / max(steps - 1, 1) * (sigma_min ** r - sigma_max ** r)) ** rho
    return torch.cat([sig, sig.new_zeros(1)])
