"""World objective `flow`: rectified flow, x_t = (1-t)·noise + t·data, v = data - noise; the ODE's sampler is
method.world_sampler (Euler by default).

With method.prediction=x (default) the network outputs the clean frame and the loss stays on the derived
velocity; the last Euler step (to t=1) then lands exactly on the predicted frame. With v the clean frame is
x_t + (1-t)·v, so the network has to reproduce and cancel the sampling noise itself; what it misses stays in
the static background, compounds over a rollout and loses to copy-last.
"""
from __future__ import annotations

import torch.nn.functional as F

from genlab.families.image_flow.flow import interpolate
from genlab.families.world.objective import WorldObjective, per_sample, velocity_to
from genlab.config import fields as cf
from genlab.core.registry import world_objective_registry


def v_from_x(x_hat, x_t, t):
    # v = (x - x_t) / (1 - t) = data - noise; the floor (applied to the target alike) keeps the rare t ~ 1
    # samples from dominating the loss, which is ||x_hat - x||^2 / max(1 - t, 0.05)^2
    return (x_hat - x_t) / per_sample((1 - t).clamp_min(0.05), x_t)


FLOW_OBJECTIVE_KEYS = cf.declare("method",
    prediction=cf.F("x", "world, flow: the network outputs the clean frame (x; v is derived, the loss stays on v) or "
                             "v = data - noise (v: the net must cancel the noise itself, which leaks into static pixels)", choices=("x", "v")),
)


@world_objective_registry.register("flow", "rectified flow; the network predicts the clean frame (x) or the velocity (v)",
                                   keys=FLOW_OBJECTIVE_KEYS)
class FlowObjective(WorldObjective):
    def loss(self, world, net, target, noise, gen):
        t = world.sample_t(target.shape[0], gen, target.device, world.mcfg)
        x_t = interpolate(noise, target, t)
        out = net(x_t, t)
        if world.mcfg.prediction == "x":  # the network outputs the clean target; the loss stays on v
            est, v, v_target = out, v_from_x(out, x_t, t), v_from_x(target, x_t, t)
        else:
            est, v, v_target = x_t + per_sample(1 - t, x_t) * out, out, target - noise
        return F.mse_loss(v.float(), v_target.float()), est

    def velocity(self, world, net, x, t):
        out = net(x, t)  # with x: an Euler step to t=1 lands exactly on the predicted frame
        return velocity_to(out, x, t) if world.mcfg.prediction == "x" else out
