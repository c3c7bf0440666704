"""What the optimizer entries share: their registration, with the facts config validation reads about each, the
helpers more than one family uses, and building an optimizer by name."""
from __future__ import annotations

from genlab.optim.caution import Cautious
from genlab.registry import optimizer_registry

# optim.precondition_every=0: every 10 steps, the SOAP paper's frequency (Vyas et al. 2024), also for Shampoo
# (pytorch-optimizer's default, 1, runs an SVD of every preconditioner on every step)
DEFAULT_PRECONDITION_EVERY = 10


def optimizer_entry(name, doc, *, fsdp=True, preconditioned=False, muon_groups=False, heavyball=False):
    """Register `build(model, ocfg) -> torch.optim.Optimizer` as optimizer `name`, with attributes on it:
    `fsdp` (False: refused with train.parallel=fsdp|hsdp, see tests/test_optim.py), `preconditioned` (reads
    optim.precondition_every), `muon_groups` (gives Muon its own parameter groups: reads optim.muon_scope) and
    `heavyball` (backed by heavyball: reads optim.heavyball_compile). Keyword-only, so a misspelt one fails at import."""
    def wrap(fn):
        fn.fsdp, fn.preconditioned, fn.muon_groups, fn.heavyball = fsdp, preconditioned, muon_groups, heavyball
        return optimizer_registry.register(name, doc)(fn)
    return wrap


def precondition_every(ocfg) -> int:
    return ocfg.precondition_every or DEFAULT_PRECONDITION_EVERY


def cautious(opt, ocfg, **kw):
    """genlab's Caution wrapper (optim/caution.py) where optim.caution asks for it and the library has none of its own."""
    return Cautious(opt, **kw) if ocfg.caution else opt


def build_optimizer(model, ocfg):
    return optimizer_registry.get(ocfg.name)(model, ocfg)
