"""Muon for the hidden matrices and AdamW for the rest, in ONE heavyball optimizer routed by param group.

heavyball.MuonAdamW routes by tensor rank (ndim >= 2 -> Muon), which would orthogonalise embedding tables and
the output head. genlab's grouping (optim/groups.py, `optim.muon_scope`) marks Muon groups {"muon": True};
this subclass keeps MuonAdamW's update rules (Nesterov EMA + Newton-Schulz orthogonalisation; Adam for the
rest) and only replaces its route predicate by that flag. One optimizer means one state_dict, one LR
schedule and heavyball's own caution on both parts.
"""
from __future__ import annotations

from genlab.optim.build import optimizer_entry
from genlab.optim.groups import param_groups
from genlab.optim.heavyball_optimizers import build_heavyball

_CLASS = None


def muon_adamw_by_group():
    global _CLASS
    if _CLASS is not None:
        return _CLASS
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

    _CLASS = MuonAdamWByGroup
    return _CLASS


@optimizer_entry("muon", "heavyball Muon (Jordan et al. 2024) on the hidden matrices (optim.muon_scope), AdamW on the rest, "
                         "Muon LR matched to AdamW's update RMS (Liu et al. 2025); caution: heavyball",
                 muon_groups=True, heavyball=True)
def muon(model, ocfg):
    groups = param_groups(model, ocfg.weight_decay, muon_scope=ocfg.muon_scope)
    return build_heavyball(model, ocfg, muon_adamw_by_group(), groups=groups, betas=tuple(ocfg.betas), eps=ocfg.eps)
