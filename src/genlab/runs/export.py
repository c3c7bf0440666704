"""`genlab export RUN --out DIR`: a run as a self-describing folder others load and the Hugging Face Hub hosts as it
is (format and loader: runtime/export_folder.py), written as DIR.partial and renamed: a crash never leaves half of it."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import genlab
from genlab.config.tree import dumps_toml, to_dict
from genlab.core.errors import GenlabError
from genlab.runs.load import load_run
from genlab.runs.model_card import model_card
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.checkpoint import load_checkpoint
from genlab.runtime.export_folder import CARD, CONFIG, FORMAT, META, VERSION, WEIGHTS, is_export_folder, sha256, split_tied

FILE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl")  # an --out with one of these is a mistyped file, not a folder


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
    state = load_checkpoint(run)
    if state.get("quant"):  # its file holds the source's float weights; torchao's tensors are rebuilt at load
        raise GenlabError(f"'{run}' is a quantized run ({state['quant'].get('format')}): export its source run "
                          f"{state['quant'].get('source')}")
    _, model, _, _, _ = load_run(run, "cpu", ema=ema)  # converters re-applied: the weights of the converted model
    key = "ema" if ema and state.get("ema") is not None else "model"
    return {**state, key: dict(model.state_dict())}, model


def read_summary(run) -> dict:
    """The summary.json of the run folder behind RUN: a run folder, one of its checkpoints, or the consolidated
    model.safetensors of an FSDP run (beside its summary); {} where there is none."""
    p = Path(run)
    dirs = [p] * p.is_dir() + [p.parent.parent] * (p.parent.name == "checkpoints") + [p.parent] * p.is_file()
    d = next((d for d in dirs if (d / "summary.json").exists()), None)
    s = ckpt.read_summary(d) if d is not None else {}
    return s if isinstance(s, dict) else {}


def export_folder(run, out, ema: bool = True, force: bool = False) -> Path:
    """Write RUN as the folder OUT (see the module doc). Returns OUT."""
    from safetensors.torch import save_file

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
        meta["sha256"] = {WEIGHTS: sha256(part / WEIGHTS)}
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
