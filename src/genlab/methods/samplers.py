"""ODE samplers for flow matching as small pure functions of a velocity field.

`velocity(x, t) -> v` where t is a [B] tensor; the path runs from t=0 (noise) to t=1 (data).
`callback(i, t, x)` is called after every step (for pictures and progress).
"""
import torch

from genlab.registry import sampler_registry


def time_grid(steps: int, device=None) -> torch.Tensor:
    return torch.linspace(0.0, 1.0, steps + 1, device=device)


@sampler_registry.register("euler", "explicit Euler on the probability-flow ODE, 1 evaluation per step")
@torch.no_grad()
def sample_euler(velocity, x, ts, callback=None):
    for i in range(len(ts) - 1):
        t = ts[i].expand(x.shape[0])
        x = x + (ts[i + 1] - ts[i]) * velocity(x, t)
        if callback is not None:
            callback(i, ts[i + 1], x)
    return x


@sampler_registry.register("heun", "Heun's 2nd-order method (Karras et al. 2022, Alg. 1), 2 evaluations per step")
@torch.no_grad()
def sample_heun(velocity, x, ts, callback=None):
    for i in range(len(ts) - 1):
        dt = ts[i + 1] - ts[i]
        v0 = velocity(x, ts[i].expand(x.shape[0]))
        x_pred = x + dt * v0
        v1 = velocity(x_pred, ts[i + 1].expand(x.shape[0]))
        x = x + dt * 0.5 * (v0 + v1)
        if callback is not None:
            callback(i, ts[i + 1], x)
    return x
