"""The quantization gap against training length (`genlab analyze quant-gap RUN`): every checkpoint of one run is
evaluated in float and quantized, on the same seeds and noise, and the gap (quantized minus float) is tabulated
and plotted against the steps trained. Kumar et al. 2024, "Scaling laws for precision" (arXiv 2411.04330),
find that post-training quantization hurts more the more data a model was trained on: a gap that grows with
steps. The fitted trend is gap = a + b·log10(step); b > 0 is the paper's direction."""
from __future__ import annotations

import json
from pathlib import Path

from genlab.core.errors import GenlabError
from genlab.core.tables import markdown_table
from genlab.nn.ptq import check_format, quantize_model
from genlab.runs.load import eval_data, evaluate_model, load_run
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.parallel import resolve_device

HIGHER_IS_BETTER = ("sample_accuracy", "precision", "recall", "classifier_val_acc")


def headline_metric(method, res: dict) -> str:
    """The metric the gap is plotted for: the method's validation metric (text: loss), else feature FD."""
    for key in (getattr(method, "best_metric", None), "feature_fd", "fid"):
        if key and isinstance(res.get(key), (int, float)):
            return key
    raise GenlabError(f"the run's evaluation reported no metric to compare (got: {', '.join(res) or 'nothing'}); "
                      "set eval.num_samples > 0")


def _seen(cfg, spec: dict, step: int) -> tuple[str, int]:
    """What the x axis counts besides steps: tokens for text runs, samples otherwise."""
    n = step * cfg.train.batch_size
    return ("tokens", n * int(spec["seq_len"])) if spec.get("kind") == "tokens" else ("samples", n)


def trend(steps, gaps) -> dict:
    """Least-squares gap = a + b·log10(step) (linear in log), and a power law gap = c·step^k where every gap > 0."""
    import numpy as np
    x = np.log10(np.asarray(steps, dtype=float))
    y = np.asarray(gaps, dtype=float)
    out = {}
    if len(x) >= 2 and np.ptp(x) > 0:
        b, a = np.polyfit(x, y, 1)
        out.update(a=float(a), b_per_decade=float(b))
        if (y > 0).all():
            k, logc = np.polyfit(x, np.log10(y), 1)
            out.update(power_c=float(10 ** logc), power_k=float(k))
    return out


def quant_gap(run, formats=("int8", "nf4"), overrides=(), device="auto", adaln=False) -> dict:
    """Evaluate every checkpoint of `run` in float and in each format; write RUN/analysis/quant_gap.{md,json,png}."""
    run = Path(run)
    if not formats:
        raise GenlabError("--formats: give at least one of nf4, int8, int4, fp8")
    dev = resolve_device(device, key="--device")
    for f in formats:
        check_format(f, dev)
    ckpts = [p for p in ckpt.list_checkpoints(run) if p.suffix == ".pt"]
    if not ckpts:
        raise GenlabError(f"no checkpoint in '{run}' (the gap needs checkpoints/step_*.pt: train with log.ckpt_every "
                          "and log.keep_last=0)")
    out_dir = run / "analysis"
    out_dir.mkdir(exist_ok=True)
    rows, data, key, unit = [], None, None, "samples"
    for path in ckpts:
        row = {}
        for fmt in (None, *formats):
            cfg, model, method, dev_, state = load_run(path, str(dev), True, overrides)
            data = eval_data(cfg, method) if data is None else data
            if fmt:
                quantize_model(model, fmt, dev_, adaln=adaln)
            # a fresh context per model (evaluate_model): the same generator seed, so float and quantized draw the same
            # noise; in the run's training precision, as `genlab eval` of the run and of its quantized copy sample
            res = evaluate_model(cfg, model, method, dev_, data, out_dir)
            key = key or headline_metric(method, res)
            row[fmt or "float"] = {k: v for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        unit, seen = _seen(cfg, state["data_spec"], int(state["step"]))
        rows.append({"step": int(state["step"]), unit: seen, **row})
    fits = {f: trend([r["step"] for r in rows], [r[f][key] - r["float"][key] for r in rows]) for f in formats}
    result = {"run": str(run), "metric": key, "formats": list(formats), "rows": rows, "trend": fits}
    (out_dir / "quant_gap.json").write_text(json.dumps(result, indent=2) + "\n")
    table, md = markdown(result, unit), out_dir / "quant_gap.md"
    md.write_text(table)
    return {**result, "table": table, "markdown": str(md), "plot": str(plot(result, out_dir / "quant_gap.png"))}


def markdown(result: dict, unit: str) -> str:
    key, formats, rows = result["metric"], result["formats"], result["rows"]
    extra = [k for k in ("sample_accuracy",) if k != key and all(k in r["float"] for r in rows)]
    head = ["step", unit, f"{key} float"] + [c for f in formats for c in (f"{key} {f}", f"gap {f}")]
    head += [f"{k} {v}" for k in extra for v in ("float", *formats)]
    lines = [f"Quantization gap of {result['run']} ({key}; gap = quantized - float"
             f"{', lower is better' if key not in HIGHER_IS_BETTER else ''}; same seeds and noise per checkpoint)", ""]
    cells = [[str(r["step"]), str(r[unit]), f"{r['float'][key]:.4g}"]
             + [c for f in formats for c in (f"{r[f][key]:.4g}", f"{r[f][key] - r['float'][key]:+.4g}")]
             + [f"{r[v][k]:.4g}" for k in extra for v in ("float", *formats)] for r in rows]
    lines += [markdown_table(head, cells), ""]
    for f, t in result["trend"].items():
        if "b_per_decade" in t:
            pw = f"; power law {t['power_c']:.3g}·step^{t['power_k']:.3g}" if "power_k" in t else ""
            lines.append(f"- {f}: gap ≈ {t['a']:.4g} {t['b_per_decade']:+.4g}·log10(step){pw} "
                         f"(slope per decade of steps; > 0 is arXiv 2411.04330's direction; one draw)")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    key, rows = result["metric"], result["rows"]
    steps = np.array([r["step"] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for f in result["formats"]:
        gaps = [r[f][key] - r["float"][key] for r in rows]
        line, = ax.plot(steps, gaps, "o", label=f)
        t = result["trend"][f]
        if "b_per_decade" in t:
            xs = np.geomspace(steps.min(), steps.max(), 50)
            ax.plot(xs, t["a"] + t["b_per_decade"] * np.log10(xs), "-", color=line.get_color(), alpha=0.7,
                    label=f"{f} fit {t['b_per_decade']:+.3g}/decade")
    ax.axhline(0, color="gray", lw=0.8)
    ax.set(xscale="log", xlabel="training step", ylabel=f"{key}: quantized - float",
           title="quantization gap vs training length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
