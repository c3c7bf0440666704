"""Training-time samplers of t in [0, 1] for flow matching (t=0 noise, t=1 data): each inverts one uniform per sample,
so its density is a closed form (`DENSITIES`, for docs/timesteps.png and the tests); adaptive: adaptive_timesteps.py.
"""
import math

import torch

from genlab.config import fields as cf
from genlab.core.registry import Registry
from genlab.sampling.samplers import LqKeys, lq_map, shift_time  # noqa: F401 (the time maps and their keys live with the step schedules)

timestep_sampler_registry = Registry("timestep_sampler")


def _u(n, generator, device):
    return torch.rand(n, generator=generator, device=device)


class LogitNormalKeys(cf.Keys, section="method"):
    logit_mean: float = cf.F(0.0, "flow, logit_normal: mean of logit(t)", ge=-10, le=10)
    logit_std: float = cf.F(1.0, "flow, logit_normal: standard deviation of logit(t)", gt=0)


class ModeKeys(cf.Keys, section="method"):
    mode_scale: float = cf.F(1.29, "flow, mode: SD3's s of f_mode (0 = uniform; > 0 favours mid t; monotone for -1..2/(pi-2))", ge=-1, le=1.7519)


class SpeedKeys(cf.Keys, section="method"):
    speed_tau: float = cf.F(0.11, "flow, speed: t below which lies SpeeD's convergence area (0.11: the DDPM linear schedule's "
                                        "boundary mapped by SNR)", gt=0, lt=1)
    speed_k: float = cf.F(5.0, "flow, speed: density ratio of t >= speed_tau over t < speed_tau (SpeeD code: 2.5/0.5)", gt=0)


@timestep_sampler_registry.register("uniform", "t ~ U(0, 1) (rectified flow, Liu et al. 2022)")
def uniform(n, generator, device, cfg=None):
    return _u(n, generator, device)


timestep_sampler_registry.register("linear", "alias of uniform")(uniform)


@timestep_sampler_registry.register("logit_normal", "t = sigmoid(N(logit_mean, logit_std)) (SD3, Esser et al. 2024)",
                                    keys=LogitNormalKeys)
def logit_normal(n, generator, device, cfg=None):
    k = LogitNormalKeys.of_or_defaults(cfg)
    return torch.sigmoid(k.logit_mean + k.logit_std * torch.randn(n, generator=generator, device=device))


@timestep_sampler_registry.register("cosine", "SD3's CosMap: p(t) = 2 / (pi (1 - 2t + 2t^2)), the cosine schedule's "
                                              "log-SNR mapped onto the linear path (Esser et al. 2024, eq. 17)")
def cosine(n, generator, device, cfg=None):
    # SD3: t_sd3 = 1 - 1/(tan(pi u/2) + 1); genlab t = 1 - t_sd3 = cos/(cos + sin), stable at both ends
    a = _u(n, generator, device) * (math.pi / 2)
    return torch.cos(a) / (torch.cos(a) + torch.sin(a))


def f_mode(u, s):
    """SD3's mode map f_mode(u; s) = 1 - u - s (cos^2(pi u / 2) - 1 + u), in SD3's convention (t=1 noise)."""
    return 1 - u - s * (torch.cos(math.pi / 2 * u) ** 2 - 1 + u)


@timestep_sampler_registry.register("mode", "mode sampling with heavy tails: t = 1 - f_mode(u; method.mode_scale), "
                                            "density 1/(1+s) at both ends (SD3, Esser et al. 2024, eq. 20)",
    keys=ModeKeys)
def mode(n, generator, device, cfg=None):
    # f_mode maps U(0,1) to a law symmetric about 1/2, so flipping the convention changes nothing but readability
    return (1 - f_mode(_u(n, generator, device), ModeKeys.of_or_defaults(cfg).mode_scale)).clamp(0, 1)


@timestep_sampler_registry.register("linear_quadratic", "Mochi's linear-quadratic step schedule as a training density: "
                                                        "t = lq(u) (method.lq_threshold, method.lq_linear_frac)",
    keys=LqKeys)
