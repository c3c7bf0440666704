"""Process groups and model wrapping for data parallelism, launched by torchrun."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry, Spec


@dataclass(frozen=True, kw_only=True)
class ParallelSpec(Spec):
    sharded: bool = False                  # shards parameters and optimizer state (the optimizer must update DTensors)


parallel_registry = Registry("parallel", ParallelSpec)


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def resolve_device(name: str, local_rank: int = 0, key: str = "train.device") -> torch.device:
    """The torch device of a device setting (`key` names it in errors: train.device, or a command's --device)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise GenlabError(f"{key}={name} but CUDA is not available; valid here: auto, cpu")
    if not (name == "cpu" or name.startswith("cuda")):
        raise GenlabError(f"unknown {key} '{name}'; valid: auto, cpu, cuda, cuda:N")
    return torch.device(name)


def init_distributed(device_name: str) -> tuple[DistInfo, torch.device]:
    """Join the torchrun process group when WORLD_SIZE > 1 (NCCL on CUDA, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistInfo(), resolve_device(device_name)
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    device = resolve_device(device_name, info.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None)
    return info, device


def leave_distributed(info: DistInfo) -> None:
    """After a finished run: a barrier, then the group is destroyed (exiting with a live gloo group races its threads at
    interpreter teardown: an intermittent 'terminate called without an active exception' abort)."""
    if info.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_rank(code: int = 0) -> None:
    """End a torchrun rank with os._exit after a flush: even after leave_distributed, gloo's and the rendezvous store's
    threads intermittently SIGABRT a rank at teardown (seen in CI). Only once every file the rank writes is closed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG if t.is_cuda else dist.ReduceOp.SUM)
        if not t.is_cuda:
            t /= info.world
    return t


@parallel_registry.register("auto", "ddp when launched with several processes, else none")
def par_auto(model, info, tcfg, device):
    return par_ddp(model, info, tcfg, device) if info.enabled else model


@parallel_registry.register("none", "a single process")
def par_none(model, info, tcfg, device):
    if info.enabled:
        raise GenlabError("train.parallel=none but launched with several processes; use ddp, fsdp or hsdp")
    return model


@parallel_registry.register("ddp", "DistributedDataParallel: replicate weights, all-reduce gradients")
def par_ddp(model, info, tcfg, device):
    if not info.enabled:
        return model
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def _mesh_dims(info, tcfg, hybrid: bool) -> tuple[int, int]:
    """(replicate, shard) degrees from train.replicate/train.shard; 0 means 'the rest of the world'."""
    world, r, sh = info.world, tcfg.replicate, tcfg.shard
    if r < 0 or sh < 0:
        raise GenlabError(f"train.replicate ({r}) and train.shard ({sh}) must be >= 0")
    if not hybrid:
        if r not in (0, 1) or sh not in (0, world):
            raise GenlabError(f"train.parallel=fsdp shards over all {world} ranks; for replicate x shard use "
                              f"train.parallel=hsdp (got replicate={r}, shard={sh})")
        return 1, world
    if sh == 0 and r == 0:
        sh = world
    if sh == 0:
        sh = world // r if r and world % r == 0 else 0
    if r == 0:
        r = world // sh if sh and world % sh == 0 else 0
    if r < 1 or sh < 1 or r * sh != world:
        raise GenlabError(f"train.parallel=hsdp needs replicate x shard = world size; got replicate={tcfg.replicate}, "
                          f"shard={tcfg.shard} with {world} processes")
    return r, sh


def _fully_shard_model(model, mesh, mp_policy=None, keep_last: int = 0, prefetch: int = 0):
    """fully_shard each block (its all-gather overlaps the previous block's compute), then the root; keep_last and
    prefetch: train.fsdp_keep_last and train.fsdp_prefetch (docs/performance.md)."""
    from torch.distributed.fsdp import fully_shard
    kw = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    blocks = list(model.blocks)
    for i, block in enumerate(blocks):
        fully_shard(block, reshard_after_forward=i < len(blocks) - max(0, keep_last), **kw)
    fully_shard(model, **kw)
    if prefetch > 0:
        for i, block in enumerate(blocks):
            ahead = blocks[i + 1:i + 1 + prefetch]
            if ahead:
                block.set_modules_to_forward_prefetch(ahead)
            behind = blocks[max(0, i - prefetch):i][::-1]
            if behind:
                block.set_modules_to_backward_prefetch(behind)
    return model


