"""Shortcut models (Frans et al. 2024): the average velocity of a step of size d (docs/few_step.md). d_min is the
official code's 1 / method.shortcut_min_steps, not the paper's d = 0, so d can enter as its log2.
"""
from __future__ import annotations

import math

import torch

from genlab.config import fields as cf
from genlab.families.base import method_registry
from genlab.families.baselines import Baseline
from genlab.families.few_step.base import FewStepFlow
from genlab.families.image_flow.flow import FLOW_KEYS, MEAN_VELOCITY, interpolate


class ShortcutKeys(cf.Keys, section="method"):
    shortcut_min_steps: int = cf.F(128, "shortcut: steps of the smallest step size d_min = 1/N (a power of two; official 128)",
                                   ge=2, choices=(2, 4, 8, 16, 32, 64, 128, 256, 512))
    shortcut_share: float = cf.F(0.125, "shortcut: share of each batch with self-consistency targets (official 1/8)", gt=0, lt=1)
    shortcut_clip: float = cf.F(4.0, "shortcut: self-consistency targets are clipped to [-c, c] (official 4)", gt=0)


def two_step_target(target_model, x_t, t, d, y):
    """The self-consistency target of one 2d-step: the mean of two d-steps of the target network."""
    dv = d.view(-1, *([1] * (x_t.ndim - 1)))
    v1 = target_model(x_t, t, y, d=d)
    v2 = target_model(x_t + dv * v1, t + d, y, d=d)
    return (v1 + v2) / 2


class Shortcut(FewStepFlow):
    conditions = {"d": "log2_scalar"}
    init_from_teacher = False

    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        self.keys = ShortcutKeys.of(cfg)  # this method's own keys, typed (the same object as self.mcfg)
        self.levels = int(math.log2(self.keys.shortcut_min_steps))

    def trivial_baselines(self, data, generator):
        # a constant model meets the self-consistency targets; the flow part (loss_flow, unweighted) is flow's
        return [Baseline("loss_flow", self.mean_velocity_loss(data, generator, weighted=False), MEAN_VELOCITY)]

    def loss(self, model, batch, ctx):
        g, data, y = ctx.generator, batch["image"], batch["label"]
        B, dev = data.shape[0], data.device
        nb = max(1, int(round(B * self.keys.shortcut_share)))
        noise = torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype)
        # self-consistency part: d = 2^-k, t a multiple of 2d with t + 2d <= 1
        k = torch.randint(0, self.levels, (nb,), generator=g, device=dev)
        d = torch.pow(2.0, -(k + 1).float())                      # each of the two half steps; the jump is 2d
        slots = torch.pow(2.0, k.float())                          # number of 2d-steps in [0, 1]
        t_b = torch.floor(torch.rand(nb, generator=g, device=dev) * slots) / slots
        x_b = interpolate(noise[:nb], data[:nb], t_b)
        target_net = ctx.ema if ctx.ema is not None else model
        with torch.no_grad():
            v_b = two_step_target(target_net, x_b, t_b, d, y[:nb]).float().clamp(-self.keys.shortcut_clip,
                                                                                   self.keys.shortcut_clip)
        # flow-matching part at the smallest step
        t_f = self.draw_t(B - nb, g, dev, ctx.step)
        x_f = interpolate(noise[nb:], data[nb:], t_f)
        y_f = self.drop_labels(model, y[nb:], g)
        d_min = torch.full((B - nb,), 1.0 / self.keys.shortcut_min_steps, device=dev)
        # one forward over both parts; the 2d-step's size is 2d
        out = model(torch.cat([x_b, x_f]), torch.cat([t_b, t_f]), torch.cat([y[:nb], y_f]), d=torch.cat([2 * d, d_min]))
        target = torch.cat([v_b, (data[nb:] - noise[nb:]).float()])
        per = (out.float() - target).square().flatten(1).mean(1)
        return per.mean(), {"loss_flow": per[nb:].mean().detach(), "loss_consistency": per[:nb].mean().detach()}


method_registry.register("shortcut", "shortcut model (Frans et al. 2024): velocity conditioned on the step size d, "
                                     "self-consistency targets from two half steps of the EMA; 1/2/4/8-step sampling "
                                     "with sampler=flow_map",
                         keys=(*FLOW_KEYS, ShortcutKeys), defaults={"method.sampler": "flow_map"})(Shortcut)
