"""The model card (README.md) of an exported folder: YAML front matter the Hugging Face Hub reads (library_name,
tags), then what was trained, on what, by which command, its final metrics, and how to load it."""
from __future__ import annotations

import json
import math
import shlex

from genlab.config.tree import Config, apply_dict, load_toml, resolve_preset_path, to_dict
from genlab.core.errors import GenlabError
from genlab.core.tables import markdown_table

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