def linear_quadratic(n, generator, device, cfg=None):
    # Mochi defines a sampling grid; training on t = lq(u), u ~ U(0,1), visits t as often as its sampler does
    return lq_map(_u(n, generator, device), LqKeys.of_or_defaults(cfg).lq_threshold, LqKeys.of_or_defaults(cfg).lq_linear_frac)


@timestep_sampler_registry.register("speed", "SpeeD asymmetric sampling: density k times higher for t >= tau than in the "
                                             "near-noise convergence area t < tau (Wang et al. 2024; method.speed_tau, speed_k)",
    keys=SpeedKeys)
def speed(n, generator, device, cfg=None):
    tau, k = SpeedKeys.of_or_defaults(cfg).speed_tau, SpeedKeys.of_or_defaults(cfg).speed_k
    c = 1.0 / (tau + k * (1 - tau))  # p(t) = c on [0, tau), c k on [tau, 1]
    u = _u(n, generator, device)
    return torch.where(u < c * tau, u / c, tau + (u - c * tau) / (c * k)).clamp(0, 1)


def resolve_shift(shift: float, image_size: int, base: int) -> float:
    """method.time_shift: > 0 as given; 0 = sqrt(m / n) with m, n the pixel counts of the image and of a
    base x base image (SD3, section 5.3.2)."""
    return shift if shift > 0 else math.sqrt(image_size * image_size / (base * base))


# closed-form densities on (0, 1), for the docs plot (the tests write their own references)
def _lq_pdf(t, threshold=0.025, linear_frac=0.5):
    a, tau = linear_frac, threshold
    k = (1 - tau / a) / (1 - a) ** 2
    d = (-tau / a + torch.sqrt((tau / a) ** 2 + 4 * k * (t - tau).clamp(min=0))) / (2 * k)  # s - a at t
    return torch.where(t < tau, torch.full_like(t, a / tau), 1 / (tau / a + 2 * k * d))


def _mode_pdf(t, s=1.29):
    lo, hi = torch.zeros_like(t), torch.ones_like(t)
    for _ in range(60):  # bisection of the increasing map u -> 1 - f_mode(u) (monotone for -1 <= s <= 2/(pi-2))
        mid = (lo + hi) / 2
        below = 1 - f_mode(mid, s) < t
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    u = (lo + hi) / 2
    return 1 / (1 + s - s * math.pi / 2 * torch.sin(math.pi * u))


def _speed_pdf(t, tau=0.11, k=5.0):
    c = 1.0 / (tau + k * (1 - tau))
    return torch.where(t < tau, torch.full_like(t, c), torch.full_like(t, c * k))


def _logit_normal_pdf(t, m=0.0, s=1.0):
    z = torch.log(t / (1 - t))
    return torch.exp(-0.5 * ((z - m) / s) ** 2) / (s * math.sqrt(2 * math.pi) * t * (1 - t))


DENSITIES = {
    "uniform": lambda t, cfg=None: torch.ones_like(t),
    "logit_normal": lambda t, cfg=None: _logit_normal_pdf(t, LogitNormalKeys.of_or_defaults(cfg).logit_mean, LogitNormalKeys.of_or_defaults(cfg).logit_std),
    "cosine": lambda t, cfg=None: 2 / (math.pi * (1 - 2 * t + 2 * t * t)),
    "mode": lambda t, cfg=None: _mode_pdf(t, ModeKeys.of_or_defaults(cfg).mode_scale),
    "linear_quadratic": lambda t, cfg=None: _lq_pdf(t, LqKeys.of_or_defaults(cfg).lq_threshold, LqKeys.of_or_defaults(cfg).lq_linear_frac),
    "speed": lambda t, cfg=None: _speed_pdf(t, SpeedKeys.of_or_defaults(cfg).speed_tau, SpeedKeys.of_or_defaults(cfg).speed_k),
}
