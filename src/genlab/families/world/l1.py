"""World objective `l1`: one-step regression from noise, frame = noise + net(noise, 0) (one Euler step from t=0 to 1),
with an L1 loss; the users' GAN setting once method.adv_weight > 0 adds the patch discriminator's term (adversarial.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from genlab.families.world.objective import WorldObjective
from genlab.core.registry import world_objective_registry


@world_objective_registry.register("l1", "one-step regression from noise (L1); with method.adv_weight > 0 a GAN")
class L1Objective(WorldObjective):
    def loss(self, world, net, target, noise, gen):
        est = noise + net(noise, torch.zeros(target.shape[0], device=target.device))
        return F.l1_loss(est.float(), target.float()), est

    def grid(self, steps, device):
        return torch.tensor([0.0, 1.0], device=device)  # one step whatever method.sample_steps says

    def velocity(self, world, net, x, t):
        return net(x, t)
