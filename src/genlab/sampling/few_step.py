"""Few-step samplers, registered beside the flow samplers (sampling/samplers.py) and called the same way:
`fn(velocity, x, ts, callback, extra_args)`, one network call per step, on a grid 0 = t_0 < ... < t_N = 1.

- flow_map: the model, given the step size d = t_{i+1} - t_i as its `d` input, returns the average velocity over
  the step, so x_{i+1} = x_i + d * u(x_i, t_i, d) (shortcut models, MeanFlow). Exact for any N when u is exact.
- consistency: the model's velocity gives the data estimate x1 = x + (1 - t) v (the flow parametrisation of a
  consistency function, identity at t = 1); the next point re-noises it with fresh noise,
  x_{i+1} = (1 - t_{i+1}) z + t_{i+1} x1 (Song et al. 2023, Alg. 1, multistep consistency sampling).
"""
import torch

from genlab.core.registry import sampler_registry
from genlab.sampling.samplers import _report


@sampler_registry.register("flow_map", "x + d * u(x, t, d): one call per step of size d (the model is trained with the "
                                       "step size as its input `d`: shortcut, MeanFlow)", condition="d")
@torch.no_grad()
def sample_flow_map(velocity, x, ts, callback=None, extra_args=None):
    extra = extra_args or {}
    for i in range(len(ts) - 1):
        t, d = ts[i].expand(x.shape[0]), (ts[i + 1] - ts[i]).expand(x.shape[0])
        u = velocity(x, t, **extra, d=d)
        x_next = x + d.view(-1, *([1] * (x.ndim - 1))) * u
        _report(callback, i, ts[i + 1], (x_next, x), ts[i], u)
        x = x_next
    return x


@sampler_registry.register("consistency", "multistep consistency sampling: predict the data x + (1-t) v, re-noise it to "
                                          "the next time with fresh noise; one call per step")
@torch.no_grad()
def sample_consistency(velocity, x, ts, callback=None, extra_args=None, generator=None):
    extra = extra_args or {}
    for i in range(len(ts) - 1):
        t = ts[i]
        v = velocity(x, t.expand(x.shape[0]), **extra)
        x1 = x + (1 - t) * v
        t_next = ts[i + 1]
        if i == len(ts) - 2:
            x_next = x1
        else:
            z = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            x_next = (1 - t_next) * z + t_next * x1
        _report(callback, i, t_next, (x_next, x), t, v)
        x = x_next
    return x
