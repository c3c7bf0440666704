"""Sharded checkpoints of FSDP2/HSDP runs with torch.distributed.checkpoint (DCP; docs/performance.md), and
safetensors export. Loading never unpickles anything but plain data (`read_metadata`, `_SafeBytes`)."""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from genlab.core.errors import GenlabError, one_line

META = "meta.pt"


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
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    path = Path(path)
    if not (path / META).exists():
        raise GenlabError(f"'{path}' is not a complete genlab DCP checkpoint (no {META})")
    meta = _load_meta(path / META)
    reader = SafeReader(path)  # .metadata is checked here, before DCP reads anything
    keys = {"model", "ema"} if meta.get("has_ema") else {"model"}
    full: dict = {}

    class Planner(_SafeBytes, _EmptyStateDictLoadPlanner):
        pass
    _dcp_call(path, lambda: _load_state_dict(state_dict=full, storage_reader=reader, no_dist=True,
                                             planner=Planner(keys=keys)))
    return {**meta, "model": full["model"], "ema": full.get("ema"), "optimizer": None, "dcp_path": str(path)}


def _load_meta(p: Path) -> dict:
    """meta.pt with weights_only=True (no code runs on load); refused in one line when it needs more."""
    import pickle
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise GenlabError(f"refused to load '{p}': it holds more than tensors, numbers, strings, lists and dicts; "
                          f"only load checkpoints you trust") from None
    except Exception as e:  # noqa: BLE001
        raise GenlabError(f"cannot read '{p}': {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


# What DCP's `.metadata` pickle holds (torch 2.x): its own dataclasses, torch.Size, dtypes, layouts by name
# and the folder as a path. Anything else is refused before it is constructed.
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                                              "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


def read_metadata(path) -> object:
    """A DCP folder's `.metadata`, unpickled by a loader that admits only the classes DCP's metadata holds:
    a crafted file is refused in one line with nothing in it run; an empty or cut file is one line too."""
    import pickle

    from torch.distributed.checkpoint.metadata import Metadata
    p = Path(path) / ".metadata"

    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            torch_ok = module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype))
            if not (torch_ok or name in _METADATA_CLASSES.get(module, ())):
                raise GenlabError(f"refused to load '{p}': it asks for {module}.{name}, which DCP metadata never holds; "
                                  f"nothing in it was run. Only load checkpoints you trust; share exported model.safetensors")
            return super().find_class(module, name)
    try:
        with open(p, "rb") as f:
            md = Restricted(f).load()
    except GenlabError:
        raise
    except Exception as e:  # noqa: BLE001  (empty, truncated, not a pickle)
        raise GenlabError(f"cannot read DCP checkpoint '{p}': not DCP metadata ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else 'empty or cut short'})") from None
    if not isinstance(md, Metadata):
        raise GenlabError(f"cannot read DCP checkpoint '{p}': it holds a {type(md).__name__}, not DCP metadata")
    return md


def SafeReader(path):  # noqa: N802  (a class built on first use: torch.distributed.checkpoint loads lazily)
    """A FileSystemReader of the DCP folder `path` that gives DCP the `.metadata` checked here first (DCP's own plain
    pickle.load runs any payload, and a refusal raised inside its load is logged with a traceback per attempt)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    checked = read_metadata(path)

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            if getattr(checked, "storage_meta", None) is None:
                checked.storage_meta = StorageMeta()
            checked.storage_meta.load_id = self.load_id
            return checked
    return Reader(str(path))


class _SafeBytes:
    """Planner mix-in: DCP loads non-tensor entries (optimizer hyper-parameters) with torch.load(weights_only=False);
    genlab only ever saves numbers, strings, lists and dicts there, so they load with weights_only=True."""
    def load_bytes(self, read_item, value):
        try:
            obj = torch.load(value, weights_only=True)
        except Exception:  # noqa: BLE001
            raise GenlabError(f"refused to load a DCP entry '{read_item.dest_index.fqn}': it holds more than tensors, "
                              f"numbers, strings, lists and dicts; nothing in it was run") from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _dcp_call(path, fn):
    """DCP's CheckpointException derives from BaseException (the CLI's one-line handler misses it): one line here.
    Its warnings are silenced ("no process group, loading in a single process" is the intent)."""
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except GenlabError:
        raise
    except CheckpointException as e:
        excs = [pair[0] for pair in e.failures.values() if isinstance(pair, tuple) and pair]
        for exc in excs:  # a GenlabError raised inside DCP (a refused entry) comes back wrapped per rank
            if isinstance(exc, GenlabError):
                raise GenlabError(str(exc)) from None
        why = one_line(excs[0]) if excs else "unreadable"
        raise GenlabError(f"cannot read DCP checkpoint '{path}': {why}") from None


def load_dcp_optimizer(path, model, optimizer) -> None:
    """Restore the optimizer from a DCP checkpoint into this run's (possibly differently sharded) model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    state = {"optim": get_optimizer_state_dict(model, optimizer)}

    class Planner(_SafeBytes, DefaultLoadPlanner):
        pass
    reader = SafeReader(path)  # .metadata is checked here, before DCP reads anything
    _dcp_call(path, lambda: dcp.load(state, storage_reader=reader, planner=Planner()))
    set_optimizer_state_dict(model, optimizer, state["optim"])


def export_safetensors(state: dict, out, ema: bool = True) -> Path:
    """Consolidated single-file weights (EMA when present) + config and data spec in the metadata."""
    from safetensors.torch import save_file
    out = Path(out)
    weights = state["ema"] if ema and state.get("ema") is not None else state["model"]
    tensors, seen = {}, set()
    for k, v in weights.items():  # tied weights (a GPT's embedding and head) share storage: safetensors stores each once
        t = v.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        tensors[k] = t.clone() if ptr in seen else t
        seen.add(ptr)
    meta = {"genlab_config": json.dumps(state["config"]), "genlab_data_spec": json.dumps(state["data_spec"]),
            "genlab_step": str(state.get("step", 0)), "genlab_weights": "ema" if weights is state.get("ema") else "model"}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # a shared model file is readable like any file the user writes
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
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
