"""World objective `edm`: EDM preconditioning (families/image_flow/edm.py) with DIAMOND's noise levels (Alonso et al. 2024);
Euler on the probability-flow ODE over the Karras sigma schedule."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from genlab.core.registry import world_objective_registry
from genlab.families.image_flow.edm import karras_sigmas, preconditioning
from genlab.families.world.objective import WorldObjective, per_sample

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

    def generate(self, world, net, x, steps):
        sig = karras_sigmas(steps, SIGMA_MIN, SIGMA_MAX, RHO, device=x.device)
        x = x * sig[0]
        for k in range(steps):
            c_skip, c_out, c_in, c_noise = preconditioning(sig[k].expand(x.shape[0]), SIGMA_DATA)
            den = per_sample(c_skip, x) * x + per_sample(c_out, x) * net(per_sample(c_in, x) * x, c_noise)
            x = x + (sig[k + 1] - sig[k]) * (x - den) / sig[k]
        return x
