"""Phased Consistency Models (Wang et al. 2024), distilled from a flow teacher; docs/few_step.md has the maths. Within a
phase f(x, t) = x + (e_end - t) v(x, t), the identity at the phase end, so `euler` at k steps lands on the edges.
"""
from __future__ import annotations

import torch

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import method_registry
from genlab.families.few_step.base import FewStepFlow, TeacherKeys
from genlab.families.few_step.discriminator import DiscKeys, add_discriminator, check_disc_config, renoise, renoise_time
from genlab.families.image_flow.flow import FLOW_KEYS, check_flow_config, interpolate


class PcmKeys(cf.Keys, section="method"):
    pcm_phases: int = cf.F(4, "pcm: phases k of the trajectory, edges j/k (paper: 4, or 2 with the adversarial loss); "
                              "sample with sampler=euler at sample_steps=k", ge=1)
    pcm_solver_steps: int = cf.F(50, "pcm: teacher ODE grid N: training times i/N and one teacher Euler step of 1/N "
                                     "(official 50)", ge=1)
    pcm_adv_weight: float = cf.F(0.0, "pcm: weight of the adversarial consistency loss (0 = off; official 0.1), a "
                                      "discriminator on the teacher's features (method.tdisc_*)", ge=0)


def phase_end(t: torch.Tensor, k: int) -> torch.Tensor:
    """e_{j+1} of the phase [e_j, e_{j+1}) holding t (t = 1 is the end of the last phase). The tolerance puts an edge
    rounded just below its value (float32 2/3 * 3 < 2) in the phase it starts."""
    return (torch.floor(t * k + 1e-5).clamp(max=k - 1) + 1) / k


def phase_function(velocity, x, t, end):
    """f(x, t) = x + (end - t) v(x, t): the phase end predicted from x_t (the identity at t = end)."""
    return x + (end - t).view(-1, *([1] * (x.ndim - 1))).to(x.dtype) * velocity(x, t)


class PCM(FewStepFlow):
    uses_teacher = True

    @staticmethod
    def check_config(cfg):
        check_flow_config(cfg)
        m = PcmKeys.of(cfg)
        if m.pcm_phases > m.pcm_solver_steps:  # a phase without a time of the grid i/N would never be trained
            raise GenlabError(f"method.pcm_phases ({m.pcm_phases}) must not exceed method.pcm_solver_steps "
                              f"({m.pcm_solver_steps}): every phase needs a training time on the grid i/N")
        if m.pcm_adv_weight > 0:
            check_disc_config(cfg)

    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        self.keys = PcmKeys.of(cfg)  # this method's own keys, typed (the same object as self.mcfg)
        self.k, self.n = self.keys.pcm_phases, self.keys.pcm_solver_steps
        self.adv_weight = self.keys.pcm_adv_weight
        self.adversary = None

    def extra_modules(self):
        extras = super().extra_modules()
        if self.adv_weight > 0:
            self.adversary = add_discriminator(extras, self.mcfg, self.spec["num_classes"])
        return extras

    def loss(self, model, batch, ctx):
        g, data, y = ctx.generator, batch["image"], batch["label"]
        B, dev = data.shape[0], data.device
        teacher = ctx.extras["teacher"]
        t = torch.randint(0, self.n, (B,), generator=g, device=dev).float() / self.n
        end = phase_end(t, self.k)
        t_next = torch.minimum(t + 1.0 / self.n, end)
        noise = torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype)
        x_t = interpolate(noise, data, t)
        target_net = ctx.ema if ctx.ema is not None else model
        with torch.no_grad():  # one teacher Euler step from t to t_next, then the target network's phase function
            x_next = x_t + (t_next - t).view(-1, *([1] * (x_t.ndim - 1))).to(x_t.dtype) * self.teacher_velocity(teacher, y)(x_t, t)
            target = phase_function(lambda x, s: target_net(x, s, y), x_next, t_next, end).float()
        pred = phase_function(lambda x, s: model(x, s, y), x_t, t, end)
        cm = (pred.float() - target).square().mean()
        if self.adversary is None:
            return cm, {}
        t_adv = renoise_time(end, 1.0 / self.k, g, self.mcfg)
        fake_t = renoise(pred, end, t_adv, torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype))
        real_t = renoise(target, end, t_adv, torch.randn(data.shape, generator=g, device=dev, dtype=target.dtype))
        adv, d_loss, metrics = self.adversary(teacher, ctx.extras["disc"], fake_t, real_t, t_adv, y, pred, target)
        return {"model": cm + self.adv_weight * adv, "disc": d_loss}, {"loss_consistency": cm.detach(), **metrics}


method_registry.register("pcm", "phased consistency distillation (Wang et al. 2024) from method.teacher: k phases, "
                                "f(x,t) = x + (e_end - t) v, EMA target after one guided teacher Euler step; optional "
                                "adversarial loss on teacher features; sampler=euler at k steps",
                         keys=(*FLOW_KEYS, TeacherKeys, PcmKeys, DiscKeys))(PCM)
