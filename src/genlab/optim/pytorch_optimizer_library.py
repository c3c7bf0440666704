"""Entries backed by the pytorch-optimizer library (not torch's own: torch_optimizers.py): MARS and ADOPT, with
the library's own `cautious`. Its Shampoo has a module of its own (shampoo.py)."""
from __future__ import annotations

from genlab.core.errors import GenlabError
from genlab.optim.build import optimizer_entry
from genlab.optim.groups import param_groups


def import_pytorch_optimizer(name):
    """The library, imported when optimizer `name` is built: it is an optional dependency."""
    try:
        import pytorch_optimizer
    except ImportError:
        raise GenlabError(f"optimizer '{name}' needs pytorch-optimizer: pip install pytorch-optimizer==4.1.0") from None
    return pytorch_optimizer


def _sharded(model) -> bool:
    return hasattr(next(model.parameters()), "_local_tensor")


@optimizer_entry("mars", "pytorch_optimizer.MARS (Yuan et al. 2024), MARS-AdamW on matrices, AdamW on 1-D params; caution: "
                         "the library's `cautious`")
def mars(model, ocfg):
    po = import_pytorch_optimizer("mars")
    groups = param_groups(model, ocfg.weight_decay)
    for g in groups:  # MARS decays 1-D params by its own weight_decay_1d (default 0.1): the group's decay instead
        g["weight_decay_1d"] = g["weight_decay"]
    # its foreach path uses _foreach_copy_, which DTensor has no sharding rule for: per-tensor updates under FSDP2
    return po.MARS(groups, lr=ocfg.lr, betas=tuple(ocfg.betas), lr_1d=ocfg.lr, betas_1d=tuple(ocfg.betas), eps=ocfg.eps,
                   cautious=ocfg.caution, foreach=False if _sharded(model) else None)


@optimizer_entry("adopt", "pytorch_optimizer.ADOPT (Taniguchi et al. 2024) with the paper's step**0.25 clip, decoupled decay; "
                          "caution: the library's `cautious`")
def adopt(model, ocfg):
    # not heavyball.ADOPT: it lacks the paper's clip, and g / sqrt(v) with v = 0 (the all-zero first gradients of
    # adaLN-Zero blocks) gave NaN losses within 8 steps on the digits DiT
    po = import_pytorch_optimizer("adopt")
    groups = param_groups(model, ocfg.weight_decay)
    for g in groups:
        g["cautious"] = ocfg.caution
    return po.ADOPT(groups, lr=ocfg.lr, betas=tuple(ocfg.betas), weight_decay=ocfg.weight_decay, weight_decouple=True,
                    foreach=False if _sharded(model) else None)  # its foreach path has no DTensor rule either
