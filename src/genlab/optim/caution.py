"""Caution (Liang et al. 2024, "Cautious Optimizers: Improving Training with One Line of Code") for any optimizer
whose library does not implement it. With the base step p <- p - lr*u (plus decoupled decay), keep the coordinates
where u*g > 0 and rescale per tensor (heavyball's rule):

    p <- p*(1 - lr*wd) - lr * (u * mask) * numel / max(sum(mask), 1)

`Cautious` lets the base step, reads -lr*u back as each parameter's change (the decay factor removed,
`decay_factor`) and re-applies it masked and rescaled; state and state_dict are the base's. Under FSDP2 the mask
counts are summed over the shards.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from genlab.runtime.parallel import local as _local, sum_over_shards


def adamw_decay_factor(group) -> float:
    """torch AdamW: p *= 1 - lr*wd before the Adam step (decoupled decay, left unmasked)."""
    return 1.0 - float(group["lr"]) * group["weight_decay"]


class Cautious(torch.optim.Optimizer):
    """`Cautious(base, decay_factor=None, clone_grads=False)`: clone_grads for bases that modify p.grad in place."""

    def __init__(self, base: torch.optim.Optimizer, decay_factor=None, clone_grads: bool = False):
        # no Optimizer.__init__: param_groups, state and defaults are the base's (properties below)
        self.base, self.decay_factor, self.clone_grads = base, decay_factor, clone_grads

    param_groups = property(lambda self: self.base.param_groups)
    state = property(lambda self: self.base.state)
    defaults = property(lambda self: self.base.defaults)

    def __repr__(self):
        return f"Cautious({self.base!r})"

    def state_dict(self):
        return self.base.state_dict()

    def load_state_dict(self, state_dict):
        self.base.load_state_dict(state_dict)

    def add_param_group(self, group):
        self.base.add_param_group(group)

    def zero_grad(self, set_to_none: bool = True):
        self.base.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params, factors = [], []
        for g in self.param_groups:
            f = self.decay_factor(g) if self.decay_factor else 1.0
            for p in g["params"]:
                if p.grad is not None:
                    params.append(p)
                    factors.append(f)
        if not params:
            self.base.step()
            return loss
        local = [_local(p) for p in params]
        grads = [_local(p.grad) for p in params]
        if self.clone_grads:
            grads = [g.clone() for g in grads]
        before = [t.clone() for t in local]
        self.base.step()
        if any(f != 1.0 for f in factors):
            before = [b.mul_(f) if f != 1.0 else b for b, f in zip(before, factors)]
        delta = torch._foreach_sub(local, before)  # = -lr*u: agreement with g means delta*g < 0
        masks = [(d * g.to(d.dtype)) < 0 for d, g in zip(delta, grads)]
        kept = torch.stack([m.sum() for m in masks]).double()  # float64: numel / kept exact enough for any dtype
        if hasattr(params[0], "_local_tensor") and dist.is_initialized():
            sum_over_shards(kept, params[0])  # FSDP2/HSDP: each tensor's kept count summed over its shards
        inv_kept = kept.clamp(min=1).reciprocal()
        # scale = numel / kept (p.numel() is the global size of a DTensor); Python numbers: no host-to-device copy
        for t, b, d, m, inv, p in zip(local, before, delta, masks, inv_kept.unbind(), params):
            t.copy_(b + d * m * (inv * p.numel()).to(d.dtype))
        return loss
