"""One parameter-group policy for every optimizer (docs/optimizers.md): only Linear/Conv weights decay (by module type,
not ndim; a weight tied to an embedding, GPT's head, counts as the embedding), and Muon (Jordan et al. 2024) takes the
matrices of `optim.muon_scope`, AdamW the rest. adaLN modulations stay with AdamW by default: zero-initialised and fed
few distinct conditioning values, their gradient is low-rank, and orthogonalising it spreads a unit-RMS step over
directions the gradient never saw and breaks each block's identity at init.
"""
from __future__ import annotations

import math

import torch.nn as nn

ADALN_PARTS = ("ada", "adaln", "adaln_modulation", "modulation")  # module names of adaLN modulation layers
MATMUL_TYPES = (nn.Linear, nn.modules.conv._ConvNd)


def _param_owners(model: nn.Module) -> dict[int, list[tuple[str, nn.Module]]]:
    """id(param) -> [(qualified name, owning module, attribute name)], every owner of a tied parameter included."""
    owners: dict[int, list] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append((f"{mname}.{pname}" if mname else pname, mod, pname))
    return owners


def is_muon_matrix(p, owners, scope: str, in_blocks: set[int] | None) -> bool:
    if scope == "all_2d":
        return p.ndim >= 2
    if p.ndim != 2 or not all(isinstance(mod, nn.Linear) and pname == "weight" for _, mod, pname in owners):
        return False
    if in_blocks is not None and id(p) not in in_blocks:  # a module without `blocks`: every Linear weight
        return False
    return scope == "hidden_adaln" or not any(part.lower() in ADALN_PARTS for name, _, _ in owners
                                              for part in name.split(".")[:-1])


def muon_lr_scale(p) -> float:
    """LR multiplier of a Muon matrix so one optim.lr serves Muon and AdamW: heavyball scales the orthogonalised
    update by sqrt(max(1, A/B)); Liu et al. 2025 ("Muon is Scalable for LLM Training") match AdamW's update RMS
    with 0.2 * sqrt(max(A, B)). The ratio of the two, per [A, B] = [out, in] matrix."""
    a, b = p.shape[0], math.prod(p.shape[1:])
    return 0.2 * math.sqrt(max(a, b)) / math.sqrt(max(1.0, a / b))


def param_groups(model: nn.Module, weight_decay: float, muon_scope: str | None = None) -> list[dict]:
    """Groups for torch.optim-style constructors. With muon_scope, the Muon matrices come first as groups
    flagged {"muon": True} (one per LR scale, `lr_scale` read by set_lr), then the AdamW groups. Empty groups
    are dropped; parameter order within a group follows model.parameters()."""
    owners = _param_owners(model)
    blocks = getattr(model, "blocks", None)
    in_blocks = {id(p) for p in blocks.parameters()} if isinstance(blocks, nn.Module) else None
    muon: dict[float, list] = {}
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        own = owners[id(p)]
        if muon_scope and is_muon_matrix(p, own, muon_scope, in_blocks):
            muon.setdefault(round(muon_lr_scale(p), 12), []).append(p)
        elif all(isinstance(mod, MATMUL_TYPES) and pname == "weight" for _, mod, pname in own):
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": ps, "weight_decay": weight_decay, "muon": True, "lr_scale": s} for s, ps in muon.items()]
    groups += [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]
