"""`genlab analyze compare RUN RUN ...`: several runs' layer analyses side by side (one recipe at several sizes or
depths), read from what `genlab analyze RUN` wrote (nothing is recomputed): compare.md, compare.json and one row of
CKA heat maps per noise level that every run has, written into --out (default ./analysis_compare).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from genlab.core.errors import GenlabError
from genlab.lab.analyze.run import _plt, _save_figure, _table, cka_stats, heatmap

SKIP_OK = 1.5  # "a skip the model tolerates": FD within 1.5x the unskipped model's


def load_analysis(path) -> dict:
    """analysis.json of a run folder, of an analysis folder, or the file."""
    p = Path(path)
    for cand in (p, p / "analysis.json", p / "analysis" / "analysis.json"):
        if cand.is_file():
            try:
                return json.loads(cand.read_text())
            except json.JSONDecodeError as e:
                raise GenlabError(f"{cand} is not a readable analysis.json ({e.msg})") from None
    raise GenlabError(f"{path} has no analysis.json: run `genlab analyze {path}` first")


def summarize(res: dict) -> dict:
    """The numbers a comparison needs from one analysis: per t the adjacent / all-pairs / first-last CKA; the skip
    table's single-block FD ratios, its middle pair and the longest middle run within SKIP_OK; the cached sampler."""
    out = {"run": res.get("run", "?"), "depth": res.get("depth"), "model": res.get("model"), "cka": {}}
    for t, m in res.get("cka", {}).get("by_t", {}).items():
        out["cka"][t] = cka_stats(torch.tensor(m, dtype=torch.float64))
    rows = res.get("skip")
    if rows:
        single = [r["fd_ratio"] for r in rows if len(r["blocks"]) == 1]
        runs = [r for r in rows if len(r["blocks"]) > 1]
        pair = next((r for r in runs if len(r["blocks"]) == 2), None)
        ok = [len(r["blocks"]) for r in rows if r["blocks"] and r["fd_ratio"] <= SKIP_OK]
        out["skip"] = {"single_min": min(single), "single_max": max(single),
                       "single_within": sum(x <= SKIP_OK for x in single), "pair": pair and pair["skipped"],
                       "pair_ratio": pair and pair["fd_ratio"], "longest_within": max(ok, default=0)}
    if "cache" in res and "fd_ratio" in res["cache"]:  # none when the search found no block to cache
        out["cache_fd_ratio"] = res["cache"]["fd_ratio"]
        if "scheduled" in res["cache"]:  # analyses before the step-aware schedule have none
            out["cache_scheduled_fd_ratio"] = res["cache"]["scheduled"]["fd_ratio"]
    if "reference" in res:
        out["feature_fd"] = res["reference"]["feature_fd"]
    return out


def heatmap_row(analyses: list[dict], t: str, out: Path) -> Path:
    """The runs' CKA maps at noise level t in one row, one colour scale (0..1)."""
    plt = _plt()
    n = len(analyses)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n + 0.8, 3.6), squeeze=False)
    for ax, res in zip(axes[0], analyses):
        im = heatmap(ax, torch.tensor(res["cka"]["by_t"][t]))
        s = summarize(res)
        ax.set_title(f"{Path(s['run']).name} ({s['depth']} blocks)", fontsize=8)
    axes[0][0].set_ylabel("block")
    fig.suptitle(f"linear CKA of block outputs, t = {t} (0 noise, 1 data)", fontsize=9)
    fig.colorbar(im, ax=list(axes[0]), shrink=0.85)
    return _save_figure(fig, out / f"compare_cka_t{t}.png")


def markdown(sums: list[dict], ts: list[str], plots: list[Path]) -> str:
    lines = ["# Layer analyses compared", "", "One row per run (`genlab analyze RUN` of each; docs/analyze.md).", ""]
    if ts:
        head = ["run", "blocks"] + [f"adjacent CKA t={t}" for t in ts] + [f"first-last t={t}" for t in ts]
        rows = [[Path(s["run"]).name, str(s["depth"])] + [f"{s['cka'][t]['adjacent']:.3f}" for t in ts]
                + [f"{s['cka'][t]['first_last']:.3f}" for t in ts] for s in sums]
        lines += ["## Layer similarity", ""] + _table(head, rows) + [""]
        lines += [f"Heat maps: {', '.join(p.name for p in plots)}", ""]
    with_skip = [s for s in sums if "skip" in s]
    if with_skip:
        head = ["run", "blocks", "feature FD", "single-block skip: FD ratio min-max",
                f"single blocks within {SKIP_OK}x", "middle pair: FD ratio", f"longest skipped run within {SKIP_OK}x",
                "cached sampler FD ratio", "step-aware cache FD ratio"]
        rows = [[Path(s["run"]).name, str(s["depth"]), f"{s.get('feature_fd', float('nan')):.4g}",
                 f"{s['skip']['single_min']:.3g}-{s['skip']['single_max']:.3g}",
                 f"{s['skip']['single_within']} of {s['depth']}",
                 f"{s['skip']['pair_ratio']:.3g} ({s['skip']['pair']})" if s["skip"]["pair"] else "-",
                 str(s["skip"]["longest_within"]),
                 f"{s['cache_fd_ratio']:.3g}" if "cache_fd_ratio" in s else "-",
                 f"{s['cache_scheduled_fd_ratio']:.3g}" if "cache_scheduled_fd_ratio" in s else "-"] for s in with_skip]
        lines += ["## Layer skipping at sampling time", ""] + _table(head, rows) + [""]
    return "\n".join(lines)


def compare(paths: list, out) -> dict:
    """Read every run's analysis (all first: a missing one is an error before anything is written), then write."""
    if len(paths) < 2:
        raise GenlabError("genlab analyze compare needs two or more runs (or their analysis folders), "
                          f"got {len(paths)}")
    analyses = [load_analysis(p) for p in paths]
    sums = [summarize(a) for a in analyses]
    ts = [t for t in analyses[0].get("cka", {}).get("by_t", {}) if all(t in a.get("cka", {}).get("by_t", {})
                                                                       for a in analyses)]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = [heatmap_row(analyses, t, out) for t in ts]
    md = markdown(sums, ts, plots)
    (out / "compare.md").write_text(md)
    (out / "compare.json").write_text(json.dumps({"runs": [str(p) for p in paths], "summaries": sums}, indent=1))
    return {"out": out, "markdown": md, "summaries": sums, "plots": plots}
