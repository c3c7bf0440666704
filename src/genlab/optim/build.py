"""What the optimizer entries share: their registration, with the facts config validation reads about each, the
helpers more than one family uses, and building an optimizer by name; and torch's own optimizers (Adam, AdamW, SGD)
on their fused CUDA kernels, with genlab's caution wrapper."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.core.registry import Registry, Spec
from genlab.optim.caution import Cautious, adamw_decay_factor
from genlab.optim.groups import param_groups
from genlab.runtime.parallel import parallel_registry


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec(Spec):
    fsdp: bool = True                      # can update DTensor shards (train.parallel=fsdp|hsdp)
    preconditioned: bool = False           # keeps a preconditioner (optim.precondition_every)
    muon_groups: bool = False              # splits parameters into Muon and AdamW groups (optim.muon_scope)
    heavyball: bool = False                # backed by heavyball (optim.heavyball_compile)

    def check_choice(self, cfg, key, name, registry):
        """A library that cannot update DTensor shards refuses a sharded train.parallel."""
        t = cfg.train
        if parallel_registry.spec(t.parallel).sharded and not self.fsdp:
            raise GenlabError(f"optim.name={name} does not work with train.parallel={t.parallel} (its library cannot "
                              f"update DTensor shards); use another optimizer (see README: Optimizers) or train.parallel=ddp")


optimizer_registry = Registry("optimizer", OptimizerSpec)

# optim.precondition_every=0: every 10 steps, the SOAP paper's frequency (Vyas et al. 2024), also for Shampoo
# (pytorch-optimizer's default, 1, runs an SVD of every preconditioner on every step)
DEFAULT_PRECONDITION_EVERY = 10


# optim.* keys that come with an optimizer capability (each entry reads those of the capabilities it has)
class PreconditionKeys(cf.Keys, section="optim"):
    precondition_every: int = cf.F(0, "shampoo/soap: recompute the preconditioner every this many steps (0 = 10)", ge=0)


class MuonKeys(cf.Keys, section="optim"):
    muon_scope: str = cf.F("hidden", "muon: which matrices Muon updates (hidden: 2-D Linear weights in the blocks without adaLN; "
                           "hidden_adaln: with adaLN; all_2d: every ndim>=2 param); the rest use AdamW",
                           choices=("hidden", "hidden_adaln", "all_2d"))


class HeavyballKeys(cf.Keys, section="optim"):
    heavyball_compile: str = cf.F("max-autotune-no-cudagraphs", "heavyball optimizers on CUDA: torch.compile mode of their "
                                  "fused step (the library's default autotunes for minutes; off = eager; CPU is always eager)",
                                  choices=("max-autotune-no-cudagraphs", "default", "off"))


def optimizer_entry(name, doc, *, fsdp=True, preconditioned=False, muon_groups=False, heavyball=False):
    """Register `build(model, ocfg) -> torch.optim.Optimizer` as optimizer `name` with its capabilities (the typed
    OptimizerSpec fields above), each bringing the optim.* keys it reads."""
    keys = tuple(c for c, on in ((PreconditionKeys, preconditioned), (MuonKeys, muon_groups), (HeavyballKeys, heavyball)) if on)
    return optimizer_registry.register(name, doc, keys=keys, fsdp=fsdp, preconditioned=preconditioned,
                                       muon_groups=muon_groups, heavyball=heavyball)


def precondition_every(ocfg) -> int:
    return PreconditionKeys.of(ocfg).precondition_every or DEFAULT_PRECONDITION_EVERY


def cautious(opt, ocfg, **kw):
    """genlab's Caution wrapper (optim/caution.py) where optim.caution asks for it and the library has none of its own."""
    return Cautious(opt, **kw) if ocfg.caution else opt


def build_optimizer(model, ocfg):
    return optimizer_registry.get(ocfg.name)(model, ocfg)


def _fused_ok(model, op=None):
    """The fused CUDA kernel: one launch per group, no per-parameter Python work. FSDP2/HSDP (DTensor) params use
    it too where DTensor has a sharding rule for it (Adam(W): torch >= 2.4; the update is elementwise, so each rank
    updates its shard)."""
    p = next(model.parameters())
    if not hasattr(p, "_local_tensor"):
        return p.is_cuda
    if not p._local_tensor.is_cuda:
        return False
    op = op or torch.ops.aten._fused_adamw_.default
    try:
        from torch.distributed.tensor import DTensor
        prop = DTensor._op_dispatcher.sharding_propagator
        return any(op in getattr(prop, name, {}) for name in ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules"))
    except Exception:  # noqa: BLE001 - older torch: fall back to foreach
        return False


@optimizer_entry("adamw", "torch.optim.AdamW (Loshchilov & Hutter 2019), fused kernel on CUDA; caution: genlab's wrapper")
def adamw(model, ocfg):
    opt = torch.optim.AdamW(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps,
                            fused=_fused_ok(model) or None)
    return cautious(opt, ocfg, decay_factor=adamw_decay_factor)


@optimizer_entry("adam", "torch.optim.Adam (Kingma & Ba 2015; weight_decay as L2 in the gradient), fused on CUDA; caution: wrapper")
def adam(model, ocfg):
    opt = torch.optim.Adam(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps,
                           fused=_fused_ok(model, torch.ops.aten._fused_adam_.default) or None)
    return cautious(opt, ocfg)


@optimizer_entry("sgd", "torch.optim.SGD, Nesterov momentum betas[0] (weight_decay as L2), fused on CUDA; caution: wrapper")
def sgd(model, ocfg):
    fused = _fused_ok(model, torch.ops.aten._fused_sgd_.default) if hasattr(torch.ops.aten, "_fused_sgd_") else False
    opt = torch.optim.SGD(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, momentum=ocfg.betas[0], nesterov=True,
                          fused=fused or None)
    return cautious(opt, ocfg)
