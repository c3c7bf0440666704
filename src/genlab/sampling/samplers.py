"""Samplers for flow matching as small pure functions of a velocity field, and their step schedules.

`velocity(x, t, **extra_args) -> v` with t a [B] tensor, from t=0 (noise) to t=1 (data); `extra_args` (classes, a
step size, ...) pass to the model untouched, as in k-diffusion. `callback(i, t, x, denoised)` follows every step with
the data estimate x_t + (1 - t) v of the step's start point. NFE of a run = steps * the spec's `nfe_per_step`.
"""
import inspect
from dataclasses import dataclass

import torch

from genlab.config import fields as cf
from genlab.core.registry import Registry, Spec


@dataclass(frozen=True, kw_only=True)
class SamplerSpec(Spec):
    nfe_per_step: int = 1                  # model evaluations per step (NFE = steps * this)
    condition: str | None = None           # a model condition it sets itself at every step (e.g. "d", the step size)


sampler_registry = Registry("sampler", SamplerSpec)
step_schedule_registry = Registry("step_schedule")


# -- step schedules: the grid 0 = t_0 < t_1 < ... < t_N = 1 ----------------------------------------
class ShiftedKeys(cf.Keys, section="method"):
    sample_shift: float = cf.F(3.0, "flow, step_schedule=shifted: shift s of the grid t/(s(1-t)+t)", gt=0)


# declared here, with lq_map; the linear_quadratic timestep sampler (families/image_flow/timesteps.py) owns them
class LqKeys(cf.Keys, section="method"):
    lq_threshold: float = cf.F(0.025, "flow, linear_quadratic (sampler or step schedule): t reached by the linear part (Mochi)", gt=0, lt=1)
    lq_linear_frac: float = cf.F(0.5, "flow, linear_quadratic: fraction of the steps (draws) in the linear part (Mochi)", gt=0, lt=1)


class SdeKeys(cf.Keys, section="method"):
    sde_noise: float = cf.F(1.0, "flow, euler_maruyama: eta of the diffusion g(t)^2 = 2 eta (1-t) (0 = the ODE)", ge=0)


# -- time maps shared by the step schedules here and the training-time samplers (families/image_flow/timesteps.py) --

def shift_time(t, shift: float):
    """SD3's resolution shift in genlab's convention: t' = t / (shift (1 - t) + t), so SNR(t') = SNR(t) / shift^2.
    SD3 writes it for its own time s = 1 - t as s' = shift s / (1 + (shift - 1) s); the two are the same map."""
    if shift == 1.0:
        return t
    return t / (shift * (1 - t) + t)


def lq_map(s, threshold=0.025, linear_frac=0.5):
    """Mochi's linear-quadratic schedule as a continuous map of the step fraction s in [0, 1] (genlab t):
    linear from 0 to `threshold` over the first `linear_frac` of the steps, then the quadratic with the same
    value and slope there that ends at t=1 (Genmo's Mochi 1 sampler, `linear_quadratic_schedule`)."""
    a, tau = linear_frac, threshold
    k = (1 - tau / a) / (1 - a) ** 2
    d = s - a
    return torch.where(s <= a, tau * s / a, tau + tau / a * d + k * d * d)


@step_schedule_registry.register("uniform", "t_i = i / N")
def uniform_grid(steps, cfg=None):
    return torch.linspace(0.0, 1.0, steps + 1)


@step_schedule_registry.register("shifted", "uniform grid through SD3's shift t/(s(1-t)+t), s = method.sample_shift "
                                            "(> 1: more steps near the noise; Esser et al. 2024)",
    keys=ShiftedKeys)
def shifted_grid(steps, cfg=None):
    return shift_time(torch.linspace(0.0, 1.0, steps + 1), ShiftedKeys.of_or_defaults(cfg).sample_shift)


@step_schedule_registry.register("linear_quadratic", "Mochi 1's grid: linear to method.lq_threshold over the first "
                                                     "method.lq_linear_frac of the steps, then quadratic (Genmo 2024)",
    reads=LqKeys.dotted())
def linear_quadratic_grid(steps, cfg=None):
    k = LqKeys.of_or_defaults(cfg)
    return lq_map(torch.linspace(0.0, 1.0, steps + 1), k.lq_threshold, k.lq_linear_frac)


def time_grid(steps: int, device=None, schedule: str = "uniform", cfg=None) -> torch.Tensor:
    ts = step_schedule_registry.get(schedule)(steps, cfg)
    ts[0], ts[-1] = 0.0, 1.0  # exact end points whatever the rounding of the map
    # from pinned memory, asynchronously: sampling never waits on the host (a compiled caller bakes the grid in as a
    # constant instead, and fake tensors cannot be pinned)
    if torch.device(device or "cpu").type == "cuda" and not torch.compiler.is_compiling():
        return ts.pin_memory().to(device, non_blocking=True)
    return ts.to(device)


def call_sampler(fn, velocity, x, ts, callback=None, extra_args=None, **opts):
    """Run a registered sampler, passing only the options it declares (the SDE takes a generator and noise)."""
    params = inspect.signature(fn).parameters
    return fn(velocity, x, ts, callback=callback, extra_args=extra_args, **{k: v for k, v in opts.items() if k in params})


