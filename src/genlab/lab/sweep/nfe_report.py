"""The quality-vs-NFE part of a sweep report, for sweeps whose runs were evaluated with `eval.nfe_list` (each run's
eval_nfe.json): one table method x (sampler, NFE) with the run's cost and its ratios to the run's `reference`, two
plots and the runs' sample grids stacked into one picture (docs/sweeps.md). First finished seed of each variant.
"""
from __future__ import annotations

import json
from pathlib import Path

from genlab.core.tables import markdown_table
from genlab.eval.labelled_grid import stack_pictures

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


def markdown(out: list[dict], refs: dict) -> str:
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
    return "\n".join(lines + ["", markdown_table(head, cells)]) + "\n"


def plots(d: Path, out: list[dict], refs: dict) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(fig, ax, name):
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(d / name, dpi=110)
        plt.close(fig)
        return name
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
    first = save(fig, ax, "fd_vs_nfe.png")
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
    return [first, save(fig, ax, "cost_vs_fd.png")]


def write_nfe_report(d: Path, rows: list[dict]) -> tuple[str, list[str]]:
    """(the markdown section, the picture files) — empty when no run has an eval_nfe.json."""
    out, refs = nfe_rows(d, rows)
    if not out:
        return "", []
    md = markdown(out, refs)
    (d / "nfe.md").write_text(md)
    (d / "nfe.json").write_text(json.dumps({"references": refs, "rows": out}, indent=2, default=str))
    # nfe_grid.png: every run's eval_nfe.png under its variant name (the same classes and noise in each)
    items = [(r["variant"], d / "runs" / r["finished_runs"][0] / "eval_nfe.png") for r in rows if r["finished_runs"]]
    items = [(n, p) for n, p in items if p.is_file()]
    if items:
        stack_pictures(items, d / "nfe_grid.png")
    return md, plots(d, out, refs) + (["nfe_grid.png"] if items else [])
