"""Sample quality against the sampler's cost: the run's own evaluation at each (sampler, NFE) of eval.samplers x
eval.nfe_list, written to eval_nfe.md / .json / .png (docs/image_flow.md)."""
from __future__ import annotations

import dataclasses
import json

import torch

from genlab.core.errors import GenlabError
from genlab.core.tables import markdown_table
from genlab.eval.cost import cost_line
from genlab.eval.labelled_grid import labelled_rows
from genlab.sampling.images import eval_context
from genlab.sampling.samplers import nfe_per_step, sampler_registry


def parse_int_list(text: str, key: str) -> list[int]:
    try:
        out = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise GenlabError(f"{key} must be comma-separated integers >= 1 (e.g. 4,8,16,32), got {text!r}")
    return out


def samplers_of(cfg) -> list[str]:
    names = [s.strip() for s in cfg.eval.samplers.split(",") if s.strip()] or [cfg.method.sampler]
    for n in names:
        sampler_registry.get(n)  # unknown names fail with the valid choices
    return names


def nfe_points(cfg) -> list[tuple[str, int]]:
    """(sampler, steps) of every row, in order; two NFEs that round to the same steps give one row."""
    points = []
    for name in samplers_of(cfg):
        k = nfe_per_step(name)
        for nfe in parse_int_list(cfg.eval.nfe_list, "eval.nfe_list"):
            if (name, max(1, nfe // k)) not in points:
                points.append((name, max(1, nfe // k)))
    return points


def _point_context(ctx, cfg, name, steps, **extra):
    sub = eval_context(cfg, ctx["device"], ctx["run_dir"], sampler=name, **extra)
    sub["eval"] = dataclasses.replace(ctx["eval"], sample_steps=steps)
    return sub


def nfe_rows(evaluate, ctx, cfg) -> list[dict]:
    """One row per (sampler, NFE): evaluate(ctx) -> metrics with that sampler and step count, the same seed each."""
    return [{"sampler": name, "nfe": steps * nfe_per_step(name), "steps": steps,
             **{m: v for m, v in evaluate(_point_context(ctx, cfg, name, steps)).items()
                if isinstance(v, (int, float)) and m != "classifier_val_acc"}} for name, steps in nfe_points(cfg)]


GRID_CLASSES, GRID_NOISES, GRID_SEED = 10, 2, 0


def nfe_grid(pixels, num_classes: int, ctx, cfg, path):
    """eval_nfe.png: one row per (sampler, NFE), the same GRID_CLASSES classes x GRID_NOISES starting noises in every
    row and every run (a fixed seed, not the run's), so pictures of different runs and step counts line up.
    pixels(ctx) -> generate(labels, desc), uint8 pixels (image_quality's callable)."""
    k = max(1, num_classes)
    labels = torch.arange(GRID_NOISES * min(k, GRID_CLASSES), device=ctx["device"]) % min(k, GRID_CLASSES)
    rows = []
    for name, steps in nfe_points(cfg):
        gen = torch.Generator(device=ctx["device"]).manual_seed(GRID_SEED)
        sub = _point_context(ctx, cfg, name, steps, generator=gen)
        sub["eval"] = dataclasses.replace(sub["eval"], batch_size=len(labels))  # one batch: the same noise per image
        rows.append((f"{name} NFE {steps * nfe_per_step(name)}", pixels(sub)(labels, "eval: grid").numpy()))
    return labelled_rows(rows, path)


FLOOR_KEYS = ("eval_samples", "floor_samples")


def _is_floor(key: str) -> bool:
    """Columns that do not depend on the samples: the real-vs-real floors and the sample counts."""
    return key.endswith("_floor") or key.endswith("_real") or key in FLOOR_KEYS


def format_table(rows: list[dict], cfg_scale: float, cost: dict | None = None) -> str:
    """A markdown table: sampler, NFE, steps, then every metric the evaluation returned; the real-vs-real floors
    (the same in every row) and the cost in the lines above it."""
    metrics = [k for k in rows[0] if k not in ("sampler", "nfe", "steps") and not _is_floor(k)] if rows else []
    head = ["sampler", "NFE", "steps", *metrics]
    floors = {k: v for k, v in (rows[0] if rows else {}).items() if _is_floor(k) and k not in FLOOR_KEYS}
    lines = [f"sample quality vs NFE (guidance scale {cfg_scale})"]
    if floors:
        n = rows[0].get("eval_samples")
        lines.append("real-vs-real floor (training images vs the reference set" + (f", {n} samples" if n else "") + "): "
                     + ", ".join(f"{k.removesuffix('_floor')} {v:.4g}" for k, v in floors.items()))
    if cost:
        lines.append(cost_line(cost))
    cells = [[r["sampler"], r["nfe"], r["steps"]] + [f"{100 * r[m]:.1f}%" if m.endswith("accuracy") else f"{r[m]:.4g}"
                                                     for m in metrics] for r in rows]
    return "\n".join(lines + ["", markdown_table(head, cells)]) + "\n"


def write_table(rows: list[dict], run_dir, cfg_scale: float, cost: dict | None = None, step: int | None = None) -> str:
    """eval_nfe.md and eval_nfe.json ({"rows", "cost", "cfg_scale", "step"}) in the run folder; returns the markdown."""
    md = format_table(rows, cfg_scale, cost)
    (run_dir / "eval_nfe.md").write_text(md)
    doc = {"step": step, "cfg_scale": cfg_scale, "rows": rows, "cost": cost}
    (run_dir / "eval_nfe.json").write_text(json.dumps(doc, indent=2, default=str))
    return md
