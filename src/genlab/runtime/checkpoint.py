"""Checkpoints: written atomically (temp file + rename), the last K kept, found by step number."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from genlab.config.tree import Config, apply_overrides, from_dict, validate
from genlab.config.fields import dotted_of
from genlab.core.errors import GenlabError
from genlab.core.registry import all_registries
from genlab.runtime import dcp
from genlab.runtime.export_folder import is_export_folder, load_export_folder

CKPT_RE = re.compile(r"step_(\d+)\.(pt|dcp)$")  # .dcp: sharded folder (runtime/dcp.py)
BEST_NAME = "best.pt"  # log.keep_best: the state with the lowest validation metric


def ckpt_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir) -> list[Path]:
    d = ckpt_dir(run_dir)
    if not d.exists():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := CKPT_RE.search(p.name))]
    return [p for _, p in sorted(found)]


def _atomic_save(state: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-write leaves only a .tmp file, never a broken checkpoint
    return path


def save_checkpoint(run_dir, step: int, state: dict, keep_last: int = 3) -> Path:
    path = _atomic_save(state, ckpt_dir(run_dir) / f"step_{step:08d}.pt")
    if keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            prune(old)
    return path


def save_best(run_dir, state: dict) -> Path:
    """checkpoints/best.pt (log.keep_best): never pruned, never picked by resume (`--resume RUN` takes the
    latest step_*.pt); pass the file itself to sample/eval/resume from it."""
    return _atomic_save(state, ckpt_dir(run_dir) / BEST_NAME)


def prune(path: Path):
    if path.is_dir():
        import shutil
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def run_dir_of(path_or_run) -> Path:
    """The run folder of a run folder, a step_N.pt file or a step_N.dcp folder (a directory, yet a checkpoint)."""
    p = Path(path_or_run)
    return p if p.is_dir() and not (p / ".metadata").exists() else p.parent.parent


def resolve_checkpoint(path_or_run) -> Path:
    p = Path(path_or_run)
    if p.is_file() or (p.is_dir() and p.suffix == ".dcp") or is_export_folder(p):
        return p
    if p.is_dir():
        ckpts = list_checkpoints(p)
        if ckpts:
            return ckpts[-1]
        raise GenlabError(f"no checkpoint in '{p}' (expected {p}/checkpoints/step_*.pt, or genlab.json in an "
                          f"exported folder)")
    if not p.exists():  # a typo or a wrong folder: say so, not what kind of thing it is not
        raise GenlabError(f"'{p}' does not exist; give a run folder, a checkpoint file (step_N.pt) or an exported folder")
    raise GenlabError(f"'{p}' is neither a run folder nor a checkpoint file")


def load_checkpoint(path_or_run, map_location="cpu") -> dict:
    p = resolve_checkpoint(path_or_run)
    if is_export_folder(p):  # `genlab export RUN --out DIR`: config.toml + model.safetensors + genlab.json
        return load_export_folder(p)
    if p.suffix in (".dcp", ".safetensors"):
        try:
            return dcp.load_dcp_full(p) if p.suffix == ".dcp" else dcp.load_safetensors(p)
        except GenlabError:
            raise
        except Exception as e:
            raise GenlabError(f"cannot read checkpoint '{p}': {e}") from None
    return safe_load(p, map_location)


def safe_load(p: Path, map_location="cpu"):
    """torch.load that never runs code: `weights_only=True` admits only tensors, numbers, strings, lists,
    tuples and dicts, which is all a genlab checkpoint holds. Anything else (a pickle payload, or an old
    checkpoint that pickled objects) is refused in one line, unexecuted."""
    import pickle
    try:
        state = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        bad_op = re.search(r"Unsupported operand \d+", str(e))
        if "Weights only load failed" not in str(e) or bad_op:  # garbage bytes, not a refused object
            raise GenlabError(f"cannot read checkpoint '{p}': not a checkpoint file "
                              f"({bad_op.group(0) if bad_op else _first(e)})") from None
        what = re.search(r"GLOBAL ([\w.]+)", str(e))
        raise GenlabError(f"refused to load '{p}': it holds more than tensors, numbers, strings, lists and dicts"
                          f"{f' (it asks for {what.group(1)})' if what else ''}; nothing in it was run. Only load "
                          f"checkpoints you trust; share exported model.safetensors") from None
    except Exception as e:  # noqa: BLE001  (truncated, empty, not a zip/pickle file)
        raise GenlabError(f"cannot read checkpoint '{p}': {_first(e)}") from None
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise GenlabError(f"'{p}' is not a genlab checkpoint (no model weights and config)")
    return state


def config_of(state: dict):
    """The Config a checkpoint was trained with. Configs saved before `model.pos_emb` also chose DiT positions
    (they lack train.convert) meant a DiT's fixed sin-cos table by it, whatever the key said. Configs saved before
    `train.bitlinear_norm` trained their BitNet converters without the input norm: they load as `none`."""
    d = {sec: dict(v) if isinstance(v, dict) else v for sec, v in state["config"].items()}
    if "convert" not in d.get("train", {}) and d.get("model", {}).get("pos_emb") == "learned" and d["model"].get("name") == "dit":
        d["model"]["pos_emb"] = "auto"
    train = d.get("train", {})
    if "bitlinear_norm" not in train and _reads_bitlinear_norm(train.get("convert") or []):
        train["bitlinear_norm"] = "none"
    return from_dict(d)


def _reads_bitlinear_norm(convert) -> bool:
    names = [convert] if isinstance(convert, str) else list(convert)
    converters = all_registries()["convert"]  # by name: the converters live on the nn floor above
    return any(n in converters and "train.bitlinear_norm" in
               dotted_of(converters.spec(n).keys) + tuple(converters.spec(n).reads) for n in names)


def _first(e: BaseException) -> str:
    """The first sentence of an exception message (torch's run to several lines)."""
    text = str(e).strip().split("\n")[0].split(". ")[0]
    return text or type(e).__name__


def read_summary(run_dir) -> dict:
    """A run folder's summary.json; {} when there is none (a run killed before writing it) or it is unreadable."""
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def check_extends(resume_from, steps: int, summary: dict) -> None:
    """A finished run is never modified: resuming it must extend it (a larger train.steps) from its last
    checkpoint, so its files only grow and metrics.jsonl repeats no step."""
    run, done = run_dir_of(resume_from), summary.get("step")
    kept = list_checkpoints(run)
    if summary.get("status") != "finished" or not kept or int(CKPT_RE.search(kept[-1].name)[1]) != done:
        return  # not finished, or rewound by hand (its last checkpoints deleted): it resumes as any run
    how = f"extend it with `genlab train --resume {run} train.steps=N` (N > {done})"
    if steps <= done:
        raise GenlabError(f"run '{run}' finished at step {done} (train.steps={steps}) and is never modified; {how}")
    if resolve_checkpoint(resume_from).name != kept[-1].name:
        raise GenlabError(f"run '{run}' is finished: {how} from its last checkpoint {kept[-1].name}, not {resume_from}")


def config_for_resume(run_or_ckpt: str, overrides: list[str]) -> Config:
    """The saved config of a run, with optional overrides (e.g. a longer train.steps)."""
    cfg = config_of(load_checkpoint(run_or_ckpt))
    apply_overrides(cfg, overrides)
    validate(cfg)
    return cfg
