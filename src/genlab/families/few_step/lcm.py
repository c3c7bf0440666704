"""Consistency distillation, LCM-style (Luo et al. 2023), from a flow teacher; docs/few_step.md has the maths. The
student takes the guidance scale as condition `w` (w / lcm_w_max); LCM's ω is genlab's w - 1.
"""
from __future__ import annotations

import torch

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import method_registry
from genlab.families.few_step.base import FewStepFlow, TeacherPathKeys, consistency_fn, pseudo_huber
from genlab.families.image_flow.flow import FLOW_KEYS, FLOW_SAMPLING, check_flow_config, interpolate, unwrap


class LcmKeys(cf.Keys, section="method"):
    lcm_timesteps: int = cf.F(50, "lcm: N, intervals of the uniform grid t_n = n/N of the teacher's solver (LCM: 50 DDIM steps)",
                              ge=2)
    lcm_skip: int = cf.F(1, "lcm: k, grid intervals of one teacher solver step t_n -> t_{n+k} (LCM: 20 of 1000 DDPM steps = "
                            "1 interval of its 50-step grid)", ge=1)
    lcm_solver: str = cf.F("euler", "lcm: the teacher's solver step (euler = DDIM on the flow path, as LCM; heun: two teacher "
                                    "calls, second order)", choices=("euler", "heun"))
    lcm_w_min: float = cf.F(1.0, "lcm: smallest guidance scale w drawn in training (genlab's CFG scale, 1 = none; LCM's "
                                 "omega in [2, 14] is w in [3, 15], made for Stable Diffusion)", ge=1)
    lcm_w_max: float = cf.F(3.0, "lcm: largest guidance scale w drawn in training; the student sees w / lcm_w_max", gt=0)
    lcm_guidance: float = cf.F(1.2, "lcm: guidance scale w fed to the student when sampling (within [lcm_w_min, lcm_w_max]; "
                                    "default: the teacher recipe's eval.cfg_scale)", ge=1)
    lcm_huber_c: float = cf.F(0.001, "lcm: c of the pseudo-Huber loss per pixel (LCM code: 0.001, applied per element there)",
                              ge=0)


def guided_velocity(teacher, x, t, y, w, null_class: int):
    """The teacher's CFG velocity v_u + w (v_c - v_u) with a scale per sample, in one forward of the doubled batch."""
    v = teacher(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y, null_class)]))
    v_c, v_u = v.chunk(2)
    w = w.view(-1, *([1] * (x.ndim - 1))).to(v.dtype)
    return v_u + w * (v_c - v_u)


def lcm_target(teacher, target_net, x_t, t, s, y, w, w_max: float, null_class: int, solver: str = "euler"):
    """f_θ⁻(x̂_s, s, w) with x̂_s one step of the teacher's guided ODE dx/dt = v from t to s (per-sample tensors) from
    x_t: the consistency distillation target."""
    h = (s - t).view(-1, *([1] * (x_t.ndim - 1))).to(x_t.dtype)
    v1 = guided_velocity(teacher, x_t, t, y, w, null_class)
    x_s = x_t + h * v1
    if solver == "heun":
        x_s = x_t + h * (v1 + guided_velocity(teacher, x_s, s, y, w, null_class)) / 2
    return consistency_fn(target_net, x_s, s, y, w=w / w_max)


class LatentConsistency(FewStepFlow):
    uses_teacher = True
    conditions = {"w": "scalar"}
    sampling_keys = FLOW_SAMPLING + ("method.lcm_guidance",)

    @staticmethod
    def check_config(cfg):
        check_flow_config(cfg)
        m = cfg.method
        keys = LcmKeys.of(m)
        if keys.lcm_skip >= keys.lcm_timesteps:
            raise GenlabError(f"method.lcm_skip ({keys.lcm_skip}) must be below method.lcm_timesteps ({keys.lcm_timesteps})")
        check_guidance(m)

    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        self.keys = LcmKeys.of(cfg)  # this method's own keys, typed (the same object as self.mcfg)
        check_guidance(self.mcfg)  # again here: `genlab eval|sample` may change method.lcm_guidance on a trained run

    def loss(self, model, batch, ctx):
        m, g, data, y = self.keys, ctx.generator, batch["image"], batch["label"]
        B, dev = data.shape[0], data.device
        N, k = m.lcm_timesteps, m.lcm_skip
        n = torch.randint(0, N - k + 1, (B,), generator=g, device=dev)
        t, s = n.float() / N, (n + k).float() / N
        w = m.lcm_w_min + (m.lcm_w_max - m.lcm_w_min) * torch.rand(B, generator=g, device=dev)
        noise = torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype)
        null = unwrap(model).null_class
        y = self.drop_labels(model, y, g)  # a dropped label: the unguided, unconditional trajectory (v_c = v_u)
        x_t = interpolate(noise, data, t)
        with torch.no_grad():
            target = lcm_target(ctx.extras["teacher"], ctx.ema if ctx.ema is not None else model, x_t, t, s, y, w,
                                m.lcm_w_max, null, m.lcm_solver)
        pred = consistency_fn(model, x_t, t, y, w=w / m.lcm_w_max)
        return pseudo_huber(pred, target, m.lcm_huber_c).mean(), {}

    def sample_conditions(self, n, device):
        return {"w": torch.full((n,), self.keys.lcm_guidance / self.keys.lcm_w_max, device=device)}


def check_guidance(m):
    if m.lcm_w_min > m.lcm_w_max:
        raise GenlabError(f"method.lcm_w_min ({m.lcm_w_min}) must not exceed method.lcm_w_max ({m.lcm_w_max})")
    if not m.lcm_w_min <= m.lcm_guidance <= m.lcm_w_max:
        raise GenlabError(f"method.lcm_guidance ({m.lcm_guidance}) must lie in the trained range [method.lcm_w_min, "
                          f"method.lcm_w_max] = [{m.lcm_w_min}, {m.lcm_w_max}]")


method_registry.register("lcm", "consistency distillation, LCM-style (Luo et al. 2023): a skipping-step solver on the "
                                "flow teacher (method.teacher), EMA target, guidance scale w as the student's input; "
                                "1-8 step sampling with sampler=consistency",
                         keys=(*FLOW_KEYS, TeacherPathKeys, LcmKeys))(LatentConsistency)
