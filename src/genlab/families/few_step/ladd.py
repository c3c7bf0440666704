"""Latent Adversarial Diffusion Distillation (Sauer et al. 2024) from a flow teacher (docs/few_step.md). The regression
term acts on pure-noise samples only: paired with fresh noise its best guess is the class mean, a pull to collapse.
"""
from __future__ import annotations

import torch

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import method_registry
from genlab.families.few_step.base import FewStepFlow, TeacherPathKeys, consistency_fn
from genlab.families.few_step.discriminator import DiscKeys, add_discriminator, check_disc_config, renoise, renoise_time
from genlab.families.image_flow.flow import FLOW_KEYS, check_flow_config, interpolate


class LaddKeys(cf.Keys, section="method"):
    ladd_student_steps: int = cf.F(4, "ladd: the student's times t = i/n, i = 0..n-1 (paper: 4, pure noise included)", ge=1)
    ladd_noise_share: float = cf.F(0.7, "ladd: share of each batch at pure noise t = 0 (paper: 0.7; the rest is uniform over "
                                        "the other student times, 0.1 each at 4 steps as the paper)", ge=0, le=1)
    ladd_warmup_steps: int = cf.F(0, "ladd: first steps in which the student trains only at its less noisy half of times, "
                                     "i/n with i >= n/2 (paper: 500 steps at its two least noisy of 4; 0 = none)", ge=0)
    ladd_regression_weight: float = cf.F(0.0, "ladd: weight of the regression term mean (x^1(z, 0) - image)^2 on the "
                                              "pure-noise samples, z the teacher pair's noise (needs data.name=pairs; 0 = "
                                              "adversarial only, as the paper)", ge=0)


def student_times(n_times: int, B: int, noise_share: float, generator, device, warmup: bool = False) -> torch.Tensor:
    """t = 0 with probability noise_share (1 when n = 1), else i/n with i uniform in 1..n-1; in the warm-up, i uniform
    in ceil(n/2)..n-1 (the paper's warm-up trains its 4-step student at its two least noisy times first)."""
    if n_times == 1:
        return torch.zeros(B, device=device)
    pure = torch.rand(B, generator=generator, device=device) < noise_share
    if warmup:
        pure = torch.zeros_like(pure)
    i = torch.randint((n_times + 1) // 2 if warmup else 1, n_times, (B,), generator=generator, device=device)
    return torch.where(pure, torch.zeros_like(i), i).float() / n_times


class LADD(FewStepFlow):
    uses_teacher = True

    @staticmethod
    def check_config(cfg):
        check_flow_config(cfg)
        check_disc_config(cfg)
        m = LaddKeys.of(cfg)
        if m.ladd_regression_weight > 0 and m.ladd_noise_share == 0 and m.ladd_student_steps > 1:
            raise GenlabError("method.ladd_regression_weight acts on the pure-noise samples, and method.ladd_noise_share=0 "
                              "leaves none; raise the share or set the weight to 0")

    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        self.keys = LaddKeys.of(cfg)  # this method's own keys, typed (the same object as self.mcfg)
        self.adversary = None
        if self.keys.ladd_regression_weight > 0:  # the regression target is the teacher's image for the pair's noise
            self.batch_keys = (*self.batch_keys, "noise")

    def extra_modules(self):
        extras = super().extra_modules()
        self.adversary = add_discriminator(extras, self.mcfg, self.spec["num_classes"])
        return extras

    def loss(self, model, batch, ctx):
        g, data, y = ctx.generator, batch["image"], batch["label"]
        B, dev, m, k = data.shape[0], data.device, self.mcfg, self.keys
        t = student_times(k.ladd_student_steps, B, k.ladd_noise_share, g, dev, warmup=ctx.step < k.ladd_warmup_steps)
        pure = t == 0
        z = torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype)
        if "noise" in batch:  # teacher pairs: pure noise is the pair's own, whose teacher image is `data`
            z = torch.where(pure.view(-1, *([1] * (data.ndim - 1))), batch["noise"].to(z.dtype), z)
        x_t = interpolate(z, data, t)
        x1 = consistency_fn(model, x_t, t, y)  # the student's data prediction
        one = torch.ones(B, device=dev)
        t_adv = renoise_time(one, 1.0, g, m)
        fake_t = renoise(x1, one, t_adv, torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype))
        real_t = renoise(data, one, t_adv, torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype))
        adv, d_loss, metrics = self.adversary(ctx.extras["teacher"], ctx.extras["disc"], fake_t, real_t, t_adv, y, x1, data)
        model_loss = adv
        if k.ladd_regression_weight > 0:  # over the pure-noise samples only (see the module's docstring)
            per = (x1.float() - data.float()).square().flatten(1).mean(1)
            reg = (per * pure).sum() / pure.sum().clamp_min(1)
            model_loss = model_loss + k.ladd_regression_weight * reg
            metrics["loss_regression"] = reg.detach()
        return {"model": model_loss, "disc": d_loss}, metrics


method_registry.register("ladd", "latent adversarial diffusion distillation (Sauer et al. 2024) from method.teacher: "
                                 "the student's data prediction re-noised toward noise, judged by heads on the frozen "
                                 "teacher's features (hinge); sampler=consistency at 1-4 steps",
                         keys=(*FLOW_KEYS, TeacherPathKeys, LaddKeys, DiscKeys))(LADD)
