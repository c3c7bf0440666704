"""Training-time samplers of t in [0, 1] for flow matching (t=0 noise, t=1 data)."""
import torch

from genlab.registry import timestep_sampler_registry


@timestep_sampler_registry.register("uniform", "t ~ U(0, 1)")
def uniform(n, generator, device, cfg=None):
    return torch.rand(n, generator=generator, device=device)


@timestep_sampler_registry.register("logit_normal", "t = sigmoid(N(logit_mean, logit_std)) (SD3, Esser et al. 2024)")
def logit_normal(n, generator, device, cfg=None):
    m = cfg.logit_mean if cfg is not None else 0.0
    s = cfg.logit_std if cfg is not None else 1.0
    return torch.sigmoid(m + s * torch.randn(n, generator=generator, device=device))
