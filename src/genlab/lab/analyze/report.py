"""What `genlab analyze` writes: one CKA heat map per noise level, the skip plot, and analysis.md."""
from __future__ import annotations

from pathlib import Path

import torch

from genlab.core.tables import markdown_table


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def adjacent_mean(m: torch.Tensor) -> float:
    """Mean CKA of neighbouring blocks (i, i + 1): high = the residual stream changes little per block."""
    return float(torch.diagonal(m, 1).mean()) if len(m) > 1 else float("nan")


def heatmap(ax, m):
    """A CKA matrix on one colour scale (0..1), block indices on both axes (never 0.5 steps)."""
    from matplotlib.ticker import MaxNLocator
    im = ax.imshow(m.numpy(), vmin=0, vmax=1, cmap="magma", origin="lower")
    ax.set_xlabel("block")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    return im


def cka_heatmaps(sims: dict, out: Path) -> list[Path]:
    plt = _plt()
    paths = []
    for t, m in sims.items():
        fig, ax = plt.subplots(figsize=(4.8, 4.2))
        im = heatmap(ax, m)
        ax.set_ylabel("block")
        ax.set_title(f"linear CKA of block outputs, t = {t:g} (0 noise, 1 data)", fontsize=8)
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        p = out / f"cka_t{t:g}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def skip_plot(rows: list[dict], out: Path) -> Path:
    """Feature FD (relative to the unskipped model) and sample accuracy per skipped block or run of blocks."""
    plt = _plt()
    names = [r["skipped"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 0.3 * len(rows) + 1.6), sharey=True)
    a.barh(names, [r["fd_ratio"] for r in rows], color="tab:blue")
    a.axvline(1.0, color="k", lw=0.8)
    a.set(xlabel="feature FD / FD of the unskipped model", xscale="log")
    b.barh(names, [100 * r["sample_accuracy"] for r in rows], color="tab:green")
    b.set_xlabel("sample accuracy %")
    a.invert_yaxis()
    fig.tight_layout()
    p = out / "skip.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _table(head, rows) -> list[str]:
    return markdown_table(head, rows).splitlines()


def markdown(res: dict) -> str:
    lines = [f"# Layer analysis of {res['run']} (step {res['step']})", "",
             f"Model {res['model']} with {res['depth']} blocks, method {res['method']}, device {res['device']}. "
             "See docs/analyze.md for what each number means.", ""]
    if not res.get("complete", True):
        lines += ["**Partial:** the analysis is still running or was stopped; the sections below are the finished "
                  "parts.", ""]
    if "cka" in res:
        c = res["cka"]
        lines += ["## Layer similarity (linear CKA)", "",
                  f"One batch of {c['batch']} real images noised to each t, {c['tokens']} grid tokens per image; "
                  "rows = sample x token, centred.", ""]
        rows = []
        for t, m in c["by_t"].items():
            m = torch.tensor(m)
            off = m[~torch.eye(len(m), dtype=torch.bool)]
            rows.append([t, f"{adjacent_mean(m):.3f}", f"{float(off.mean()):.3f}" if len(off) else "-",
                         f"{float(m[0, -1]):.3f}", f"cka_t{t}.png"])
        lines += _table(["t", "mean CKA, adjacent blocks", "mean CKA, all pairs", "CKA first-last", "heat map"], rows)
        lines.append("")
    if "reference" in res:
        r = res["reference"]
        lines += [f"Sampling: {res['eval_samples']} samples, {res['sample_steps']} steps, CFG {res['cfg_scale']:g}; "
                  f"the unskipped model: feature FD {r['feature_fd']:.4g} (real-vs-real floor {r['feature_fd_floor']:.4g}), "
                  f"sample accuracy {100 * r['sample_accuracy']:.1f}%.", ""]
    if "skip" in res:
        lines += ["## Layer skipping (identity blocks at sampling time)", ""]
        lines += _table(["skipped", "feature FD", "FD / unskipped", "sample accuracy", "mean |Δ pixel| vs unskipped"],
                        [[r["skipped"], f"{r['feature_fd']:.4g}", f"{r['fd_ratio']:.3g}",
                          f"{100 * r['sample_accuracy']:.1f}%", f"{r['pixel_diff']:.2f}"] for r in res["skip"]])
        lines += ["", f"Plot: {res['skip_plot']}" if "skip_plot" in res else "", ""]
    if "cache" in res:
        lines += _cache_lines(res["cache"], res["reference"])
    return "\n".join(lines) + "\n"


def _cache_lines(c: dict, ref: dict) -> list[str]:
    """The cached-block sampler's section: the search (auto), the cached rows against the plain sampler, the hint."""
    lines = ["## Cached-block sampler", ""]
    if "search" in c:
        sr = c["search"]
        lines += [f"Blocks searched (`--cache-blocks auto`): in order of least change, each kept if caching it with the "
                  f"blocks kept so far keeps FD within {sr['fd_tol']:g}x the unskipped FD: "
                  + "; ".join(f"{t['block']}: {t['fd_ratio']:.3g} {'kept' if t['kept'] else 'left out'}"
                              for t in sr["trail"]) + ".", ""]
    if not c["blocks"]:
        lines += ["No block can be cached within the tolerance: there is no cached sampler to measure.", ""]
    else:
        lines += [f"Blocks {', '.join(map(str, c['blocks']))} recompute every {c['every']} network evaluations and reuse "
                  "their last residual contribution in between.", ""]
        rows = [["every block computed", f"{ref['feature_fd']:.4g}", "1", f"{100 * ref['sample_accuracy']:.1f}%",
                 f"{c['baseline_forward_seconds']:.3g}", "1"]]
        for name, r in (("cached", c), ("step-aware schedule, same share", c.get("scheduled"))):
            if r:
                rows.append([name, f"{r['feature_fd']:.4g}", f"{r['fd_ratio']:.3g}", f"{100 * r['sample_accuracy']:.1f}%",
                             f"{r['forward_seconds']:.3g}", f"{r['speedup']:.2f}x"])
        lines += _table(["sampler", "feature FD", "FD / unskipped", "sample accuracy", "network seconds", "speed-up"], rows)
        lines += ["", f"Block evaluations saved: {100 * c['block_evals_saved']:.0f}% (the ideal speed-up of the blocks' "
                  "share of the forward)."]
        if "scheduled" in c:
            sc = c["scheduled"]
            lines += ["", f"The step-aware schedule reuses {100 * sc['block_evals_saved']:.0f}% of the block evaluations "
                      f"too, but picks them per evaluation (of {sc['evaluations']} per pass), greedily by the drift each "
                      "reuse adds (a block's summed change in the warm-up pass since it last computed), as "
                      "Learning-to-Cache's router is per timestep (read off one measured pass here, not trained). "
                      "Reused blocks by evaluation: "
                      + ("; ".join(f"{k}: {','.join(map(str, v))}" for k, v in sc["reuse"].items()) or "none") + "."]
        lines += ["",
                  "Sample or evaluate with the fixed cache: `genlab sample RUN method.cache_blocks="
                  f"{','.join(str(b) for b in c['blocks'])} method.cache_every={c['every']}` (or `genlab eval`; "
                  "`method.cache_blocks=auto` reads the blocks from RUN/analysis/analysis.json); with the step-aware "
                  "schedule: `genlab sample RUN method.cache_schedule=auto` (the same sampler and steps as this "
                  "analysis)."]
    if c.get("change"):
        lines += ["", "Mean relative change of each block's contribution between consecutive evaluations: "
                  + ", ".join(f"{i}: {v:.3g}" for i, v in c["change"].items()), ""]
    return lines
