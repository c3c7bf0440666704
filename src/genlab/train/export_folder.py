"""`genlab export RUN --out DIR`: a run as a self-describing folder others load (and the Hugging Face Hub hosts as is).

    DIR/config.toml        the run's full resolved config (TOML; `genlab train DIR/config.toml` retrains it)
    DIR/model.safetensors  the sampling weights (EMA unless --no-ema); tied tensors stored once, re-tied on load
    DIR/genlab.json        what loading needs beyond the config: format version, data spec, step, which weights,
                           the sha256 of model.safetensors
    DIR/README.md          the model card: Hub metadata, the run's metrics, the command, how to load it

Loading reads JSON, TOML and safetensors only: nothing in the folder is unpickled or run (a stray .pt file is
never opened). The folder is written as DIR.partial and renamed, so a crash never leaves half an export at DIR.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from genlab.errors import GenlabError

FORMAT, VERSION = "genlab-export", 1
META, CONFIG, WEIGHTS, CARD = "genlab.json", "config.toml", "model.safetensors", "README.md"
FILE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")  # an --out with one of these is a mistyped file, not a folder


def is_export_folder(path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / META).is_file()


def check_out(out, force: bool) -> Path:
    """--out DIR, before any work: an existing DIR is replaced only with --force, and only when it is an export."""
    out = Path(out)
    if out.suffix in FILE_SUFFIXES:
        raise GenlabError(f"--out must be a .safetensors file or a folder (a path without a file suffix), got '{out}'")
    if out.exists() or out.is_symlink():
        if not force:
            raise GenlabError(f"'{out}' exists; pass --force to replace it")
        if not out.is_dir() or (any(out.iterdir()) and not is_export_folder(out)):
            raise GenlabError(f"'{out}' is not a genlab export folder (no {META}); refusing to replace it with --force")
    return out


def exported_state(run, ema: bool = True):
    """(checkpoint state whose sampling weights are those of the model as sample/eval load it, that model)."""
    from genlab.sample import load_run
    from genlab.train.checkpoint import load_checkpoint
    state = load_checkpoint(run)
    if state.get("quant"):  # its file holds the source's float weights; torchao's tensors are rebuilt at load
        raise GenlabError(f"'{run}' is a quantized run ({state['quant'].get('format')}): export its source run "
                          f"{state['quant'].get('source')}")
    _, model, _, _, _ = load_run(run, "cpu", ema=ema)  # converters re-applied: the weights of the converted model
    key = "ema" if ema and state.get("ema") is not None else "model"
    return {**state, key: dict(model.state_dict())}, model


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _source_dir(run) -> Path | None:
    """The run folder behind RUN (a run folder, or one of its checkpoints), where summary.json lives."""
    p = Path(run)
    if p.is_dir() and (p / "summary.json").exists():
        return p
    if p.parent.name == "checkpoints" and (p.parent.parent / "summary.json").exists():
        return p.parent.parent
    if p.is_file() and (p.parent / "summary.json").exists():  # an FSDP run's consolidated model.safetensors
        return p.parent
    return None


def read_summary(run) -> dict:
    d = _source_dir(run)
    if d is None:
        return {}
    try:
        s = json.loads((d / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return s if isinstance(s, dict) else {}


def export_folder(run, out, ema: bool = True, force: bool = False) -> Path:
    """Write RUN as the folder OUT (see the module doc). Returns OUT."""
    from safetensors.torch import save_file

    import genlab
    from genlab.config import dumps_toml, to_dict
    from genlab.train import checkpoint as ckpt
    from genlab.train.model_card import model_card
    out = check_out(out, force)
    state, model = exported_state(run, ema)
    cfg = ckpt.config_of(state)
    which = "ema" if ema and state.get("ema") is not None else "model"
    tensors, tied = split_tied(state[which])
    meta = {"format": FORMAT, "version": VERSION, "genlab_version": genlab.__version__, "step": int(state.get("step", 0)),
            "weights": which, "model": cfg.model.name, "method": cfg.method.name, "preset": cfg.preset,
            "parameters": sum(p.numel() for p in model.parameters()), "data_spec": state["data_spec"]}
    part = out.with_name(out.name + ".partial")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    try:
        (part / CONFIG).write_text(dumps_toml(to_dict(cfg)))
        save_file(tensors, str(part / WEIGHTS), metadata={"format": "pt", "genlab_tied": json.dumps(tied)})
        meta["sha256"] = {WEIGHTS: _sha256(part / WEIGHTS)}
        (part / META).write_text(json.dumps(meta, indent=2, default=list) + "\n")
        (part / CARD).write_text(model_card(cfg, meta, read_summary(run), out.name))
        umask = os.umask(0)
        os.umask(umask)
        for f in part.iterdir():  # shared files: readable like any file the user writes
            os.chmod(f, 0o666 & ~umask)
        if out.exists():
            old = out.with_name(out.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(part, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(part, out)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return out


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

    from genlab.config import load_toml
    p = Path(path)
    meta = _read_meta(p)
    for name in (CONFIG, WEIGHTS):
        if not (p / name).is_file():
            raise GenlabError(f"'{p}' is an incomplete genlab export: {name} is missing")
    want = (meta.get("sha256") or {}).get(WEIGHTS)
    if want is not None and _sha256(p / WEIGHTS) != want:
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
