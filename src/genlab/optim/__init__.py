"""Optimizers and LR schedules by name, from maintained libraries rather than hand-written update rules:
torch's own (Adam, AdamW, SGD), pytorch-optimizer (Shampoo, MARS, ADOPT) and heavyball (SOAP, PSGD-Kron,
Muon). Every entry takes the same parameter groups (optim/groups.py) and honours `optim.caution` (the
library's own cautious update where it has a faithful one, else optim/caution.py).

An entry is `build(model, ocfg) -> torch.optim.Optimizer`; attributes on it: `fsdp` (False: refused with
train.parallel=fsdp|hsdp, see tests/test_optim.py) and `preconditioned` (reads optim.precondition_every).
"""
from __future__ import annotations

import torch

from genlab.errors import GenlabError
from genlab.optim import schedules  # noqa: F401  (registers the LR schedules)
from genlab.optim.caution import Cautious, adamw_decay_factor
from genlab.optim.groups import param_groups
from genlab.optim.state import keep_saved_dtypes, state_bytes  # noqa: F401  (state_bytes: the trainer's metric)
from genlab.registry import lr_schedule_registry, optimizer_registry

# optim.precondition_every=0: every 10 steps, the SOAP paper's frequency (Vyas et al. 2024), also for Shampoo
# (pytorch-optimizer's default, 1, runs an SVD of every preconditioner on every step)
DEFAULT_PRECONDITION_EVERY = 10


def _entry(name, doc, fsdp=True, preconditioned=False):
    def wrap(fn):
        return optimizer_registry.register(name, doc, fsdp=fsdp, preconditioned=preconditioned)(fn)
    return wrap


def _precondition_every(ocfg) -> int:
    return ocfg.precondition_every or DEFAULT_PRECONDITION_EVERY


# -- torch -------------------------------------------------------------------------------------------
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


def _cautious(opt, ocfg, **kw):
    return Cautious(opt, **kw) if ocfg.caution else opt


@_entry("adamw", "torch.optim.AdamW (Loshchilov & Hutter 2019), fused kernel on CUDA; caution: genlab's wrapper")
def adamw(model, ocfg):
    opt = torch.optim.AdamW(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps,
                            fused=_fused_ok(model) or None)
    return _cautious(opt, ocfg, decay_factor=adamw_decay_factor)


@_entry("adam", "torch.optim.Adam (Kingma & Ba 2015; weight_decay as L2 in the gradient), fused on CUDA; caution: wrapper")
def adam(model, ocfg):
    opt = torch.optim.Adam(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps,
                           fused=_fused_ok(model, torch.ops.aten._fused_adam_.default) or None)
    return _cautious(opt, ocfg)


@_entry("sgd", "torch.optim.SGD, Nesterov momentum betas[0] (weight_decay as L2), fused on CUDA; caution: wrapper")
def sgd(model, ocfg):
    fused = _fused_ok(model, torch.ops.aten._fused_sgd_.default) if hasattr(torch.ops.aten, "_fused_sgd_") else False
    opt = torch.optim.SGD(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, momentum=ocfg.betas[0], nesterov=True,
                          fused=fused or None)
    return _cautious(opt, ocfg)


def _sharded(model) -> bool:
    return hasattr(next(model.parameters()), "_local_tensor")


# -- pytorch-optimizer ---------------------------------------------------------------------------------
def _pytorch_optimizer(name):
    try:
        import pytorch_optimizer
    except ImportError:
        raise GenlabError(f"optimizer '{name}' needs pytorch-optimizer: pip install pytorch-optimizer==4.1.0") from None
    return pytorch_optimizer


