"""Sample quality against the sampler's cost: the method's own evaluation at each (sampler, NFE) pair of
eval.samplers x eval.nfe_list (`genlab eval RUN eval.nfe_list=4,8,16,32`).

NFE counts velocity evaluations per sample: steps * the sampler's nfe_per_step (an NFE that the sampler
cannot hit exactly is rounded down to whole steps, and the row states the NFE it ran). With guidance
each evaluation is one forward of a doubled batch (outside method.cfg_interval, a single one).
"""
from __future__ import annotations

import dataclasses
import json

from genlab.errors import GenlabError


def parse_int_list(text: str, key: str) -> list[int]:
    try:
        out = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise GenlabError(f"{key} must be comma-separated integers >= 1 (e.g. 4,8,16,32), got {text!r}") from None
    if not out or min(out) < 1:
        raise GenlabError(f"{key} must be comma-separated integers >= 1 (e.g. 4,8,16,32), got {text!r}")
    return out


def samplers_of(cfg) -> list[str]:
    from genlab.registry import sampler_registry
    names = [s.strip() for s in cfg.eval.samplers.split(",") if s.strip()] or [cfg.method.sampler]
    for n in names:
        sampler_registry.get(n)  # unknown names fail with the valid choices
    return names


def nfe_rows(method, model, data, ctx, cfg) -> list[dict]:
    """One row per (sampler, NFE): the method's evaluation with that sampler and step count, same seed each."""
    from genlab.methods.samplers import nfe_per_step
    from genlab.sampling import eval_context
    rows = []
    for name in samplers_of(cfg):
        k = nfe_per_step(name)
        for nfe in parse_int_list(cfg.eval.nfe_list, "eval.nfe_list"):
            steps = max(1, nfe // k)
            sub = eval_context(cfg, ctx["device"], ctx["run_dir"], sampler=name)
            sub["eval"] = dataclasses.replace(ctx["eval"], sample_steps=steps)
            res = method.evaluate(model, data, sub)
            rows.append({"sampler": name, "nfe": steps * k, "steps": steps,
                         **{m: v for m, v in res.items() if isinstance(v, (int, float)) and m != "classifier_val_acc"}})
    return rows


def format_table(rows: list[dict], cfg_scale: float) -> str:
    """A markdown table: sampler, NFE, steps, then every metric the evaluation returned."""
    metrics = [k for k in rows[0] if k not in ("sampler", "nfe", "steps")] if rows else []
    head = ["sampler", "NFE", "steps", *metrics]
    lines = [f"sample quality vs NFE (guidance scale {cfg_scale})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = [r["sampler"], str(r["nfe"]), str(r["steps"])]
        vals += [f"{100 * r[m]:.1f}%" if m.endswith("accuracy") else f"{r[m]:.4g}" for m in metrics]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def write_table(rows: list[dict], run_dir, cfg_scale: float) -> str:
    """eval_nfe.md and eval_nfe.json in the run folder; returns the markdown."""
    md = format_table(rows, cfg_scale)
    (run_dir / "eval_nfe.md").write_text(md)
    (run_dir / "eval_nfe.json").write_text(json.dumps(rows, indent=2))
    return md
