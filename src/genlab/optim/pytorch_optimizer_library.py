"""Entries backed by the pytorch-optimizer library (not torch's own: build.py): MARS and ADOPT, with the
library's own `cautious`, and ScalableShampoo (Gupta et al. 2018; Anil et al. 2020), grafted and block-partitioned,
with a state_dict of tensors only so genlab's checkpoints can hold it (caution: genlab's wrapper)."""
from __future__ import annotations

import torch

from genlab.core.errors import GenlabError
from genlab.optim.build import cautious, optimizer_entry, precondition_every
from genlab.optim.caution import adamw_decay_factor
from genlab.optim.groups import param_groups
from genlab.runtime.parallel import is_sharded


def import_pytorch_optimizer(name):
    """The library, imported when optimizer `name` is built: it is an optional dependency."""
    try:
        import pytorch_optimizer
    except ImportError:
        raise GenlabError(f"optimizer '{name}' needs pytorch-optimizer: pip install pytorch-optimizer==4.1.0") from None
    return pytorch_optimizer


@optimizer_entry("mars", "pytorch_optimizer.MARS (Yuan et al. 2024), MARS-AdamW on matrices, AdamW on 1-D params; caution: "
                         "the library's `cautious`")
def mars(model, ocfg):
    po = import_pytorch_optimizer("mars")
    groups = param_groups(model, ocfg.weight_decay)
    for g in groups:  # MARS decays 1-D params by its own weight_decay_1d (default 0.1): the group's decay instead
        g["weight_decay_1d"] = g["weight_decay"]
    # its foreach path uses _foreach_copy_, which DTensor has no sharding rule for: per-tensor updates under FSDP2
    return po.MARS(groups, lr=ocfg.lr, betas=tuple(ocfg.betas), lr_1d=ocfg.lr, betas_1d=tuple(ocfg.betas), eps=ocfg.eps,
                   cautious=ocfg.caution, foreach=False if is_sharded(model) else None)


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
                    foreach=False if is_sharded(model) else None)  # its foreach path has no DTensor rule either


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


@optimizer_entry("shampoo", "pytorch_optimizer.ScalableShampoo (Gupta et al. 2018; Anil et al. 2020's practical form): blocks of "
                            "512, RMSProp grafting, betas, decoupled decay, inverse roots every optim.precondition_every steps "
                            "(the first at that step); caution: wrapper", fsdp=False, preconditioned=True)
def shampoo(model, ocfg):
    po = import_pytorch_optimizer("shampoo")
    from pytorch_optimizer.optimizer.utils.graft import LayerWiseGrafting
    # not the library's plain Shampoo: with no grafting its step has no Adam-like scale, and on the digits DiT at lr
    # 3e-4 (and the sweep's DiT-B/2 on an H100) the preconditioner went non-finite by step 19; the grafted,
    # block-partitioned form keeps AdamW's step size and bounds each factor at 512 x 512. Momentum is an EMA: the
    # library's default sums gradients (1 / (1 - beta1) = 10x Adam's step), and at DiT-B/2 width on an H100 that
    # sent the loss from 1.7 to 35 when preconditioning began at step 10
    opt = _tensor_state_shampoo(po)(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas),
                                    decoupled_weight_decay=True, preconditioning_compute_steps=precondition_every(ocfg),
                                    start_preconditioning_step=precondition_every(ocfg),
                                    graft_type=LayerWiseGrafting.RMSPROP, diagonal_eps=ocfg.eps,
                                    moving_average_for_momentum=True)
    # the update is built from p.grad in place: the wrapper compares with a copy of the gradient
    return cautious(opt, ocfg, decay_factor=adamw_decay_factor, clone_grads=True)