def _tensor_state_shampoo(po):
    """ScalableShampoo whose state_dict holds only tensors. The library keeps a PreConditioner and a graft object
    per parameter, which genlab's checkpoint loader (it unpickles no classes) refuses; here their tensors are saved
    and, on load, the objects are rebuilt as the library builds them and the tensors put back."""
    from pytorch_optimizer.optimizer.utils.graft import build_graft
    from pytorch_optimizer.optimizer.utils.preconditioner import PreConditioner

    def tensors(obj):
        return {k: v for k, v in vars(obj).items()
                if torch.is_tensor(v) or (isinstance(v, list) and all(torch.is_tensor(x) for x in v))}

    class TensorStateShampoo(po.ScalableShampoo):
        OBJECTS = ("pre_conditioner", "graft")

        def init_group(self, group, **kwargs):
            # the library starts each Kronecker factor at matrix_eps * I (1e-6) and then keeps an EMA with weight
            # 1 - beta2: a DiT's gradients give statistics near 1e-8, so that identity outweighs them for hundreds
            # of steps and the "preconditioned" step is plain SGD's direction (DiT-B/2 on MNIST, H100, lr 1e-3: loss
            # 1.41 at step 100 and 1.34 at 200; 0.73 and 0.43 with this). A 1e-20 share of it keeps the factors
            # invertible; the relative ridge of the inverse roots stays.
            fresh = [p for p in group["params"] if p.grad is not None and not self.state[p]]
            super().init_group(group, **kwargs)
            for p in fresh:
                stats = self.state[p]["pre_conditioner"].statistics
                for s in ([stats] if torch.is_tensor(stats) else stats):
                    s.mul_(1e-20)

        def state_dict(self):
            sd = super().state_dict()
            state = {k: {kk: tensors(vv) if kk in self.OBJECTS else vv for kk, vv in st.items()}
                     for k, st in sd["state"].items()}
            return {**sd, "state": state}

        def load_state_dict(self, sd):
            plain = {k: {kk: vv for kk, vv in st.items() if kk not in self.OBJECTS} for k, st in sd["state"].items()}
            super().load_state_dict({**sd, "state": plain})
            params = [p for g in self.param_groups for p in g["params"]]
            beta2 = {id(p): g["betas"][1] for g in self.param_groups for p in g["params"]}
            for k, st in sd["state"].items():
                if "pre_conditioner" not in st:
                    continue
                p = params[int(k)]
                pc = PreConditioner(p, beta2[id(p)], self.inverse_exponent_override, self.block_size,
                                    self.skip_preconditioning_rank_lt, self.no_preconditioning_for_layers_with_dim_gt,
                                    self.shape_interpretation, self.pre_conditioner_type, self.matrix_eps, self.use_svd)
                graft = build_graft(p, self.graft_type, self.diagonal_eps)
                for obj, saved in ((pc, st["pre_conditioner"]), (graft, st["graft"])):
                    for name, v in saved.items():
                        setattr(obj, name, [x.to(p.device) for x in v] if isinstance(v, list) else v.to(p.device))
                self.state[p]["pre_conditioner"], self.state[p]["graft"] = pc, graft
    return TensorStateShampoo


@_entry("shampoo", "pytorch_optimizer.ScalableShampoo (Gupta et al. 2018; Anil et al. 2020's practical form): blocks of "
                   "512, RMSProp grafting, betas, decoupled decay, inverse roots every optim.precondition_every steps "
                   "(the first at that step); caution: wrapper", fsdp=False, preconditioned=True)
def shampoo(model, ocfg):
    po = _pytorch_optimizer("shampoo")
    from pytorch_optimizer.optimizer.utils.graft import LayerWiseGrafting
    # not the library's plain Shampoo: with no grafting its step has no Adam-like scale, and on the digits DiT at lr
    # 3e-4 (and the sweep's DiT-B/2 on an H100) the preconditioner went non-finite by step 19; the grafted,
    # block-partitioned form keeps AdamW's step size and bounds each factor at 512 x 512. Momentum is an EMA: the
    # library's default sums gradients (1 / (1 - beta1) = 10x Adam's step), and at DiT-B/2 width on an H100 that
    # sent the loss from 1.7 to 35 when preconditioning began at step 10
    opt = _tensor_state_shampoo(po)(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas),
                                    decoupled_weight_decay=True, preconditioning_compute_steps=_precondition_every(ocfg),
                                    start_preconditioning_step=_precondition_every(ocfg),
                                    graft_type=LayerWiseGrafting.RMSPROP, diagonal_eps=ocfg.eps,
                                    moving_average_for_momentum=True)
    # the update is built from p.grad in place: the wrapper compares with a copy of the gradient
    return _cautious(opt, ocfg, decay_factor=adamw_decay_factor, clone_grads=True)


