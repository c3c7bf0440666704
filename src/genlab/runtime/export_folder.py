"""The export folder's format and its loader (the writer: runs/export.py, `genlab export RUN --out DIR`; the format:
docs/export.md). Loading reads JSON, TOML and safetensors only: nothing in the folder is unpickled or run.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from genlab.config.tree import load_toml
from genlab.core.errors import GenlabError

FORMAT, VERSION = "genlab-export", 1
META, CONFIG, WEIGHTS, CARD = "genlab.json", "config.toml", "model.safetensors", "README.md"


def is_export_folder(path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / META).is_file()


def split_tied(weights: dict) -> tuple[dict, dict]:
    """(tensors to store, {alias: stored name}): a tensor that is exactly another's (a GPT's head tied to its
    embedding) is stored once, since safetensors refuses shared memory; other overlapping views are copied."""
    tensors, tied, first, storages = {}, {}, {}, set()
    for k, v in weights.items():
        t = v.detach().to("cpu")
        ptr = t.untyped_storage().data_ptr()
        same = (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and same in first:
            tied[k] = first[same]
            continue
        first[same] = k
        tensors[k] = t.clone().contiguous() if (ptr in storages or not t.numel()) else t.contiguous()
        storages.add(ptr)
    return tensors, tied


def retie(tensors: dict, tied: dict, where) -> dict:
    """The aliases of a tied export filled back in, so a strict load sees every key of the model."""
    for alias, name in tied.items():
        if name not in tensors or alias in tensors:
            raise GenlabError(f"'{where}' is inconsistent: tied weight {alias} -> {name} "
                              f"({'target missing' if name not in tensors else 'stored twice'})")
        tensors[alias] = tensors[name]
    return tensors


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _read_meta(p: Path) -> dict:
    try:
        meta = json.loads((p / META).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GenlabError(f"cannot read '{p / META}': {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise GenlabError(f"'{p}' is not a genlab export folder ({META} has no \"format\": \"{FORMAT}\")")
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        raise GenlabError(f"'{p}' is export format version {meta.get('version')!r}; this genlab reads up to "
                          f"{VERSION}: upgrade genlab")
    if not isinstance(meta.get("data_spec"), dict):
        raise GenlabError(f"'{p / META}' has no data_spec")
    return meta


def load_export_folder(path) -> dict:
    """An export folder as a checkpoint-shaped dict that sample / eval / load_run / init_from understand."""
    from safetensors import safe_open

    p = Path(path)
    meta = _read_meta(p)
    for name in (CONFIG, WEIGHTS):
        if not (p / name).is_file():
            raise GenlabError(f"'{p}' is an incomplete genlab export: {name} is missing")
    want = (meta.get("sha256") or {}).get(WEIGHTS)
    if want is not None and sha256(p / WEIGHTS) != want:
        raise GenlabError(f"'{p / WEIGHTS}' does not match the sha256 in {META}: it changed or was damaged after export")
    config = load_toml(p / CONFIG)
    try:
        with safe_open(str(p / WEIGHTS), "pt") as f:
            tied = json.loads((f.metadata() or {}).get("genlab_tied", "{}"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001  (truncated, not safetensors, bad header)
        raise GenlabError(f"cannot read '{p / WEIGHTS}': {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else 'unreadable'}") from None
    if not isinstance(tied, dict):
        raise GenlabError(f"'{p / WEIGHTS}' has a malformed genlab_tied entry")
    spec = dict(meta["data_spec"])
    if isinstance(spec.get("batch_keys"), list):
        spec["batch_keys"] = tuple(spec["batch_keys"])  # as the dataset reports it (JSON has no tuples)
    return {"model": retie(tensors, tied, p / WEIGHTS), "ema": None, "optimizer": None, "config": config,
            "data_spec": spec, "step": int(meta.get("step", 0)), "export": str(p)}
