"""`genlab export RUN --out DIR`: a run as a self-describing folder others load and the Hugging Face Hub hosts as it
is (format and loader: runtime/export_folder.py), written as DIR.partial and renamed: a crash never leaves half of it;
its model card (README.md) is YAML front matter the Hugging Face Hub reads (library_name, tags), then what was trained,
on what, by which command, its final metrics, and how to load it."""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
from pathlib import Path

import genlab
from genlab.config.tree import Config, apply_dict, dumps_toml, load_toml, resolve_preset_path, to_dict
from genlab.core.errors import GenlabError
from genlab.core.tables import markdown_table
from genlab.runs.load import load_run
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


FOLDER_KEYS = {("train", "out_dir"), ("train", "name")}  # they name the run folder, not the model
FAMILY_TAG = {"image": "image-generation", "latent": "image-generation", "text": "text-generation",
              "tokens": "text-generation", "episodes": "world-model"}
SKIP_METRICS = {"step", "world", "wall_time", "best_step"}  # shown elsewhere in the card, or not a metric


def train_command(cfg) -> tuple[str, list[str]]:
    """(a `genlab train` command that rebuilds this config, its overrides): the keys that differ from the preset.
    A preset that is no longer shipped gives the full config file instead."""
    try:
        base = apply_dict(Config(), load_toml(resolve_preset_path(cfg.preset)), source=cfg.preset)
    except GenlabError:
        return "genlab train config.toml", []
    have, want = to_dict(base), to_dict(cfg)
    overrides = [f"{sec}.{k}={_value(v)}" for sec, vals in want.items() if isinstance(vals, dict)
                 for k, v in vals.items() if (sec, k) not in FOLDER_KEYS and have[sec].get(k) != v]
    return " ".join(["genlab", "train", cfg.preset, *map(shlex.quote, overrides)]), overrides


def _value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return json.dumps(list(v), separators=(",", ":"))
    return str(v)


def _metric(v) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _dataset(cfg, spec: dict) -> str:
    name = cfg.data.name + (f" ({cfg.data.path})" if cfg.data.path else "")
    shape = ", ".join(f"{k} {spec[k]}" for k in ("kind", "image_size", "channels", "num_classes", "vocab_size",
                                               "num_samples") if spec.get(k) not in (None, ""))
    return f"{name}: {shape}" if shape else name


def model_card(cfg, meta: dict, summary: dict, name: str) -> str:
    spec = meta["data_spec"]
    text = spec.get("kind") in ("text", "tokens")
    tags = ["genlab", cfg.method.name, cfg.model.name] + ([FAMILY_TAG[spec["kind"]]] if spec.get("kind") in FAMILY_TAG else [])
    front = ["---", "library_name: genlab", "tags:", *(f"- {json.dumps(t)}" for t in dict.fromkeys(tags)), "---"]
    command, overrides = train_command(cfg)
    rows = [(k, m) for k, v in summary.items() if k not in SKIP_METRICS and (m := _metric(v)) is not None]
    final = summary.get("step")
    weights = "EMA" if meta["weights"] == "ema" else "raw (no EMA)"
    lines = [*front, "", f"# {name}", "",
             f"A `{cfg.model.name}` model ({meta['parameters']:,} parameters) trained with genlab's `{cfg.method.name}` "
             f"method on `{cfg.data.name}` for {meta['step']} steps. These are its {weights} weights.", "",
             "## Use", "", "With genlab installed, from this folder (or a download of it):", "", "```bash",
             "genlab sample . --n 16 --out samples" + (".txt" if text else ".png"), "genlab eval .", "```", "",
             "```python", "import genlab", "", 'run = genlab.load_run(".")',
             "samples = run.sample(n=4, seed=0" + (", text=True)" if text else ")  # [4, C, H, W] in [-1, 1]"), "```", "",
             "Loading reads `config.toml`, `genlab.json` and `model.safetensors` only: nothing is unpickled or run.", "",
             "## Training", "", "```bash", command, "```", "",
             f"- preset: `{cfg.preset}`" + (f", overrides: {', '.join(f'`{o}`' for o in overrides)}" if overrides else ""),
             f"- steps: {meta['step']}" + (f" (the run's summary is of step {final})" if final not in (None, meta["step"]) else ""),
             f"- parameters: {meta['parameters']:,}",
             f"- dataset: {_dataset(cfg, spec)}"]
    if summary.get("device"):
        wall = summary.get("wall_time")
        lines.append(f"- trained on: {summary['device']} x {summary.get('world', 1)}"
                     + (f", {wall:.0f} s" if isinstance(wall, (int, float)) else ""))
    lines += ["- full config: `config.toml` (`genlab train config.toml` trains it again)", "", "## Metrics", ""]
    if rows:
        lines += [f"Final values from the run's summary (step {final if final is not None else meta['step']}).", "",
                  markdown_table(["metric", "value"], rows)]
    else:
        lines.append("The run left no summary.json: no metrics recorded.")
    lines += ["", "## Files", "", "- `config.toml`: the run's full resolved config",
              "- `model.safetensors`: the weights (tied tensors stored once, tied again on load)",
              "- `genlab.json`: export format version, data spec, step, which weights, the weights' sha256",
              "", "## Upload", "", "```bash", f"hf upload USER/{name} . .", "```", ""]
    return "\n".join(lines)
