"""Sweep reports: results.csv, report.md (one table) and report.html (the table, plots, sample grids). Every number
comes from the run's own files (metrics.jsonl, config.toml); how each column is aggregated: docs/sweeps.md.
For sweeps whose runs were evaluated with `eval.nfe_list` (each run's eval_nfe.json), the quality-vs-NFE part: one
table method x (sampler, NFE) with the run's cost and its ratios to the run's `reference`, two plots and the runs'
sample grids stacked into one picture (docs/sweeps.md). First finished seed of each variant.
"""
from __future__ import annotations

import csv
import html
import json
import math
import shutil
from pathlib import Path

from genlab.config.tree import from_dict, load_toml
from genlab.core.tables import markdown_table as table
from genlab.data.datasets import dataset_registry
from genlab.eval.labelled_grid import stack_pictures
from genlab.families.models import model_registry
from genlab.lab.match import param_count as count
from genlab.lab.sweep.tables import render
from genlab.runtime.checkpoint import read_summary
from genlab.runtime.metrics import read_metrics, train_records

COLUMNS = ["params_m", "final_loss", "samples_per_s", "tokens_per_s", "mfu", "step_time", "peak_mem_gib", "optim_state_mib",
           "wall_time", "data_wait_frac"]


def param_count(run_dir: Path) -> int | None:
    """Parameters of an image-backbone run (dit, dit_incontext, mmdit), from its saved config (meta device, no
    weights read); its data shape is known without loading its data (synthetic, digits, a prepared folder)."""
    p = Path(run_dir) / "config.toml"
    if not p.exists():
        return None
    try:
        cfg = from_dict(load_toml(p))
        shape_of = dataset_registry.spec(cfg.data.name).shape if model_registry.spec(cfg.model.name).family == "image" else None
        shape = shape_of(cfg.data) if shape_of is not None else None
        return count(cfg.model, {k: shape[k] for k in ("kind", "image_size", "channels", "num_classes")}) if shape else None
    except Exception:  # noqa: BLE001 - a column we cannot fill stays empty
        return None


def run_row(run_dir: Path, loss_at=(), loss_at_time=()) -> dict:
    """The numbers of one run, read from its own files. loss_at: steps; loss_at_time: training wall-clock seconds
    (the last logged loss at or before that time, so runs compare at equal compute time)."""
    run_dir = Path(run_dir)
    recs = read_metrics(run_dir)
    train = train_records(recs)
    row = {}
    n = param_count(run_dir)
    if n is not None:
        row["params_m"] = n / 1e6
    if train:
        row["final_loss"] = train[-1]["loss"]
        row["steps"] = train[-1]["step"]
        steady = [r for r in train if not r["_warm"]] or train  # the first interval of a process holds compilation
        for k in ("samples_per_s", "tokens_per_s", "mfu", "data_wait_frac", "step_time"):
            vals = [r[k] for r in steady if r.get(k) is not None]
            row[k] = sum(vals) / len(vals) if vals else None
        for k in ("peak_mem_gib", "optim_state_mib"):
            row[k] = max((r[k] for r in train if r.get(k) is not None), default=None)
        row["wall_time"] = train[-1].get("wall_time")
        for s in loss_at:
            at = [r for r in train if r["step"] <= s]
            row[f"loss@{s}"] = at[-1]["loss"] if at else None
        for s in loss_at_time:
            at = [r for r in train if r.get("wall_time") is not None and r["wall_time"] <= s]
            row[f"loss@{int(s) if float(s).is_integer() else s}s"] = at[-1]["loss"] if at and train[-1]["wall_time"] >= s else None
    for r in recs:
        for k, v in r.items():
            if k.startswith("eval/") and isinstance(v, (int, float)):
                row[k[5:]] = float(v) if isinstance(v, bool) else v  # a yes/no averages to the share of seeds
    first = read_summary(run_dir).get("first_step_s")  # the cold start is in summary.json only
    if isinstance(first, (int, float)):
        row["first_step_s"] = first
    return row


FD_KEY = "eval/feature_fd"  # what eval metric `fd` records (genlab.eval.metrics); fd_target races on it


