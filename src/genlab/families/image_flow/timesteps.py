"""Training-time samplers of t in [0, 1] for flow matching (t=0 noise, t=1 data): each inverts one uniform per sample,
so its density is a closed form (`DENSITIES`, for docs/timesteps.png and the tests). `adaptive`: after Kim et al. 2025,
made small (docs/image_flow.md): a categorical over bins, trained by REINFORCE on a probe loss; its state is a frozen
extra's buffer (checkpointed), no host sync.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
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


PROBE_SAMPLES, PROBE_TIMES = 32, 3  # the paper's look-ahead set S has 3 times


class AdaptiveTimesteps(nn.Module):
    def __init__(self, bins: int = 16, lr: float = 0.1, every: int = 10, mix: float = 0.1, entropy: float = 1.0,
                 seed: int = 0):
        super().__init__()
        self.bins, self.lr, self.every, self.mix, self.entropy, self.seed = bins, lr, every, mix, entropy, seed
        self.register_buffer("logits", torch.zeros(bins))
        self.register_buffer("reward_mean", torch.zeros(()))
        self.register_buffer("reward_var", torch.ones(()))
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))
        self._pending = None  # (step, bin, probe inputs, loss before): measured again after the update

    def probs(self) -> torch.Tensor:
        """The behaviour policy over bins: softmax(logits) mixed with the uniform law."""
        return (1 - self.mix) * F.softmax(self.logits.float(), 0) + self.mix / self.bins

    def draw(self, n, generator, device, step: int | None = None) -> torch.Tensor:
        """t [n]: inverse CDF of the piecewise-constant density; on an update step every draw lies in one bin."""
        p = self.probs().to(device)
        u = torch.rand(n, generator=generator, device=device)
        if step is not None and self.is_update_step(step):
            b = self.shared_bin(step, p)
            return (b + u) / self.bins
        cdf = torch.cumsum(p, 0)
        b = torch.searchsorted(cdf, u.contiguous(), right=True).clamp(max=self.bins - 1)
        lo = torch.where(b > 0, cdf[(b - 1).clamp(min=0)], torch.zeros_like(u))
        frac = ((u - lo) / p[b]).clamp(0, 1)
        return (b + frac) / self.bins

    def is_update_step(self, step: int) -> bool:
        return step % self.every == 0

    def shared_bin(self, step: int, p: torch.Tensor) -> torch.Tensor:
        """One bin ~ p, the same on every rank and after a resume: a generator seeded by (seed, step)."""
        g = torch.Generator(device=p.device).manual_seed(self.seed * 1_000_003 + step)
        return torch.multinomial(p, 1, generator=g)[0]

    def reinforce(self, b: torch.Tensor, reward: torch.Tensor):
        """logits += lr * (A * d log p(b) / d logits + entropy * dH / d logits), with A the reward standardised
        by running statistics and H the entropy of softmax(logits)."""
        reward = reward.detach().float().to(self.logits.device)
        first = self.updates == 0
        mean = torch.where(first, reward, self.reward_mean)
        var = torch.where(first, torch.ones_like(self.reward_var), self.reward_var)
        adv = (reward - mean) / (var.sqrt() + 1e-12)
        pi = F.softmax(self.logits.float(), 0)
        p_b = (1 - self.mix) * pi[b] + self.mix / self.bins
        onehot = F.one_hot(b.long().reshape(()), self.bins).float()
        grad = (1 - self.mix) * pi[b] * (onehot - pi) / p_b  # gradient of log of the mixed probability of b
        log_pi = F.log_softmax(self.logits.float(), 0)
        grad_h = -pi * (log_pi + (-(pi * log_pi).sum()))  # dH/dz_j = -pi_j (log pi_j + H)
        self.logits.add_(self.lr * (adv * grad + self.entropy * grad_h))
        # running statistics after the advantage, so the reward is judged against its past
        self.reward_mean.copy_(torch.where(first, reward, 0.9 * mean + 0.1 * reward))
        self.reward_var.copy_(torch.where(first, reward.square().clamp(min=1e-12),
                                          0.9 * var + 0.1 * (reward - mean).square()))
        self.updates.add_(1)

    def step_probe(self, step: int, probe_loss, make_probe):
        """Once per loss() before the training forward: probe_loss(probe) -> scalar, make_probe() -> a fresh probe."""
        if self._pending is not None and step > self._pending[0]:
            _, b, probe, before = self._pending
            self._pending = None
            after = probe_loss(probe)
            reward = before - after
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.all_reduce(reward, op=torch.distributed.ReduceOp.AVG)
            self.reinforce(b, reward)
        if self.is_update_step(step) and (self._pending is None or self._pending[0] != step):
            probe = make_probe()
            self._pending = (step, self.shared_bin(step, self.probs().to(self.logits.device)), probe, probe_loss(probe))


class AdaptiveKeys(cf.Keys, section="method"):
    adaptive_bins: int = cf.F(16, "flow, adaptive: bins of the learned categorical law of t", ge=2)
    adaptive_lr: float = cf.F(0.1, "flow, adaptive: REINFORCE step size on the bin logits", ge=0)
    adaptive_every: int = cf.F(10, "flow, adaptive: steps between sampler updates (that step's batch shares one bin)", ge=1)
    adaptive_mix: float = cf.F(0.1, "flow, adaptive: weight of the uniform law mixed into the learned one (exploration)", gt=0, le=1)
    adaptive_entropy: float = cf.F(1.0, "flow, adaptive: weight of the entropy bonus (a bin's logit settles near its mean "
                                              "standardised advantage / this)", ge=0)


@timestep_sampler_registry.register("adaptive", "learned categorical law over method.adaptive_bins bins of t, updated online by "
                                                "REINFORCE on the look-ahead loss reduction (Kim et al. 2025, arXiv:2411.09998)",
    keys=AdaptiveKeys)
def adaptive(n, generator, device, cfg=None):
    # the draw needs the method's state (flow and repa hold it as an extra module); never called statelessly
    raise GenlabError("method.timestep_sampler=adaptive keeps a learned state: only method.name=flow or repa support it")