def _integrate(x, ts, callback, step):
    """The loop every sampler shares: x_{i+1}, v = step(i, x_i, t_i, t_{i+1}), then callback(i, t_{i+1}, x_{i+1},
    denoised) with denoised = x_i + (1 - t_i) v, the data the step's start point predicts."""
    for i in range(len(ts) - 1):
        x_next, v = step(i, x, ts[i], ts[i + 1])
        if callback is not None:
            callback(i, ts[i + 1], x_next, x + (1 - ts[i]) * v)
        x = x_next
    return x


def nfe_per_step(name: str) -> int:
    return sampler_registry.spec(name).nfe_per_step


@sampler_registry.register("euler", "explicit Euler on the probability-flow ODE, 1 evaluation per step")
@torch.no_grad()
def sample_euler(velocity, x, ts, callback=None, extra_args=None):
    extra = extra_args or {}

    def step(i, x, t, t_next):
        v = velocity(x, t.expand(x.shape[0]), **extra)
        return x + (t_next - t) * v, v
    return _integrate(x, ts, callback, step)


@sampler_registry.register("heun", "Heun's 2nd-order method (Karras et al. 2022, Alg. 1), 2 evaluations per step",
                           nfe_per_step=2)
@torch.no_grad()
def sample_heun(velocity, x, ts, callback=None, extra_args=None):
    extra = extra_args or {}

    def step(i, x, t, t_next):
        dt = t_next - t
        v0 = velocity(x, t.expand(x.shape[0]), **extra)
        v1 = velocity(x + dt * v0, t_next.expand(x.shape[0]), **extra)
        return x + dt * 0.5 * (v0 + v1), v0
    return _integrate(x, ts, callback, step)


@sampler_registry.register("midpoint", "explicit midpoint rule (2nd-order Runge-Kutta), 2 evaluations per step",
                           nfe_per_step=2)
@torch.no_grad()
def sample_midpoint(velocity, x, ts, callback=None, extra_args=None):
    extra = extra_args or {}

    def step(i, x, t, t_next):
        dt = t_next - t
        v0 = velocity(x, t.expand(x.shape[0]), **extra)
        return x + dt * velocity(x + 0.5 * dt * v0, (t + 0.5 * dt).expand(x.shape[0]), **extra), v0
    return _integrate(x, ts, callback, step)


@sampler_registry.register("euler_maruyama", "Euler-Maruyama on the flow's marginal-preserving SDE dx = [v - eta (x - t v)] dt "
                                             "+ sqrt(2 eta (1-t)) dW (eta = method.sde_noise; 0 = Euler)",
                           keys=SdeKeys)
@torch.no_grad()
def sample_euler_maruyama(velocity, x, ts, callback=None, generator=None, noise: float = 1.0, extra_args=None):
    """For x_t = (1-t) z + t x1 the velocity is v = E[x1 - z | x_t], and E[z | x_t] = x_t - t v, so the score is
    grad log p_t(x) = -E[z | x_t] / (1-t) = -(x - t v) / (1-t). Any g(t) gives an SDE with the ODE's marginals
    (Fokker-Planck): dx = [v + g^2/2 grad log p_t] dt + g dW, integrated forward in t from noise to data. With
    g(t)^2 = 2 eta (1-t) the drift is v - eta (x - t v), finite at both ends, and g vanishes at the data.
    The last step is deterministic: x + (1-t) v = E[x1 | x_t] when it ends at t=1 (no noise left in the output)."""
    extra = extra_args or {}

    def step(i, x, t, t_next):
        dt = t_next - t
        v = velocity(x, t.expand(x.shape[0]), **extra)
        if i == len(ts) - 2 or noise == 0:
            return x + dt * v, v
        g = torch.sqrt(2 * noise * (1 - t) * dt)
        return x + dt * (v - noise * (x - t * v)) + g * torch.randn(x.shape, generator=generator, device=x.device,
                                                                    dtype=x.dtype), v
    return _integrate(x, ts, callback, step)


# flow_map: the model, given the step size d as its `d` input, returns the average velocity over the step:
# x_{i+1} = x_i + d * u(x_i, t_i, d) (shortcut models, MeanFlow), exact for any N when u is exact.
# consistency: the data estimate x1 = x + (1 - t) v is re-noised, x_{i+1} = (1 - t_{i+1}) z + t_{i+1} x1
# (Song et al. 2023, Alg. 1).
@sampler_registry.register("flow_map", "x + d * u(x, t, d): one call per step of size d (the model is trained with the "
                                       "step size as its input `d`: shortcut, MeanFlow)", condition="d")
@torch.no_grad()
def sample_flow_map(velocity, x, ts, callback=None, extra_args=None):
    extra = extra_args or {}

    def step(i, x, t, t_next):
        d = (t_next - t).expand(x.shape[0])
        u = velocity(x, t.expand(x.shape[0]), **extra, d=d)
        return x + d.view(-1, *([1] * (x.ndim - 1))) * u, u
    return _integrate(x, ts, callback, step)


@sampler_registry.register("consistency", "multistep consistency sampling: predict the data x + (1-t) v, re-noise it to "
                                          "the next time with fresh noise; one call per step")
@torch.no_grad()
def sample_consistency(velocity, x, ts, callback=None, extra_args=None, generator=None):
    extra = extra_args or {}

    def step(i, x, t, t_next):
        v = velocity(x, t.expand(x.shape[0]), **extra)
        x1 = x + (1 - t) * v
        if i == len(ts) - 2:
            return x1, v
        z = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return (1 - t_next) * z + t_next * x1, v
    return _integrate(x, ts, callback, step)