def time_to_fd(recs, target: float) -> tuple[int | None, float | None]:
    """The first evaluation (log.eval_every, or the final one) at feature FD <= target: its step, and the training
    wall-clock to it with the periodic evaluations' own time (their eval_s) taken out. (None, None) if never."""
    train, spent = train_records(recs), 0.0
    for r in recs:
        fd = r.get(FD_KEY)
        if not isinstance(fd, (int, float)):
            continue
        if fd <= target:
            at = [t for t in train if t["step"] <= r["step"] and t.get("wall_time") is not None]
            return r["step"], (at[-1]["wall_time"] - spent) if at else None
        spent += r.get("eval_s") or 0.0
    return None, None


def reference_run(run_name: str, variant: str, first_axis: list[str], target) -> str | None:
    """The run of this run's fd_target (a first-axis variant, or a table first-axis variant -> its target) with this
    run's other axis values and seed: the first-axis part of its name replaced."""
    for n in sorted(first_axis, key=len, reverse=True):
        if variant == n or variant.startswith(n + "-"):
            to = target if isinstance(target, str) else target.get(n, n if n in target.values() else None)
            return None if to is None else to + run_name[len(n):]
    return None


def race_to_fd(d: Path, members, settings, status: dict, partial: bool = False) -> list[dict]:
    """Per run (of `members`): steps and seconds to the final FD of its fd_target run, and that run's seconds to it
    divided by this run's (speed-up; > 1 = faster than the target run); target_fd_reached 1 or 0. The target run
    must have finished (an unfinished one has no final FD); with `partial` the racing run need not have."""
    target = settings.get("fd_target")
    axes = settings.get("axis") or [{}]
    first = [v.get("name") for v in axes[0].get("variants", []) if isinstance(v, dict)]
    out = []
    for run_name, st in members:
        ref = reference_run(run_name, st.get("variant", run_name), first, target) if target else None
        row = {}
        ref_done = (status.get(ref) or {}).get("status") == "finished"
        if ref and ref_done and _reads(d, run_name, st, partial) and (d / "runs" / ref / "metrics.jsonl").exists():
            ref_recs, recs = read_metrics(d / "runs" / ref), read_metrics(d / "runs" / run_name)
            goal = next((r[FD_KEY] for r in reversed(ref_recs) if isinstance(r.get(FD_KEY), (int, float))), None)
            if goal is not None:
                step, secs = time_to_fd(recs, goal)
                _, ref_secs = time_to_fd(ref_recs, goal)
                row = {"target_fd": goal, "steps_to_target_fd": step, "time_to_target_fd": secs,
                       "speedup_to_target_fd": ref_secs / secs if secs and ref_secs else None,
                       "target_fd_reached": float(step is not None)}  # the others average only the seeds that reached it
        out.append(row)
    return out


def _reads(d: Path, run_name: str, st: dict, partial: bool) -> bool:
    return st.get("status") == "finished" or (partial and (d / "runs" / run_name / "metrics.jsonl").exists())


