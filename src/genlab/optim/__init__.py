"""Optimizers and LR schedules by name. torch's built-ins, plus heavyball's (SOAP, PSGD-Kron, ADOPT,
Muon, ...) when it is installed: a maintained library rather than hand-written update rules."""
from __future__ import annotations

import math

import torch

from genlab.errors import GenlabError
from genlab.registry import lr_schedule_registry, optimizer_registry


def param_groups(model, weight_decay: float):
    """Decay matrices only; norms, biases and embeddings' 1-D params are not decayed (nanoGPT/DiT)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _dtensor_fused_adam_supported() -> bool:
    """DTensor has a sharding rule for the fused Adam(W) kernels (torch >= 2.4): FSDP2 params can use it."""
    try:
        from torch.distributed.tensor import DTensor
        prop, op = DTensor._op_dispatcher.sharding_propagator, torch.ops.aten._fused_adamw_.default
        return any(op in getattr(prop, name, {}) for name in ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules"))
    except Exception:  # noqa: BLE001 - older torch: fall back to foreach
        return False


def _fused_ok(model):
    """The fused CUDA Adam(W) kernel: one launch per group, no per-parameter Python work. FSDP2/HSDP (DTensor)
    params use it too where DTensor supports it (the update is elementwise, so each rank updates its shard)."""
    p = next(model.parameters())
    if hasattr(p, "_local_tensor"):
        return p._local_tensor.is_cuda and _dtensor_fused_adam_supported()
    return p.is_cuda


@optimizer_registry.register("adamw", "torch.optim.AdamW (fused kernel on CUDA)")
def adamw(model, ocfg):
    if ocfg.caution:
        raise GenlabError("optim.caution needs a heavyball optimizer (e.g. optim.name=heavyball_adamw)")
    return torch.optim.AdamW(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas),
                             eps=ocfg.eps, fused=_fused_ok(model) or None)


@optimizer_registry.register("adam", "torch.optim.Adam (fused kernel on CUDA)")
def adam(model, ocfg):
    return torch.optim.Adam(model.parameters(), lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps,
                            fused=_fused_ok(model) or None)


@optimizer_registry.register("sgd", "torch.optim.SGD with momentum betas[0] (Nesterov)")
def sgd(model, ocfg):
    return torch.optim.SGD(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, momentum=ocfg.betas[0], nesterov=True)


def _heavyball(cls_name):
    def build(model, ocfg):
        try:
            import heavyball
        except ImportError:
            raise GenlabError(f"optimizer '{cls_name}' needs heavyball: pip install heavyball==3.2.1") from None
        if not torch.cuda.is_available():
            heavyball.utils.compile_mode = None  # its compiled step takes minutes to build on CPU
        cls = getattr(heavyball, cls_name)
        kwargs = dict(lr=ocfg.lr, weight_decay=ocfg.weight_decay)
        if ocfg.caution:
            kwargs["caution"] = True
        if cls_name not in ("SGD", "PSGDKron", "Muon"):
            kwargs["betas"] = tuple(ocfg.betas)
        return cls(model.parameters(), **kwargs)
    return build


for _name, _cls in [("soap", "SOAP"), ("psgd_kron", "PSGDKron"), ("adopt", "ADOPT"), ("muon", "MuonAdamW"),
                    ("heavyball_adamw", "AdamW")]:
    optimizer_registry.register(_name, f"heavyball.{_cls} (optim.caution=true for cautious updates)")(_heavyball(_cls))


@lr_schedule_registry.register("cosine", "linear warmup, then cosine decay to min_lr_ratio * lr")
def cosine(step, total, ocfg):
    if step < ocfg.warmup_steps:
        return (step + 1) / ocfg.warmup_steps
    progress = min(1.0, (step - ocfg.warmup_steps) / max(1, total - ocfg.warmup_steps))
    return ocfg.min_lr_ratio + (1 - ocfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@lr_schedule_registry.register("constant", "linear warmup, then constant")
def constant(step, total, ocfg):
    return min(1.0, (step + 1) / max(1, ocfg.warmup_steps))


@lr_schedule_registry.register("linear", "linear warmup, then linear decay to min_lr_ratio * lr")
def linear(step, total, ocfg):
    if step < ocfg.warmup_steps:
        return (step + 1) / ocfg.warmup_steps
    progress = min(1.0, (step - ocfg.warmup_steps) / max(1, total - ocfg.warmup_steps))
    return 1 - (1 - ocfg.min_lr_ratio) * progress


def build_optimizer(model, ocfg):
    return optimizer_registry.get(ocfg.name)(model, ocfg)


def lr_at(step: int, total: int, ocfg) -> float:
    """The learning rate of `step`: a pure function of the step, so resume needs no scheduler state."""
    return ocfg.lr * lr_schedule_registry.get(ocfg.schedule)(step, total, ocfg)
