"""Sharded checkpoints for FSDP2/HSDP runs with torch.distributed.checkpoint (DCP), and safetensors export.

A DCP checkpoint is a folder `checkpoints/step_N.dcp/`: every rank writes its own shards of the model,
optimizer and EMA (keyed by parameter name, so it can be loaded on any number of ranks), and rank 0 adds
`meta.pt` with the rest of the trainer state (step, loader position, RNGs, config). It is written to a
temporary folder and renamed, like the single-file checkpoints.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from genlab.errors import GenlabError

META = "meta.pt"


def is_dcp(path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ".metadata").exists()


def _barrier(info):
    if info is not None and info.enabled and dist.is_initialized():
        dist.barrier()


def save_dcp(ckpt_dir, step: int, model, optimizer, ema, meta: dict, info) -> Path:
    """Collective: every rank calls it. Returns the checkpoint folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / f"step_{step:08d}.dcp"
    tmp = ckpt_dir / f".step_{step:08d}.dcp.tmp"
    if info.is_main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier(info)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    if ema is not None:
        state["ema"] = get_model_state_dict(ema)
    dcp.save(state, checkpoint_id=str(tmp))
    if info.enabled:  # every rank's noise generator, so a same-size resume continues each stream exactly
        gens = [None] * info.world
        dist.all_gather_object(gens, meta.get("gen"))
        meta = {**meta, "gens": gens}
    if info.is_main:
        torch.save({**meta, "world": info.world, "has_ema": ema is not None}, tmp / META)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    _barrier(info)
    return path


def load_dcp_full(path) -> dict:
    """Trainer meta + unsharded model and EMA weights (CPU), on any number of processes."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    path = Path(path)
    if not (path / META).exists():
        raise GenlabError(f"'{path}' is not a complete genlab DCP checkpoint (no {META})")
    meta = _load_meta(path / META)
    keys = {"model", "ema"} if meta.get("has_ema") else {"model"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group, loading in a single process" is the intent
        full = _load_state_dict_from_keys(keys, checkpoint_id=str(path))
    return {**meta, "model": full["model"], "ema": full.get("ema"), "optimizer": None, "dcp_path": str(path)}


def _load_meta(p: Path) -> dict:
    """meta.pt with weights_only=True (no code runs on load); refused in one line when it needs more."""
    import pickle
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise GenlabError(f"refused to load '{p}': it holds more than tensors, numbers, strings, lists and dicts; "
                          f"only load checkpoints you trust") from None
    except Exception as e:  # noqa: BLE001
        raise GenlabError(f"cannot read '{p}': {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def load_dcp_optimizer(path, model, optimizer) -> None:
    """Restore the optimizer from a DCP checkpoint into this run's (possibly differently sharded) model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    osd = get_optimizer_state_dict(model, optimizer)
    state = {"optim": osd}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(path))
    set_optimizer_state_dict(model, optimizer, state["optim"])


def export_safetensors(state: dict, out, ema: bool = True) -> Path:
    """Consolidated single-file weights (EMA when present) + config and data spec in the metadata."""
    from safetensors.torch import save_file
    out = Path(out)
    weights = state["ema"] if ema and state.get("ema") is not None else state["model"]
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    meta = {"genlab_config": json.dumps(state["config"]), "genlab_data_spec": json.dumps(state["data_spec"]),
            "genlab_step": str(state.get("step", 0)), "genlab_weights": "ema" if weights is state.get("ema") else "model"}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, out)
    return out


def load_safetensors(path) -> dict:
    """An exported file as a checkpoint-shaped dict that `genlab sample` / `eval` understand."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if "genlab_config" not in meta:
        raise GenlabError(f"'{path}' is not a genlab export (no genlab_config metadata)")
    return {"model": load_file(str(path)), "ema": None, "optimizer": None, "config": json.loads(meta["genlab_config"]),
            "data_spec": json.loads(meta["genlab_data_spec"]), "step": int(meta.get("genlab_step", 0))}
