"""Rectified flow / flow matching (Liu et al. 2022; Lipman et al. 2022; minRF).

Path: x_t = (1 - t) * noise + t * data, t=0 is noise and t=1 is data; the model predicts the
velocity v = data - noise. `interpolate` is the only place x_t is built, and `loss` only ever
calls the model on its output, so the clean image cannot reach the model by mistake.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from genlab.methods.base import Method
from genlab.methods.samplers import time_grid
from genlab.registry import method_registry, sampler_registry, timestep_sampler_registry


def interpolate(noise: torch.Tensor, data: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    t = t.view(-1, *([1] * (data.ndim - 1))).to(data.dtype)
    return (1 - t) * noise + t * data


def cfg_velocity(model, y, null_class: int, scale: float):
    """Velocity field with classifier-free guidance: v_u + s * (v_c - v_u), both in one batch."""
    if y is None:
        return lambda x, t: model(x, t, torch.full((x.shape[0],), null_class, device=x.device, dtype=torch.long))
    if scale == 1.0:
        return lambda x, t: model(x, t, y)

    def velocity(x, t):
        y_null = torch.full_like(y, null_class)
        v = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, y_null]))
        v_c, v_u = v.chunk(2)
        return v_u + scale * (v_c - v_u)
    return velocity


class FlowMatching(Method):
    family = "image"
    batch_keys = ("image", "label")

    def __init__(self, cfg, data_spec):
        self.cfg = cfg
        self.mcfg = cfg.method
        self.spec = data_spec
        self.class_dropout = cfg.model.class_dropout
        self.sample_t = timestep_sampler_registry.get(self.mcfg.timestep_sampler)

    def loss(self, model, batch, ctx):
        generator = ctx.generator
        data, y = batch["image"], batch["label"]
        B = data.shape[0]
        t = self.sample_t(B, generator, data.device, self.mcfg)
        noise = torch.randn(data.shape, generator=generator, device=data.device, dtype=data.dtype)
        x_t = interpolate(noise, data, t)
        if self.class_dropout > 0:
            drop = torch.rand(B, generator=generator, device=data.device) < self.class_dropout
            y = torch.where(drop, torch.full_like(y, unwrap(model).null_class), y)
        v = model(x_t, t, y)
        loss = F.mse_loss(v.float(), (data - noise).float())
        return loss, {}

    @torch.no_grad()
    def sample(self, model, labels: torch.Tensor | None, n: int | None = None, steps: int | None = None,
               cfg_scale: float | None = None, sampler: str | None = None, generator=None, device=None, callback=None):
        """Draw samples in [-1, 1] of shape [n, C, H, W]; labels None = unconditional.
        `callback(i, t, x)` runs after every sampler step (progress, pictures)."""
        base = unwrap(model)
        device = device or next(base.parameters()).device
        n = len(labels) if labels is not None else n
        C, S = self.spec["channels"], self.spec["image_size"]
        x = torch.randn((n, C, S, S), generator=generator, device=device)
        velocity = cfg_velocity(model, labels, base.null_class, self.mcfg.cfg_scale if cfg_scale is None else cfg_scale)
        ts = time_grid(steps or self.mcfg.sample_steps, device=device)
        return sampler_registry.get(sampler or self.mcfg.sampler)(velocity, x, ts, callback=callback)

    def check_eval(self, cfg) -> None:
        """Before training or sampling: eval.metrics valid and their weights files present."""
        if cfg.eval.num_samples > 0:
            from genlab.eval.metrics import check_metrics
            check_metrics(cfg.eval)

    def evaluate(self, model, data, ctx) -> dict:
        from genlab.eval.image_quality import evaluate_class_conditional
        return evaluate_class_conditional(self, model, data, ctx)

    def preview(self, model, path, ctx):
        from genlab.eval.image_quality import save_class_grid
        return save_class_grid(self, model, path, ctx)


def unwrap(model):
    """The underlying backbone of a DDP/compiled wrapper."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif hasattr(model, "module") and not hasattr(model, "blocks"):
            model = model.module
        else:
            return model


@method_registry.register("flow", "rectified flow (x_t=(1-t)noise+t*data, v=data-noise), Euler/Heun ODE sampling, CFG")
def build_flow(cfg, data_spec):
    return FlowMatching(cfg, data_spec)
