"""Entries backed by heavyball (SOAP, PSGD-Kron, Muon, its AdamW), with heavyball's own caution."""
from __future__ import annotations

import functools

import torch

from genlab.core.errors import GenlabError
from genlab.optim.build import optimizer_entry, precondition_every
from genlab.optim.groups import param_groups
from genlab.optim.state import keep_saved_dtypes


def build_heavyball(model, ocfg, cls, groups=None, **kwargs):
    """heavyball's optimizer `cls` (a name or a class) over genlab's parameter groups, compiled as
    optim.heavyball_compile says."""
    try:
        import heavyball
    except ImportError:
        raise GenlabError(f"optimizer '{ocfg.name}' needs heavyball: pip install heavyball==3.2.1") from None
    # heavyball compiles its step; the mode is a module global, read when the step first runs
    mode = None if ocfg.heavyball_compile == "off" else ocfg.heavyball_compile
    heavyball.utils.compile_mode = mode if torch.cuda.is_available() else None  # minutes to build on CPU
    cls = getattr(heavyball, cls) if isinstance(cls, str) else cls
    groups = groups if groups is not None else param_groups(model, ocfg.weight_decay)
    return keep_saved_dtypes(cls(groups, lr=ocfg.lr, caution=ocfg.caution, **kwargs))


@optimizer_entry("soap", "heavyball.SOAP (Vyas et al. 2024), preconditioner every optim.precondition_every steps; "
                         "caution: heavyball", fsdp=False, preconditioned=True, heavyball=True)
def soap(model, ocfg):
    return build_heavyball(model, ocfg, "SOAP", betas=tuple(ocfg.betas), eps=ocfg.eps,
                           precondition_frequency=precondition_every(ocfg))


@optimizer_entry("psgd_kron", "heavyball.PSGDKron (Li 2018; Kronecker-factored PSGD); caution: heavyball", heavyball=True)
def psgd_kron(model, ocfg):
    # a fixed initial preconditioner scale: heavyball's default derives it from the first gradient and fails when
    # one is all zeros, as every block's is on the first step of an adaLN-Zero DiT
    return build_heavyball(model, ocfg, "PSGDKron", betas=tuple(ocfg.betas), precond_init_scale=1.0)


@optimizer_entry("heavyball_adamw", "heavyball.AdamW (caution: heavyball); the torch `adamw` is the faster default",
                 heavyball=True)
def heavyball_adamw(model, ocfg):
    return build_heavyball(model, ocfg, "AdamW", betas=tuple(ocfg.betas), eps=ocfg.eps)


# Muon for the hidden matrices and AdamW for the rest, in ONE heavyball optimizer routed by param group:
# heavyball.MuonAdamW routes by tensor rank (ndim >= 2 -> Muon), which would orthogonalise embedding tables and the
# output head. genlab's grouping (optim/groups.py, `optim.muon_scope`) marks Muon groups {"muon": True}; the subclass
# keeps MuonAdamW's update rules and only replaces its route predicate by that flag. One optimizer: one state_dict,
# one LR schedule and heavyball's own caution on both parts.
@functools.cache
def muon_adamw_by_group():
    import heavyball
    import heavyball.chainable as C

    class MuonAdamWByGroup(heavyball.MuonAdamW):
        def __init__(self, params, **kwargs):
            super().__init__(params, **kwargs)
            self._muon_group = False
            routes = [fn for fn in self.fns if isinstance(fn, C.Route)]
            if len(routes) != 1 or len(routes[0].routes) != 1:
                raise RuntimeError("heavyball.MuonAdamW changed: expected one Route with one Muon branch")
            _, chain = routes[0].routes[0]
            # the predicate sees one tensor; the group being stepped decides (set in _step)
            routes[0].routes[0] = (lambda p: self._muon_group, chain)

        def _step(self, group):
            self._muon_group = bool(group.get("muon"))
            super()._step(group)

    return MuonAdamWByGroup


@optimizer_entry("muon", "heavyball Muon (Jordan et al. 2024) on the hidden matrices (optim.muon_scope), AdamW on the rest, "
                         "Muon LR matched to AdamW's update RMS (Liu et al. 2025); caution: heavyball",
                 muon_groups=True, heavyball=True)
def muon(model, ocfg):
    groups = param_groups(model, ocfg.weight_decay, muon_scope=ocfg.muon_scope)
    return build_heavyball(model, ocfg, muon_adamw_by_group(), groups=groups, betas=tuple(ocfg.betas), eps=ocfg.eps)
