"""Easy Consistency Tuning (Geng et al. 2024, "Consistency Models Made Easy"): consistency training started from a
flow teacher's weights (method.teacher), which it never calls.

Time: ECT works in EDM's noise level σ, x_σ = x + σ z (data in [-1, 1], σ_data 0.5, as genlab's). genlab's
x_t = (1 - t) z + t x is t · x_σ at σ = (1 - t) / t, i.e. t = 1 / (1 + σ): the same point of the same trajectory,
rescaled; t = 1 is σ = 0 (the data), t -> 0 is σ -> ∞. The consistency function is the flow parametrisation
f(x, t) = x + (1 - t) v_θ(x, t) (base.py), the identity at t = 1.

One training step, per sample:
- t from the flow family's sampler (method.timestep_sampler, method.time_shift). ECT's ln σ ~ N(P_mean, P_std) is
  exactly logit_normal in genlab's t with logit_mean = -P_mean, logit_std = P_std (logit t = -ln σ); the preset
  sets ECT's (-1.1, 2.0) that way, so no second sampler is needed;
- r (closer to the data): σ_r = σ (1 - n(σ) / q^j), n(σ) = 1 + k sigmoid(-b σ), clamped at 0 (ECT's sigmoid
  mapping, q = method.ect_q, k = method.ect_k, b = method.ect_b); j = stage + 1 with stage = ⌊step S / train.steps⌋
  in 0..S-1, S = method.ect_stages: the paper's ⌈i / d⌉ with d = train.steps / S and i counted from 1, as in the
  official code. The gap σ - σ_r shrinks by q at every stage (to 1/q^S of σ n(σ) in the last one: dt -> 0), and
  genlab's r = 1 / (1 + σ_r) lies in (t, 1];
- the same noise z for x_t and x_r; loss d(f_θ(x_t, t), sg f_θ(x_r, r)) / (σ - σ_r): ECT's weighting 1/(t - r) in
  σ units, with no EMA target (the stop-gradient of the same network), d the pseudo-Huber distance
  (method.ect_huber_c; the official code's c = 0 is the L2 norm, here the RMS per sample). At r = 1 the target is
  the data itself, since f(x, 1) = x.
Labels are dropped at model.class_dropout as in the teacher's training, so the null class stays a consistency model
too. genlab's EMA (train.ema_decay) only smooths the weights that sample and are evaluated, as ECT's ema_beta.
Samples: sampler `consistency`; ECT's recipe samples in 2 steps.
"""
from __future__ import annotations

import torch

from genlab.config import fields as cf
from genlab.families.base import method_registry
from genlab.families.few_step.base import FEW_STEP_KEYS, FewStepFlow, TeacherPathKeys, consistency_fn, pseudo_huber
from genlab.families.image_flow.flow import interpolate, unwrap


class EctKeys(cf.Keys, section="method"):
    ect_stages: int = cf.F(8, "ect: stages of the gap schedule over train.steps; the gap shrinks by ect_q at each (official "
                              "CIFAR-10 run: 8, halving every 250 of 2000 ticks)", ge=1)
    ect_q: float = cf.F(2.0, "ect: q, the gap's shrink factor per stage (official CIFAR-10: 2; ImageNet 64: 4)", gt=1)
    ect_k: float = cf.F(8.0, "ect: k of the gap's adjustment n(σ) = 1 + k sigmoid(-b σ) (official 8)", ge=0)
    ect_b: float = cf.F(1.0, "ect: b of the gap's adjustment n(σ) = 1 + k sigmoid(-b σ) (official 1)", ge=0)
    ect_huber_c: float = cf.F(0.0, "ect: c of the pseudo-Huber distance per pixel (official code 0: the L2 norm, here the RMS)",
                              ge=0)


def ect_stage(step: int, total_steps: int, stages: int) -> int:
    """The schedule's stage (0-based) at optimizer step `step` of `total_steps`."""
    return min(stages - 1, step * stages // max(total_steps, 1))


def ect_r(t, stage: int, q: float, k: float, b: float):
    """ECT's r for genlab times t at a stage: (r in (t, 1], the gap σ - σ_r in σ units)."""
    sigma = (1 - t) / t.clamp_min(1e-6)  # t = 0 (a uniform draw can give it) is σ = 1e6, not ∞
    gap = sigma * (1 + k * torch.sigmoid(-b * sigma)) / q ** (stage + 1)
    gap = torch.minimum(gap, sigma)  # σ_r clamped at 0: r = 1, the data
    return 1 / (1 + (sigma - gap)), gap


class EasyConsistencyTuning(FewStepFlow):
    uses_teacher = False
    init_from_teacher = True

    def loss(self, model, batch, ctx):
        m, g, data, y = EctKeys.of(self.mcfg), ctx.generator, batch["image"], batch["label"]
        B, dev = data.shape[0], data.device
        t = self.draw_t(B, g, dev, ctx.step)
        stage = ect_stage(ctx.step, ctx.total_steps, m.ect_stages)
        r, gap = ect_r(t, stage, m.ect_q, m.ect_k, m.ect_b)
        noise = torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype)
        if self.class_dropout > 0:
            drop = torch.rand(B, generator=g, device=dev) < self.class_dropout
            y = torch.where(drop, torch.full_like(y, unwrap(model).null_class), y)
        with torch.no_grad():
            target = consistency_fn(model, interpolate(noise, data, r), r, y)
        pred = consistency_fn(model, interpolate(noise, data, t), t, y)
        per = pseudo_huber(pred, target, m.ect_huber_c) / gap.float().clamp_min(1e-12)
        return per.mean(), {"ect_stage": torch.tensor(float(stage), device=dev)}


method_registry.register("ect", "Easy Consistency Tuning (Geng et al. 2024): consistency training from the flow "
                                "teacher's weights (method.teacher), shrinking step gap, no EMA target; 1-2 step "
                                "sampling with sampler=consistency",
                         keys=(*FEW_STEP_KEYS, TeacherPathKeys, EctKeys))(EasyConsistencyTuning)
