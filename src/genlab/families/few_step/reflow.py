"""Reflow (Liu, Gong, Liu 2022): 2-rectified flow on the teacher's pairs (`genlab data generate pairs RUN`), and its
one-step distillation at t = 0 (docs/few_step.md). Scored against the teacher's data, not the teacher's samples.
"""
from __future__ import annotations

import numpy as np
import torch

from genlab.config import fields as cf
from genlab.families.base import method_registry
from genlab.families.baselines import MAX_IMAGES, Baseline, mean_element_variance
from genlab.families.few_step.base import FewStepFlow, TeacherPathKeys
from genlab.families.image_flow.flow import FLOW_KEYS, MEAN_VELOCITY, WEIGHT_DRAWS, interpolate


class ReflowKeys(cf.Keys, section="method"):
    reflow_stage: str = cf.F("reflow", "reflow: 'reflow' = 2-rectified flow on the pairs (all t), 'distill' = one-step "
                                       "distillation of a reflow run (t = 0 only)", choices=("reflow", "distill"))


class Reflow(FewStepFlow):
    batch_keys = ("image", "label", "noise")
    output = "velocity"  # a reflowed model teaches the distill stage

    def trivial_baselines(self, data, generator):
        # E[w] times the variance of sample - noise, counted on the pairs (the teacher made one from the other)
        idx = np.arange(min(len(data), MAX_IMAGES))
        v = np.asarray(data.samples[idx], dtype=np.float64) - np.asarray(data.noise[idx], dtype=np.float64)
        t = torch.zeros(1) if self.mcfg.reflow_stage == "distill" else self.draw_t(WEIGHT_DRAWS, generator, "cpu")
        w = float(self.weight(t.double(), self.mcfg).mean())
        return [Baseline("loss", w * mean_element_variance(v), MEAN_VELOCITY)]

    def loss(self, model, batch, ctx):
        g, data, noise, y = ctx.generator, batch["image"], batch["noise"], batch["label"]
        B, dev = data.shape[0], data.device
        distill = ReflowKeys.of(self.mcfg).reflow_stage == "distill"
        t = torch.zeros(B, device=dev) if distill else self.draw_t(B, g, dev, ctx.step)
        x_t = interpolate(noise, data, t)  # at t = 0 the pair's noise itself
        y = self.drop_labels(model, y, g)
        per = (model(x_t, t, y).float() - (data - noise).float()).square().flatten(1).mean(1)
        return (self.weight(t.float(), self.mcfg) * per).mean(), {}

    def synthetic_batch(self, batch_size, device, generator):
        b = super().synthetic_batch(batch_size, device, generator)
        return {**b, "noise": torch.randn(b["image"].shape, generator=generator, device=device)}


method_registry.register("reflow", "reflow (Liu et al. 2022): 2-rectified flow on teacher pairs (data.name=pairs), "
                                   "then one-step distillation at t = 0 (method.reflow_stage=distill); Euler sampling",
                         keys=(*FLOW_KEYS, TeacherPathKeys, ReflowKeys))(Reflow)  # no teacher forwards: no guidance key
