"""torch's own optimizers (Adam, AdamW, SGD) on their fused CUDA kernels; caution: genlab's wrapper."""
from __future__ import annotations

import torch

from genlab.optim.build import cautious, optimizer_entry
from genlab.optim.caution import adamw_decay_factor
from genlab.optim.groups import param_groups


def _dtensor_fused_supported(op) -> bool:
    """DTensor has a sharding rule for this fused kernel (Adam(W): torch >= 2.4): FSDP2 params can use it."""
    try:
        from torch.distributed.tensor import DTensor
        prop = DTensor._op_dispatcher.sharding_propagator
        return any(op in getattr(prop, name, {}) for name in ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules"))
    except Exception:  # noqa: BLE001 - older torch: fall back to foreach
        return False


def _fused_ok(model, op=None):
    """The fused CUDA kernel: one launch per group, no per-parameter Python work. FSDP2/HSDP (DTensor) params use
    it too where DTensor has a rule for it (the update is elementwise, so each rank updates its shard)."""
    p = next(model.parameters())
    if hasattr(p, "_local_tensor"):
        return p._local_tensor.is_cuda and _dtensor_fused_supported(op or torch.ops.aten._fused_adamw_.default)
    return p.is_cuda


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
