"""Adaptive non-uniform timestep sampling after Kim et al. 2025, made small (docs/image_flow.md): a categorical over
bins, trained by REINFORCE on a probe loss; its state is a frozen extra's buffer (checkpointed), no host sync.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.image_flow.timesteps import timestep_sampler_registry

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
