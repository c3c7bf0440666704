"""The world objectives (method.objective, registry `world_objective`; docs/world.md): how the next-frame denoiser is
trained, and the flow velocity and time grid it samples with (EDM's x_sigma is the flow path rescaled).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core.registry import Registry
from genlab.families.image_flow.flow import interpolate
from genlab.sampling.samplers import time_grid

world_objective_registry = Registry("world_objective")

Net = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def weighted_mean(err: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Mean of a per-element error [B, C, H, W]; with per-pixel weights [B, H, W] (method.motion_weight) the weighted
    mean sum(w e) / sum(w), every channel of a pixel weighed alike."""
    if weight is None:
        return err.mean()
    w = weight.unsqueeze(1).to(err.dtype).expand_as(err)
    return (w * err).sum() / w.sum()


def mse(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    if weight is None:  # the unweighted losses stay torch's own kernels
        return F.mse_loss(a.float(), b.float())
    return weighted_mean((a.float() - b.float()).pow(2), weight)


def l1(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    return F.l1_loss(a.float(), b.float()) if weight is None else weighted_mean((a.float() - b.float()).abs(), weight)


class WorldObjective:
    """Base of every `world_objective` entry; `world` (the WorldModel) lends its mcfg and sample_t."""

    def loss(self, world, net: Net, target: torch.Tensor, noise: torch.Tensor, gen,
             weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, one-step estimate of the clean target) for targets [B, C, H, W] and their Gaussian noise; `weight`
        [B, H, W] weighs each pixel's error (None: a plain mean)."""
        raise NotImplementedError

    def grid(self, steps: int, device) -> torch.Tensor:
        """The sampler's flow times t_0 < ... < t_N = 1 (t=0 noise, t=1 data); the start is (1 - t_0) * noise."""
        return time_grid(steps, device=device)

    def velocity(self, world, net: Net, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The flow velocity dx/dt at x_t = (1-t) noise + t target, t [B]."""
        raise NotImplementedError


def per_sample(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-sample scalar [B] shaped to broadcast over `like` [B, ...], in its dtype."""
    return v.view(-1, *([1] * (like.ndim - 1))).to(like.dtype)


def velocity_to(x_hat: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The velocity that takes x_t straight to a predicted target x_hat at t=1: (x_hat - x_t) / (1 - t)."""
    return (x_hat - x) / per_sample(1 - t, x)


def v_from_x(x_hat, x_t, t):
    # v = (x - x_t) / (1 - t) = data - noise; the floor (applied to the target alike) keeps the rare t ~ 1
    # samples from dominating the loss, which is ||x_hat - x||^2 / max(1 - t, 0.05)^2
    return (x_hat - x_t) / per_sample((1 - t).clamp_min(0.05), x_t)


class FlowObjectiveKeys(cf.Keys, section="method"):
    prediction: str = cf.F("x", "world, flow: the network outputs the clean frame (x; v is derived, the loss stays on v) or "
                                    "v = data - noise (v: the net must cancel the noise itself, which leaks into static pixels)", choices=("x", "v"))
    loss_space: str = cf.F("v", "world, flow: where the loss is measured: v (||x_hat - x||^2 / (1 - t)^2: the nearly clean "
                                "times weigh most) or x (||x_hat - x||^2: every time alike, so the noisy times, where only the "
                                "context and the actions say what comes next, weigh as much; prediction x only)", choices=("v", "x"))


@world_objective_registry.register("flow", "rectified flow; the network predicts the clean frame (x) or the velocity (v)",
                                   keys=FlowObjectiveKeys)
class FlowObjective(WorldObjective):
    def loss(self, world, net, target, noise, gen, weight=None):
        keys = FlowObjectiveKeys.of(world.mcfg)
        t = world.sample_t(target.shape[0], gen, target.device, world.mcfg)
        x_t = interpolate(noise, target, t)
        out = net(x_t, t)
        if keys.prediction == "x" and keys.loss_space == "x":
            return mse(out, target, weight), out
        if keys.prediction == "x":  # the network outputs the clean target; the loss stays on v
            est, v, v_target = out, v_from_x(out, x_t, t), v_from_x(target, x_t, t)
        else:
            est, v, v_target = x_t + per_sample(1 - t, x_t) * out, out, target - noise
        return mse(v, v_target, weight), est

    def velocity(self, world, net, x, t):
        keys = FlowObjectiveKeys.of(world.mcfg)
        out = net(x, t)  # with x: an Euler step to t=1 lands exactly on the predicted frame
        return velocity_to(out, x, t) if keys.prediction == "x" else out


# edm: D(x; σ) = c_skip·x + c_out·F(c_in·x; c_noise) with x = y + σ·n, F the network; its input and its training
# target (y - c_skip·x) / c_out both have unit variance at every σ
def preconditioning(sigma: torch.Tensor, sigma_data: float = 0.5):
    """(c_skip, c_out, c_in, c_noise) of table 1, each shaped like `sigma`."""
    s2, sd2 = sigma ** 2, sigma_data ** 2
    return sd2 / (s2 + sd2), sigma * sigma_data / (s2 + sd2).sqrt(), 1 / (s2 + sd2).sqrt(), sigma.log() / 4


def karras_sigmas(steps: int, sigma_min: float, sigma_max: float, rho: float, device=None) -> torch.Tensor:
    """σ_i = (σ_max^(1/ρ) + i/(N-1)·(σ_min^(1/ρ) - σ_max^(1/ρ)))^ρ from sigma_max down to sigma_min, then a final 0."""
    r = 1 / rho
    i = torch.arange(steps, device=device, dtype=torch.float32)
    sig = (sigma_max ** r + i / max(steps - 1, 1) * (sigma_min ** r - sigma_max ** r)) ** rho
    return torch.cat([sig, sig.new_zeros(1)])


P_MEAN, P_STD = -0.4, 1.2                    # training noise: ln σ ~ N(P_MEAN, P_STD²)
SIGMA_MIN, SIGMA_MAX, RHO = 2e-3, 5.0, 7.0   # sampling schedule
SIGMA_DATA = 0.5


@world_objective_registry.register("edm", "EDM preconditioning (Karras et al. 2022), DIAMOND's choice")
class EDMObjective(WorldObjective):
    def loss(self, world, net, target, noise, gen, weight=None):
        sigma = (torch.randn(target.shape[0], generator=gen, device=target.device) * P_STD + P_MEAN).exp()
        c_skip, c_out, c_in, c_noise = preconditioning(sigma, SIGMA_DATA)
        x_noisy = target + per_sample(sigma, target) * noise
        out = net(per_sample(c_in, x_noisy) * x_noisy, c_noise)
        skip, scale = per_sample(c_skip, x_noisy) * x_noisy, per_sample(c_out, x_noisy)
        # the EDM-weighted loss on D equals the plain MSE on the network's target
        return mse(out, (target - skip) / scale, weight), skip + scale * out

    def grid(self, steps, device):
        return 1 / (1 + karras_sigmas(steps, SIGMA_MIN, SIGMA_MAX, RHO, device=device))

    def velocity(self, world, net, x, t):
        x_sigma = x / per_sample(t, x)
        c_skip, c_out, c_in, c_noise = preconditioning((1 - t) / t, SIGMA_DATA)
        den = per_sample(c_skip, x) * x_sigma + per_sample(c_out, x) * net(per_sample(c_in, x) * x_sigma, c_noise)
        return velocity_to(den, x, t)


@world_objective_registry.register("l1", "one-step regression from noise (L1); with method.adv_weight > 0 a GAN")
class L1Objective(WorldObjective):
    def loss(self, world, net, target, noise, gen, weight=None):
        est = noise + net(noise, torch.zeros(target.shape[0], device=target.device))
        return l1(est, target, weight), est

    def grid(self, steps, device):
        return torch.tensor([0.0, 1.0], device=device)  # one step whatever method.sample_steps says

    def velocity(self, world, net, x, t):
        return net(x, t)


class PatchDiscriminator(nn.Module):
    """Small PatchGAN (Isola et al. 2017) on (frame, last context frame); spectral norm stops its NaN blow-ups."""

    def __init__(self, channels: int, width: int = 32):
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        self.net = nn.Sequential(
            sn(nn.Conv2d(2 * channels, width, 4, 2, 1)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(width, 2 * width, 4, 2, 1)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(2 * width, 1, 3, 1, 1)))

    def forward(self, frame, last_context):
        with torch.autocast(frame.device.type, enabled=False):  # logits in fp32
            return self.net(torch.cat([frame, last_context], 1).float())


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """A non-finite loss term becomes 0 (no host sync); the counter metric says how often it happened."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def adversarial_losses(disc: nn.Module, est: torch.Tensor, target: torch.Tensor, last: torch.Tensor):
    """Non-saturating GAN losses (softplus) of the estimated and the real frame, on the clean last frame, added to
    whichever objective trains the denoiser (method.adv_weight > 0): (generator term, discriminator loss, metrics)."""
    # one discriminator forward for both losses: spectral norm's in-place update would invalidate an earlier graph
    fake, real = disc(torch.cat([est, target]), torch.cat([last, last])).chunk(2)
    adv = finite_or_zero(F.softplus(-fake).mean())
    d_loss = F.softplus(-real).mean() + F.softplus(fake).mean()
    metrics = {"adv": adv.detach(), "disc_loss": d_loss.detach(), "disc_nonfinite": (~torch.isfinite(d_loss)).float()}
    return adv, finite_or_zero(d_loss), metrics