@_entry("mars", "pytorch_optimizer.MARS (Yuan et al. 2024), MARS-AdamW on matrices, AdamW on 1-D params; caution: "
                "the library's `cautious`")
def mars(model, ocfg):
    po = _pytorch_optimizer("mars")
    groups = param_groups(model, ocfg.weight_decay)
    for g in groups:  # MARS decays 1-D params by its own weight_decay_1d (default 0.1): the group's decay instead
        g["weight_decay_1d"] = g["weight_decay"]
    # its foreach path uses _foreach_copy_, which DTensor has no sharding rule for: per-tensor updates under FSDP2
    return po.MARS(groups, lr=ocfg.lr, betas=tuple(ocfg.betas), lr_1d=ocfg.lr, betas_1d=tuple(ocfg.betas), eps=ocfg.eps,
                   cautious=ocfg.caution, foreach=False if _sharded(model) else None)


@_entry("adopt", "pytorch_optimizer.ADOPT (Taniguchi et al. 2024) with the paper's step**0.25 clip, decoupled decay; "
                 "caution: the library's `cautious`")
def adopt(model, ocfg):
    # not heavyball.ADOPT: it lacks the paper's clip, and g / sqrt(v) with v = 0 (the all-zero first gradients of
    # adaLN-Zero blocks) gave NaN losses within 8 steps on the digits DiT
    po = _pytorch_optimizer("adopt")
    groups = param_groups(model, ocfg.weight_decay)
    for g in groups:
        g["cautious"] = ocfg.caution
    return po.ADOPT(groups, lr=ocfg.lr, betas=tuple(ocfg.betas), weight_decay=ocfg.weight_decay, weight_decouple=True,
                    foreach=False if _sharded(model) else None)  # its foreach path has no DTensor rule either


# -- heavyball -----------------------------------------------------------------------------------------
def _heavyball(model, ocfg, cls, groups=None, **kwargs):
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


@_entry("soap", "heavyball.SOAP (Vyas et al. 2024), preconditioner every optim.precondition_every steps; caution: heavyball",
        fsdp=False, preconditioned=True)
def soap(model, ocfg):
    return _heavyball(model, ocfg, "SOAP", betas=tuple(ocfg.betas), eps=ocfg.eps,
                      precondition_frequency=_precondition_every(ocfg))


@_entry("psgd_kron", "heavyball.PSGDKron (Li 2018; Kronecker-factored PSGD); caution: heavyball")
def psgd_kron(model, ocfg):
    # a fixed initial preconditioner scale: heavyball's default derives it from the first gradient and fails when
    # one is all zeros, as every block's is on the first step of an adaLN-Zero DiT
    return _heavyball(model, ocfg, "PSGDKron", betas=tuple(ocfg.betas), precond_init_scale=1.0)


@_entry("muon", "heavyball Muon (Jordan et al. 2024) on the hidden matrices (optim.muon_scope), AdamW on the rest, "
                "Muon LR matched to AdamW's update RMS (Liu et al. 2025); caution: heavyball")
def muon(model, ocfg):
    from genlab.optim.muon import muon_adamw_by_group
    groups = param_groups(model, ocfg.weight_decay, muon_scope=ocfg.muon_scope)
    return _heavyball(model, ocfg, muon_adamw_by_group(), groups=groups, betas=tuple(ocfg.betas), eps=ocfg.eps)


@_entry("heavyball_adamw", "heavyball.AdamW (caution: heavyball); the torch `adamw` is the faster default")
def heavyball_adamw(model, ocfg):
    return _heavyball(model, ocfg, "AdamW", betas=tuple(ocfg.betas), eps=ocfg.eps)


# -- building, schedule -----------------------------------------------------------------------
def build_optimizer(model, ocfg):
    return optimizer_registry.get(ocfg.name)(model, ocfg)


def lr_at(step: int, total: int, ocfg) -> float:
    """The learning rate of `step`: a pure function of the step, so resume needs no scheduler state."""
    return ocfg.lr * lr_schedule_registry.get(ocfg.schedule)(step, total, ocfg)