def _mean_std(vals):
    vals = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if not vals:
        return None, None
    m = sum(vals) / len(vals)
    sd = (sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else None
    return m, sd


def _sweep_settings(d: Path) -> dict:
    return load_toml(d / "sweep.toml") if (d / "sweep.toml").exists() else {}


def collect(d: Path, partial: bool = False) -> tuple[list[dict], list[str]]:
    """One row per variant (seeds combined) in sweep order, and the ordered metric columns. `partial`: runs that did
    not finish (a timeout, a stop) count with what their metrics.jsonl logged, the step each reached in the reason."""
    d = Path(d)
    status = load_status(d)
    settings = _sweep_settings(d)
    loss_at = [int(s) for s in settings.get("loss_at", [])]
    loss_at_time = [float(s) for s in settings.get("loss_at_time", [])]
    groups: dict[str, list] = {}
    for run_name, st in status.items():
        if st.get("stage") == "command":  # a [[stage]] command made a folder, not a run
            continue
        groups.setdefault(st.get("variant", run_name), []).append((run_name, st))
    rows, metric_keys = [], []
    for variant, members in groups.items():
        per_seed, partial_to = [], []
        race = race_to_fd(d, members, settings, status, partial) if settings.get("fd_target") else [{}] * len(members)
        for (run_name, st), extra in zip(members, race):  # paths relative to d: a sweep folder can be moved or copied
            r = run_row(d / "runs" / run_name, loss_at, loss_at_time) if _reads(d, run_name, st, partial) else {}
            if st.get("status") != "finished" and "steps" in r:
                partial_to.append(r["steps"])
            r.update({k: v for k, v in extra.items() if v is not None})
            per_seed.append(r)
            metric_keys += [k for k in r if k not in metric_keys and k != "steps"]
        statuses = [st.get("status") for _, st in members]
        reasons = sorted({st.get("reason") for _, st in members if st.get("reason")})
        if partial_to:
            reasons.append(f"partial: {len(partial_to)} unfinished run(s) to step {min(partial_to)}"
                           + (f"-{max(partial_to)}" if max(partial_to) != min(partial_to) else ""))
        n_ok = statuses.count("finished")  # the first unfinished state is the row's, "finished" when there is none
        agg = next((x for x in ("failed", "interrupted", "running", "not_run", "skipped") if x in statuses), statuses[0])
        if 0 < n_ok < len(statuses):
            agg += f" ({n_ok}/{len(statuses)} seeds finished)"
        logs = [f"logs/{rn}.log" for rn, _ in members if (d / "logs" / f"{rn}.log").exists()]
        row = {"variant": variant, "seeds": len(members), "status": agg, "reason": "; ".join(reasons),
               "stalled": sum(run_stalled(d / "runs" / rn) for rn, _ in members),
               "reference": members[0][1].get("reference"),
               "runs": [rn for rn, _ in members], "finished_runs": [rn for rn, st in members if st.get("status") == "finished"],
               "logs": logs}
        for k in metric_keys:
            m, sd = _mean_std([r.get(k) for r in per_seed])
            row[k], row[k + "_std"] = m, sd
        rows.append(row)
    order = [c for c in COLUMNS if c in metric_keys] + [k for k in metric_keys if k.startswith("loss@") and not k.endswith("s")]
    order += [k for k in metric_keys if k.startswith("loss@") and k.endswith("s")]
    order += [k for k in metric_keys if k not in order]
    return rows, order


def format_count(n: float) -> str:
    """A count with a unit and three significant digits: 812, 12.3 k, 4.56 M, 1.2 B."""
    def three(x):
        return f"{float(f'{x:.3g}'):g}"
    for div, unit in ((1e9, " B"), (1e6, " M"), (1e3, " k")):
        if abs(n) >= 0.9995 * div:  # at three digits it is at least one of this unit (999,999 is 1 M)
            return three(n / div) + unit
    return three(n)


def _fmt(v, sd=None, key=""):
    if v is None:
        return ""
    if key == "params_m":  # parameters (stored in millions in results.csv): with a unit, so small models are not 0.0 M
        return format_count(v * 1e6) + (f" ± {format_count(sd * 1e6)}" if sd else "")
    pct = key == "mfu" or key.endswith("accuracy") or key.endswith("_acc") or key in ("data_wait_frac", "target_fd_reached")
    scale = 100 if pct else 1
    spec = ".1f" if key in ("samples_per_s", "tokens_per_s", "wall_time", "params_m", "optim_state_mib") or pct else \
        (".2f" if key == "peak_mem_gib" else ".4g")
    return " ± ".join(format(x * scale, spec) + ("%" if pct else "") for x in (v, sd) if x is not None)


HEADERS = {"params_m": "params", "final_loss": "final loss", "samples_per_s": "samples/s", "tokens_per_s": "tokens/s",
           "mfu": "MFU", "peak_mem_gib": "peak mem GiB", "wall_time": "wall s", "data_wait_frac": "data wait",
           "step_time": "step s", "optim_state_mib": "optim state MiB"}


def shown_columns(rows, cols, wanted=()) -> list[str]:
    """The table's columns: the sweep file's `metrics` (in its order) if given, else every column with a value."""
    if wanted:
        return list(wanted)
    return [c for c in cols if any(r.get(c) is not None for r in rows)]


def unrecorded(rows, cols, wanted) -> str:
    """A note naming the sweep file's `metrics` that no run recorded, so a misspelt or renamed metric is said, not
    shown as an empty column ("" when every name was found, or no run finished)."""
    gone = [c for c in wanted if c not in cols]
    if not gone or not any(r["finished_runs"] for r in rows):
        return ""
    return (f"No run recorded {', '.join(gone)} (empty columns); the sweep file's `metrics` can name: "
            f"{', '.join(cols)}.")


def run_stalled(run_dir: Path) -> bool:
    """The run's summary.json says it ended at the level of a predictor that ignores its input (training/stall.py)."""
    summary = read_summary(run_dir)
    return isinstance(summary, dict) and summary.get("stalled") is True


def _status_text(r) -> str:
    n = r.get("stalled") or 0
    stalled = "" if not n else ", STALLED" + (f" ({n}/{r['seeds']} seeds)" if r["seeds"] > 1 else "")
    return r["status"] + stalled + (f": {r['reason']}" if r["reason"] else "")


def _cells(r, cols) -> list[str]:
    return [r["variant"], str(r["seeds"])] + [_fmt(r.get(c), r.get(c + "_std"), c) for c in cols]


def markdown_table(rows, cols) -> str:
    head = ["variant", "seeds"] + [HEADERS.get(c, c) for c in cols] + ["status"]
    return table(head, [[x.replace("|", "/") for x in _cells(r, cols) + [_status_text(r)]] for r in rows])


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path.name


def _plots(d: Path, rows) -> list[str]:
    plt, files = _pyplot(), []
    curves = {r["variant"]: train_records(read_metrics(d / "runs" / r["finished_runs"][0]))
              for r in rows if r["finished_runs"]}
    for xkey, fname, xlabel in (("step", "loss_vs_step.png", "step"), ("wall_time", "loss_vs_time.png", "wall-clock s")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, recs in curves.items():
            pts = [(x.get(xkey), x["loss"]) for x in recs if x.get(xkey) is not None and x["loss"] > 0]
            if pts:
                ax.plot(*zip(*pts), label=name)
        ax.set(xlabel=xlabel, ylabel="training loss (first finished seed)", yscale="log")
        if curves:
            ax.legend(fontsize=7)
        files.append(_save(fig, d / fname))
    tput = "tokens_per_s" if any(r.get("tokens_per_s") for r in rows) else "samples_per_s"
    bars = [(tput, "throughput.png", HEADERS[tput])]
    if has_memory(rows):
        bars.append(("peak_mem_gib", "memory.png", "peak memory GiB"))
    else:  # a chart of nothing would read as zero memory; a stale one from an earlier rebuild goes too
        (d / "memory.png").unlink(missing_ok=True)
    for key, fname, label in bars:
        names = [r["variant"] for r in rows]
        vals = [r.get(key) or 0.0 for r in rows]
        errs = [r.get(key + "_std") or 0.0 for r in rows]
        fig, ax = plt.subplots(figsize=(7, 0.4 * len(names) + 1.2))
        ax.barh(names, vals, xerr=errs if any(errs) else None,
                color=["tab:blue" if r["status"] == "finished" else "tab:red" for r in rows])
        ax.set_xlabel(label + ("" if any(vals) else " (not measured on this device)") + "   red: not finished")
        ax.invert_yaxis()
        files.append(_save(fig, d / fname))
    return files


def has_memory(rows) -> bool:
    """Whether any run measured its peak memory (CUDA runs do; on a CPU it is not measured)."""
    return any(r.get("peak_mem_gib") is not None for r in rows)


BEST_FD_MAX_NFE = 100


def _doc(run: Path) -> dict | None:
    p = run / "eval_nfe.json"
    try:
        doc = json.loads(p.read_text()) if p.is_file() else None
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("rows"), list) else None


def _reference(name: str, docs: dict) -> dict:
    ref = {"name": name}
    if name in docs:
        rdoc = docs[name][1]
        rows = [r for r in rdoc["rows"] if r.get("feature_fd") is not None and r["nfe"] <= BEST_FD_MAX_NFE]
        ref.update(best=min(rows, key=lambda r: r["feature_fd"], default=None), gpu_seconds=(rdoc.get("cost") or {}).get("gpu_seconds"),
                   device=(rdoc.get("cost") or {}).get("device"))
    return ref


def nfe_rows(d: Path, rows: list[dict]) -> tuple[list[dict], dict]:
    """(one dict per method x sampler x NFE, {reference name: its best row, gpu_seconds, device})."""
    docs = {r["variant"]: (r, _doc(d / "runs" / r["finished_runs"][0])) for r in rows if r["finished_runs"]}
    docs = {k: v for k, v in docs.items() if v[1] is not None}
    refs = {r["reference"]: _reference(r["reference"], docs) for r, _ in docs.values() if r.get("reference")}
    out = []
    for name, (row, doc) in docs.items():
        cost, ref = doc.get("cost") or {}, refs.get(row.get("reference"), {})
        secs = cost.get("gpu_seconds")
        pct = cost.get("pct_of_teacher") if not ref.get("gpu_seconds") else None if secs is None else 100 * secs / ref["gpu_seconds"]
        best = (ref.get("best") or {}).get("feature_fd")
        for r in doc["rows"]:
            fd = r.get("feature_fd")
            out.append({"method": name, "reference": ref.get("name"), "sampler": r["sampler"], "nfe": r["nfe"],
                        "sample_accuracy": r.get("sample_accuracy"), "feature_fd": fd,
                        "fd_ratio": fd / best if fd is not None and best else None,
                        "precision": r.get("precision"), "recall": r.get("recall"), "feature_fd_floor": r.get("feature_fd_floor"),
                        "gpu_seconds": secs, "pct_of_reference": pct, "device": cost.get("device"),
                        **{k: r[k] for k in ("fid", "fid_floor", "lpips_diversity") if k in r}})
    return out, refs


def _f(v, spec=".4g", pct=False):
    if v is None:
        return ""
    return f"{100 * v:.1f}%" if pct else format(v, spec)


def nfe_markdown(out: list[dict], refs: dict) -> str:
    lines = ["## Quality vs NFE", ""]
    for ref in refs.values():
        best = ref.get("best")
        if best:
            lines.append(f"Reference `{ref['name']}`: best feature FD {best['feature_fd']:.4g} ({best['sampler']}, NFE "
                         f"{best['nfe']}, of its rows at <= {BEST_FD_MAX_NFE} NFE), training "
                         f"{_f(ref.get('gpu_seconds'), '.1f')} device-s on {ref.get('device')}.")
        else:
            lines.append(f"Reference `{ref['name']}` has no evaluation table: its runs' ratios are left empty.")
    floors = sorted({f"{r['feature_fd_floor']:.4g}" for r in out if r.get("feature_fd_floor") is not None})
    if floors:
        lines.append("Real-vs-real floor of feature FD: " + ", ".join(floors) + ".")
    lines.append("Cost: device-seconds on top of the run's root teacher (its training, generated data, intermediate "
                 "teachers); a run without a teacher: its own training.")
    extra = [k for k in ("fid", "lpips_diversity") if any(k in r for r in out)]
    head = ["method", "sampler", "NFE", "accuracy", "FD", "FD / ref best", "precision", "recall", *extra, "device-s",
            "% of ref training"]
    cells = [[r["method"], r["sampler"], r["nfe"], _f(r["sample_accuracy"], pct=True), _f(r["feature_fd"]),
              _f(r["fd_ratio"], ".2f"), _f(r["precision"], ".3f"), _f(r["recall"], ".3f"),
              *[_f(r.get(k)) for k in extra], _f(r["gpu_seconds"], ".1f"),
              "" if r["pct_of_reference"] is None else f"{r['pct_of_reference']:.1f}%"] for r in out]
    return "\n".join(lines + ["", table(head, cells)]) + "\n"


def nfe_plots(d: Path, out: list[dict], refs: dict) -> list[str]:
    plt = _pyplot()
    series: dict = {}
    for r in out:
        if r["feature_fd"] is not None:
            series.setdefault(f"{r['method']} ({r['sampler']})", []).append((r["nfe"], r["feature_fd"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in series.items():
        ax.plot(*zip(*sorted(pts)), marker="o", label=name)
    for ref in refs.values():
        if ref.get("best"):
            ax.axhline(ref["best"]["feature_fd"], ls="--", lw=0.8, label=f"{ref['name']} best (<= {BEST_FD_MAX_NFE} NFE)")
    floors = [r["feature_fd_floor"] for r in out if r.get("feature_fd_floor") is not None]
    if floors:
        ax.axhline(min(floors), ls=":", c="gray", lw=0.8, label="real-vs-real floor")
    ax.set(xscale="log", yscale="log", xlabel="NFE (network evaluations per sample)", ylabel="feature FD")
    ax.legend(fontsize=6)
    first = _save(fig, d / "fd_vs_nfe.png")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    few = sorted({r["nfe"] for r in out if r["nfe"] <= 8})
    for nfe, marker in zip(few, "osD^v<>p*h"):
        pts = [(r["gpu_seconds"], r["feature_fd"], r["method"]) for r in out
               if r["nfe"] == nfe and r["gpu_seconds"] and r["feature_fd"] is not None]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=f"NFE {nfe}")
            for x, y, name in pts:
                ax.annotate(name, (x, y), fontsize=5, alpha=0.7)
    for ref in refs.values():
        if ref.get("best") and ref.get("gpu_seconds"):
            ax.scatter([ref["gpu_seconds"]], [ref["best"]["feature_fd"]], marker="*", s=120, label=f"{ref['name']} best")
    ax.set(xscale="log", yscale="log", xlabel="cost: device-seconds on top of the teacher (reference: its training)",
           ylabel="feature FD")
    ax.legend(fontsize=6)
    return [first, _save(fig, d / "cost_vs_fd.png")]


def write_nfe_report(d: Path, rows: list[dict]) -> tuple[str, list[str]]:
    """(the markdown section, the picture files) — empty when no run has an eval_nfe.json."""
    out, refs = nfe_rows(d, rows)
    if not out:
        return "", []
    md = nfe_markdown(out, refs)
    (d / "nfe.md").write_text(md)
    (d / "nfe.json").write_text(json.dumps({"references": refs, "rows": out}, indent=2, default=str))
    # nfe_grid.png: every run's eval_nfe.png under its variant name (the same classes and noise in each)
    items = [(r["variant"], d / "runs" / r["finished_runs"][0] / "eval_nfe.png") for r in rows if r["finished_runs"]]
    items = [(n, p) for n, p in items if p.is_file()]
    if items:
        stack_pictures(items, d / "nfe_grid.png")
    return md, nfe_plots(d, out, refs) + (["nfe_grid.png"] if items else [])


NO_MEMORY = "No memory chart: no run measured its peak memory (it is measured on CUDA devices only)."


PARTIAL = ("Partial (`--partial`): rows that did not finish average what their runs logged before they stopped; "
           "the status column gives the step each reached. Their final loss and FD are not the finished runs' numbers.")


def write_report(d, partial: bool = False) -> Path:
    """Rebuild results.csv, report.md and report.html (with its plots and sample grids) from the runs; `partial`
    (`genlab sweep report DIR --partial`): unfinished runs count with what they logged (collect)."""
    d = Path(d)
    rows, cols = collect(d, partial)
    settings = _sweep_settings(d)
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["variant", "seeds", "status", "stalled", "reason"]
                           + [k for c in cols for k in (c, c + "_std")], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    shown = shown_columns(rows, cols, settings.get("metrics", ()))
    missing = unrecorded(rows, cols, shown)
    desc = settings.get("description", "")
    for r in rows:  # runs recorded before a sweep named its reference: the file's
        r["reference"] = r.get("reference") or settings.get("reference")
    nfe_md, nfe_pics = write_nfe_report(d, rows)
    plots = (_plots(d, rows) if rows else []) + nfe_pics
    note = "" if has_memory(rows) or not rows else NO_MEMORY
    if partial and any(r["status"] != "finished" for r in rows):
        note = (PARTIAL + ("\n\n" + note if note else ""))
    tables = render(d, settings.get("tables", {}), load_status(d))
    variants = (markdown_table(rows, shown) + (f"\n\n{missing}" if missing else "") + f"\n\nPlots (in report.html): "
                f"{', '.join(plots)}" + (f"\n\n{note}" if note else "") + "\n") if rows else ""
    (d / "report.md").write_text(f"# Sweep {d.name}\n\n" + (f"{desc}\n\n" if desc else "") + _ran(d) + variants
                                 + (f"\n{nfe_md}" if nfe_md else "") + (f"\n{tables}\n" if tables else ""))
    grids = []
    (d / "grids").mkdir(exist_ok=True)
    for r in rows:
        src = d / "runs" / r["finished_runs"][0] / "samples.png" if r["finished_runs"] else None
        if src is not None and src.exists():
            dst = d / "grids" / f"{r['variant']}.png"
            shutil.copyfile(src, dst)
            grids.append((r["variant"], f"grids/{dst.name}"))
    (d / "report.html").write_text(_html(d.name, desc, rows, shown, plots, grids, nfe_md, note, missing))
    return d / "report.md"


def load_status(d) -> dict:
    p = Path(d) / "status.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _ran(d: Path) -> str:
    """The header line: date, commit, device, torch of the last call, and its command-line overrides."""
    env, cli = d / "env.txt", d / "overrides.json"
    if not env.exists():
        return ""
    overrides = " ".join(json.loads(cli.read_text())) if cli.exists() else ""
    return env.read_text().strip() + (f"; command-line overrides: {overrides}" if overrides else "") + "\n\n"


def _html(name, desc, rows, cols, plots, grids, nfe_md="", note="", missing="") -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(HEADERS.get(c, c))}</th>" for c in ["variant", "seeds", *cols, "status"])
    body = []
    for r in rows:
        cells = _cells(r, cols)
        logs = " ".join(f'<a href="{esc(lg)}">log</a>' for lg in r["logs"])
        body.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + f"<td>{esc(_status_text(r))} {logs}</td></tr>")
    imgs = "".join(f'<figure><img src="{esc(p)}"><figcaption>{esc(p)}</figcaption></figure>' for p in plots)
    gr = "".join(f'<figure><img src="{esc(p)}" width="256" style="image-rendering:pixelated"><figcaption>{esc(n)}</figcaption></figure>'
                 for n, p in grids)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>sweep {esc(name)}</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
            "figure{display:inline-block;margin:8px}</style></head><body>"
            f"<h1>Sweep {esc(name)}</h1>" + (f"<p>{esc(desc)}</p>" if desc else "") +
            f"<table><tr>{head}</tr>{''.join(body)}</table>" + (f"<p>{esc(missing)}</p>" if missing else "") + (f"<pre>{esc(nfe_md)}</pre>" if nfe_md else "") +
            "<h2>Plots</h2>" + (f"<p>{esc(note)}</p>" if note else "") + f"{imgs}<h2>Samples (first finished seed)</h2>{gr}</body></html>")


def compare(d1, d2) -> str:
    """Two sweeps side by side: rows matched by variant name, columns A | B | B/A (rows of only one side kept)."""
    (r1, c1), (r2, c2) = collect(Path(d1)), collect(Path(d2))
    cols = [c for c in c1 if c in c2] or [c for c in COLUMNS if c in c1 or c in c2]
    by1, by2 = {r["variant"]: r for r in r1}, {r["variant"]: r for r in r2}
    names = list(by1) + [n for n in by2 if n not in by1]
    head = ["variant"] + [f"{HEADERS.get(c, c)} {x}" for c in cols for x in ("A", "B", "B/A")] + ["status A", "status B"]
    body = []
    for n in names:
        a_row, b_row = by1.get(n, {}), by2.get(n, {})
        cells = [n]
        for c in cols:
            a, b = a_row.get(c), b_row.get(c)
            ratio = f"{b / a:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else ""
            cells += [_fmt(a, None, c), _fmt(b, None, c), ratio]
        cells += [a_row.get("status", "absent"), b_row.get("status", "absent")]
        body.append([x.replace("|", "/") for x in cells])
    return f"A = {d1}, B = {d2}\n\n" + table(head, body)
