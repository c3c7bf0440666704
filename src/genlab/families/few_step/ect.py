"""Easy Consistency Tuning (Geng et al. 2024): consistency training started from a flow teacher's weights
(method.teacher), which it never calls; docs/few_step.md has the maths (EDM's σ = (1 - t) / t in genlab's time).
"""
from __future__ import annotations

import torch

from genlab.config import fields as cf
from genlab.families.base import method_registry
from genlab.families.few_step.base import FewStepFlow, TeacherPathKeys, consistency_fn, pseudo_huber
from genlab.families.image_flow.flow import FLOW_KEYS, interpolate


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
    def loss(self, model, batch, ctx):
        m, g, data, y = EctKeys.of(self.mcfg), ctx.generator, batch["image"], batch["label"]
        B, dev = data.shape[0], data.device
        t = self.draw_t(B, g, dev, ctx.step)
        stage = ect_stage(ctx.step, ctx.total_steps, m.ect_stages)
        r, gap = ect_r(t, stage, m.ect_q, m.ect_k, m.ect_b)
        noise = torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype)
        y = self.drop_labels(model, y, g)
        with torch.no_grad():
            target = consistency_fn(model, interpolate(noise, data, r), r, y)
        pred = consistency_fn(model, interpolate(noise, data, t), t, y)
        per = pseudo_huber(pred, target, m.ect_huber_c) / gap.float().clamp_min(1e-12)
        return per.mean(), {"ect_stage": torch.tensor(float(stage), device=dev)}


method_registry.register("ect", "Easy Consistency Tuning (Geng et al. 2024): consistency training from the flow "
                                "teacher's weights (method.teacher), shrinking step gap, no EMA target; 1-2 step "
                                "sampling with sampler=consistency",
                         keys=(*FLOW_KEYS, TeacherPathKeys, EctKeys))(EasyConsistencyTuning)
