"""Process groups and model wrapping for data parallelism, launched by torchrun."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from genlab.errors import GenlabError
from genlab.registry import parallel_registry


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


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise GenlabError(f"train.device={name} but CUDA is not available; valid here: auto, cpu")
    if not (name == "cpu" or name.startswith("cuda")):
        raise GenlabError(f"unknown train.device '{name}'; valid: auto, cpu, cuda, cuda:N")
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


def no_sync(model, sync: bool):
    """Skip the gradient all-reduce on micro-steps that are not the last of an accumulation."""
    if sync:
        return contextlib.nullcontext()
    if isinstance(model, DDP):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        return _restore_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _restore_sync(model):
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def wrap_parallel(model, info, tcfg, device):
    return parallel_registry.get(tcfg.parallel)(model, info, tcfg, device)
