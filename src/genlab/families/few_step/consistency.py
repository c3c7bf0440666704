"""What the consistency methods (LCM, ECT) share: the consistency function in the flow parametrisation, the
pseudo-Huber distance, and the one teacher key they read.

f(x, t) = x + (1 - t) v(x, t): the data estimate of the velocity network, the identity at t = 1 (the data end) for
any weights, so the boundary condition of Song et al. 2023 holds by construction (no c_skip/c_out schedule). It is
also what the `consistency` sampler computes at every step.
"""
from __future__ import annotations

from genlab.families.few_step.base import TEACHER_KEYS

# method.teacher alone: these methods never use the teacher's own guidance scale (method.teacher_cfg_scale)
TEACHER_PATH = tuple(k for k in TEACHER_KEYS if k.name == "teacher")


def consistency_fn(net, x, t, y, **cond):
    """f(x, t) = x + (1 - t) v(x, t, y, **cond); t a [B] tensor."""
    return x + (1 - t).view(-1, *([1] * (x.ndim - 1))).to(x.dtype) * net(x, t, y, **cond)


def pseudo_huber(a, b, c: float):
    """Per sample sqrt(|a - b|^2 + c^2) - c (Song & Dhariwal 2023), |.|^2 the mean square over the sample's values
    so that c is per value whatever the image size; c = 0 is the RMS error (ECT's default)."""
    ms = (a.float() - b.float()).square().flatten(1).mean(1)
    return (ms + c * c).clamp_min(1e-20).sqrt() - c