def _shard(model, info, tcfg, device, hybrid):
    if not info.enabled:
        if hybrid or tcfg.shard not in (0, 1) or tcfg.replicate not in (0, 1):
            _mesh_dims(info, tcfg, hybrid)  # same validation as with several ranks
        return model
    if not hasattr(model, "blocks"):
        raise GenlabError(f"train.parallel={tcfg.parallel} needs a model that exposes .blocks")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    r, sh = _mesh_dims(info, tcfg, hybrid)  # a 1-D ('shard',) mesh for FSDP, 2-D ('replicate', 'shard') for HSDP
    mesh = init_device_mesh(device.type, (r, sh) if hybrid else (sh,),
                            mesh_dim_names=("replicate", "shard") if hybrid else ("shard",))
    model._genlab_mesh = mesh
    # a bf16 run on a GPU computes with bf16 params (fp32 master weights and reduce)
    bf16 = tcfg.precision in ("bf16", "auto") and torch.cuda.is_available() and tcfg.device != "cpu"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    return _fully_shard_model(model, mesh, mp, keep_last=tcfg.fsdp_keep_last, prefetch=tcfg.fsdp_prefetch)


for _name, _doc, _hybrid in (("fsdp", "FSDP2 fully_shard per block then root over all ranks (1-D mesh)", False),
                             ("hsdp", "FSDP2 on a 2-D mesh: replicate (train.replicate) x shard (train.shard)", True)):
    parallel_registry.register(_name, _doc, sharded=True)(functools.partial(_shard, hybrid=_hybrid))


def is_sharded(model) -> bool:
    """True when the parameters are DTensors (FSDP2/HSDP)."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def shard_like(ema, model):
    """Shard an EMA copy the way `model` is sharded, so the EMA update is local (shard by shard)."""
    mesh = getattr(model, "_genlab_mesh", None)
    if ema is None or mesh is None:
        return ema
    return _fully_shard_model(ema, mesh)


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (shares storage), or the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def grad_norm(params) -> torch.Tensor:
    """Global L2 norm of the gradients as a plain tensor (no host sync). DTensor (FSDP2/HSDP) gradients are reduced on
    their local shards: one foreach norm, one all-reduce of a scalar per Shard mesh dim, not DTensor dispatch per tensor."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if not hasattr(grads[0], "_local_tensor"):
        return torch.nn.utils.get_total_norm(grads)
    norms = torch._foreach_norm([local(g) for g in grads])
    sq = torch.stack([n.float() for n in norms]).square().sum()
    sum_over_shards(sq, grads[0])
    return sq.sqrt()


def sum_over_shards(t: torch.Tensor, like) -> None:
    """All-reduce (sum) `t` in place over the mesh dims that shard the DTensor `like` (FSDP2/HSDP)."""
    from torch.distributed.tensor.placement_types import Shard
    for i, pl in enumerate(like.placements):
        if isinstance(pl, Shard):
            dist.all_reduce(t, group=like.device_mesh.get_group(i))


def fusable_grad_scale(optimizer) -> bool:
    """True when `optimizer.step()` applies `optimizer.grad_scale` inside its fused kernel (torch's fused Adam/AdamW):
    clipping can then divide the gradients inside the update instead of in a pass of its own."""
    return (isinstance(optimizer, torch.optim.Adam) and all(g.get("fused") for g in optimizer.param_groups)
            and not any(hasattr(p, "_local_tensor") for g in optimizer.param_groups for p in g["params"][:1]))


def clip_grads(params, max_norm: float, optimizer=None) -> torch.Tensor:
    """Global-norm clipping of plain, DDP and FSDP2/HSDP (DTensor) parameters, torch.nn.utils.clip_grad_norm_'s rule;
    returns the norm, no host sync. With a `fusable_grad_scale` optimizer the factor goes to its fused kernel as
    `grad_scale` instead of rewriting the gradients: the caller must step it next, with no GradScaler of its own."""
    params = [p for p in params if p.grad is not None]
    norm = grad_norm(params)
    if optimizer is not None:
        optimizer.grad_scale = None
    if max_norm <= 0 or not params:
        return norm
    if optimizer is not None and fusable_grad_scale(optimizer):
        optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)
        return norm
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    grads = [local(p.grad) for p in params]
    torch._foreach_mul_(grads, coef.to(grads[0].device))
    return norm


def full_state_dict(model) -> dict | None:
    """Unsharded CPU state dict of a (possibly FSDP) model on every rank; a collective when sharded."""
    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def no_sync(model, sync: bool):
    """Skip the gradient all-reduce on micro-steps that are not the last of an accumulation."""
    if sync:
        return contextlib.nullcontext()
    model = getattr(model, "_orig_mod", model)  # torch.compile(DDP(...)) hides the DDP wrapper
    if isinstance(model, DDP):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: synced again on leaving the context
        model.set_requires_gradient_sync(False)
        undo = contextlib.ExitStack()
        undo.callback(model.set_requires_gradient_sync, True)
        return undo
    return contextlib.nullcontext()


def wrap_parallel(model, info, tcfg, device):
    return parallel_registry.get(tcfg.parallel)(model, info, tcfg, device)


def unwrap(model):
    """The underlying backbone of a DDP/compiled wrapper."""
    while hasattr(model, "_orig_mod") or (hasattr(model, "module") and not hasattr(model, "blocks")):
        model = model._orig_mod if hasattr(model, "_orig_mod") else model.module
    return model
