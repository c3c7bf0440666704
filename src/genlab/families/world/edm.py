"""World objective `edm`: EDM preconditioning (families/image_flow/edm.py) with DIAMOND's noise levels (Alonso et al. 2024),
sampled over the Karras sigma schedule in flow time: x_t = t x_sigma with t = 1 / (1 + sigma) is the flow path
(1-t) noise + t data, and an Euler step in t on it is exactly EDM's Euler step in sigma, so every flow sampler
(method.world_sampler) serves it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from genlab.families.image_flow.edm import karras_sigmas, preconditioning
from genlab.families.world.objective import WorldObjective, per_sample, velocity_to
from genlab.core.registry import world_objective_registry

P_MEAN, P_STD = -0.4, 1.2                    # training noise: ln σ ~ N(P_MEAN, P_STD²)
SIGMA_MIN, SIGMA_MAX, RHO = 2e-3, 5.0, 7.0   # sampling schedule
SIGMA_DATA = 0.5


@world_objective_registry.register("edm", "EDM preconditioning (Karras et al. 2022), DIAMOND's choice")
class EDMObjective(WorldObjective):
    def loss(self, world, net, target, noise, gen):
        sigma = (torch.randn(target.shape[0], generator=gen, device=target.device) * P_STD + P_MEAN).exp()
        c_skip, c_out, c_in, c_noise = preconditioning(sigma, SIGMA_DATA)
        x_noisy = target + per_sample(sigma, target) * noise
        out = net(per_sample(c_in, x_noisy) * x_noisy, c_noise)
        skip, scale = per_sample(c_skip, x_noisy) * x_noisy, per_sample(c_out, x_noisy)
        # the EDM-weighted loss on D equals the plain MSE on the network's target
        return F.mse_loss(out.float(), ((target - skip) / scale).float()), skip + scale * out

    def grid(self, steps, device):
        return 1 / (1 + karras_sigmas(steps, SIGMA_MIN, SIGMA_MAX, RHO, device=device))

    def velocity(self, world, net, x, t):
        x_sigma = x / per_sample(t, x)
        c_skip, c_out, c_in, c_noise = preconditioning((1 - t) / t, SIGMA_DATA)
        den = per_sample(c_skip, x) * x_sigma + per_sample(c_out, x) * net(per_sample(c_in, x) * x_sigma, c_noise)
        return velocity_to(den, x, t)
