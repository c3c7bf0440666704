"""Latent Adversarial Diffusion Distillation (Sauer et al. 2024, "Fast High-Resolution Image Synthesis with Latent
Adversarial Diffusion Distillation"), from a flow teacher.

genlab's time convention (t=0 noise, t=1 data; the paper writes t=1 for noise). The student starts as the teacher
and is a data predictor at a few student times t_i = i/n, i = 0..n-1 (method.ladd_student_steps; the paper's
four times 1, 0.75, 0.5, 0.25 are 0, 0.25, 0.5, 0.75 here, pure noise included):

    x_t = (1-t) noise + t image,     x^1 = x_t + (1 - t) v_theta(x_t, t)

The paper samples pure noise more often than the other times (method.ladd_noise_share of the batch, 0.7 as the
paper; the rest uniform over the others), after a warm-up at the less noisy times (method.ladd_warmup_steps). x^1 is
re-noised to t' = sigmoid(N(tdisc_t_mean, tdisc_t_std)) (the paper's logit-normal shifted toward noise, m = 1 with
t=1 noise, is mean -1 here), the real image is re-noised the same way with its own noise, and heads on the frozen
teacher's features, conditioned on the class and t', judge both (discriminator.py: hinge losses, the generator
gradient through the frozen teacher). LADD trains on teacher-generated images: point data.path at the dataset of
`genlab data generate pairs RUN` (real images work too, and make it a GAN fine-tune against the data).

Optional regression term (method.ladd_regression_weight, default 0 as in the paper; DMD's regression loss, Yin et al.
2024): on teacher pairs (data.name=pairs, batches with "noise") the pure-noise samples start from the pair's own noise
z, so the target is the teacher's image for exactly that noise, mean (x^1(z, 0) - image)^2 over those samples. That
anchors the student's noise -> image map to the teacher's, which covers the teacher's modes. Samples at t > 0 start
from fresh noise, as the sampler's re-noising does, and get no regression term: with a fresh noise the best guess of
the image is the posterior mean, a blur. Paired with fresh noise the term would pull every sample toward the mean of
its class (a collapse), so a regression weight needs the pairs' noise (a one-line batch-key error otherwise).

Sampling: the `consistency` sampler at 1-4 steps (its uniform grid i/n is the student times for n = the student
steps, or a subset of them for its divisors). Guards: a non-finite adversarial term is zeroed and counted
(adv_nonfinite), steps whose student batch has under half the real batch's spread are counted (adv_collapsed);
report both with the batch size (docs/few_step.md).
"""
from __future__ import annotations

import torch

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import method_registry
from genlab.families.few_step.base import FEW_STEP_KEYS, FewStepFlow, TeacherPathKeys, consistency_fn
from genlab.families.few_step.discriminator import DiscKeys, add_discriminator, check_disc_config, renoise, renoise_time
from genlab.families.image_flow.flow import check_flow_config, interpolate


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
    init_from_teacher = True

    @staticmethod
    def check_config(cfg):
        check_ladd_config(cfg)

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


def check_ladd_config(cfg):
    check_flow_config(cfg)
    check_disc_config(cfg)
    m = LaddKeys.of(cfg)
    if m.ladd_regression_weight > 0 and m.ladd_noise_share == 0 and m.ladd_student_steps > 1:
        raise GenlabError("method.ladd_regression_weight acts on the pure-noise samples, and method.ladd_noise_share=0 "
                          "leaves none; raise the share or set the weight to 0")


method_registry.register("ladd", "latent adversarial diffusion distillation (Sauer et al. 2024) from method.teacher: "
                                 "the student's data prediction re-noised toward noise, judged by heads on the frozen "
                                 "teacher's features (hinge); sampler=consistency at 1-4 steps",
                         keys=(*FEW_STEP_KEYS, TeacherPathKeys, LaddKeys, DiscKeys))(LADD)
