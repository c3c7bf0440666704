"""PeRFlow, piecewise rectified flow (Yan et al. 2024): reflow within K time windows, with the pairs made online from
the teacher's guided ODE (docs/few_step.md). Sample with euler at K steps.
"""
from __future__ import annotations

import torch

from genlab.config import fields as cf
from genlab.families.base import method_registry
from genlab.families.few_step.base import FewStepFlow, TeacherKeys
from genlab.families.image_flow.flow import FLOW_KEYS, interpolate


class PerflowKeys(cf.Keys, section="method"):
    perflow_windows: int = cf.F(4, "perflow: time windows K, edges j/K (sample with sampler=euler at K steps; paper and "
                                   "official 4)", ge=1)
    perflow_solver: str = cf.F("euler", "perflow: the teacher's ODE solver across a window (official: DDIM, an Euler step "
                                        "on this path)", choices=("euler", "heun"))
    perflow_solver_steps: int = cf.F(8, "perflow: solver steps per window (official 8)", ge=1)


def window_edges(k: int) -> torch.Tensor:
    """0 = w_0 < w_1 < ... < w_k = 1, uniform (float64, exact at both ends)."""
    return torch.arange(k + 1, dtype=torch.float64) / k


def solve_window(velocity, x, t0, t1, steps: int, heun: bool):
    """The ODE dx/dt = velocity(x, t) from t0 to t1 (per-sample [B] tensors) in `steps` equal Euler or Heun steps."""
    dt = (t1 - t0) / steps
    dtv = dt.view(-1, *([1] * (x.ndim - 1))).to(x.dtype)
    for i in range(steps):
        t = t0 + i * dt
        v = velocity(x, t)
        if heun:
            v = (v + velocity(x + dtv * v, t + dt)) / 2
        x = x + dtv * v
    return x


def chord(x_start, x_end, w0, w1, s):
    """The point at fraction s of the segment x_start -> x_end, and its constant velocity over [w0, w1]."""
    view = (-1, *([1] * (x_start.ndim - 1)))
    return x_start + s.view(view).to(x_start.dtype) * (x_end - x_start), (x_end - x_start) / (w1 - w0).view(view).to(x_start.dtype)


class PeRFlow(FewStepFlow):
    uses_teacher = True

    def loss(self, model, batch, ctx):
        g, data, y = ctx.generator, batch["image"], batch["label"]
        keys = PerflowKeys.of(self.mcfg)
        B, dev, K = data.shape[0], data.device, keys.perflow_windows
        j = torch.randint(0, K, (B,), generator=g, device=dev)
        edges = window_edges(K).to(dev, torch.float32)
        w0, w1 = edges[j], edges[j + 1]
        noise = torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype)
        x_start = interpolate(noise, data, w0)
        with torch.no_grad():
            x_end = solve_window(self.teacher_velocity(ctx.extras["teacher"], y), x_start, w0, w1,
                                 keys.perflow_solver_steps, keys.perflow_solver == "heun")
        s = self.draw_t(B, g, dev, ctx.step)
        x_t, target = chord(x_start, x_end, w0, w1, s)
        y = self.drop_labels(model, y, g)
        t = w0 + s * (w1 - w0)
        per = (model(x_t, t, y).float() - target.float()).square().flatten(1).mean(1)
        return (self.weight(t.float(), self.mcfg) * per).mean(), {}


method_registry.register("perflow", "PeRFlow (Yan et al. 2024): piecewise reflow in method.perflow_windows windows, "
                                    "pairs made online by the teacher's ODE; sampler=euler at K steps",
                         keys=(*FLOW_KEYS, TeacherKeys, PerflowKeys))(PeRFlow)
