"""The sampling-time block cache (issue 34): the fixed cache against the step-aware schedule.

    python benchmarks/cache_schedule.py table heun=RUNS/cache_s*/analysis euler=RUNS/cache_s*/analysis_euler
    python benchmarks/cache_schedule.py compare RUN [overrides ...]     # e.g. method.sampler=heun eval.sample_steps=10

`table`: per LABEL=GLOB of analysed runs (`genlab analyze RUN --what cache`; one whose search kept no block is left
out) the unskipped FD and both caches' FD ratios, then mean ± std. `compare`: on one run and the same noise, the rule
before session 25 (the pairs of least single-step change, reimplemented here) against `step_schedule` (greedy on the
drift a reuse adds) on each block's residual and on the model's output, at the share of block evaluations the fixed
`half` cache saves, beside that cache.
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics

from common import REPO  # noqa: F401 - puts src/ on sys.path

from genlab.core.tables import markdown_table


def _band(xs):
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f} (one draw)"


def table_cells(arg: str) -> list:
    label, pattern = arg.split("=", 1)
    rows = [json.loads(open(f"{d}/analysis.json").read()) for d in sorted(glob.glob(pattern))]
    rows = [r for r in rows if "scheduled" in r.get("cache", {})]
    if not rows:
        return [label, 0, "", "", "", ""]
    fixed = [r["cache"]["fd_ratio"] for r in rows]
    stepped = [r["cache"]["scheduled"]["fd_ratio"] for r in rows]
    refs = " / ".join(f"{r['reference']['feature_fd']:.3f}" for r in rows)
    fixed_cells = ", ".join(f"{x:.3f} ({','.join(map(str, r['cache']['blocks']))})" for x, r in zip(fixed, rows))
    stepped_cells = ", ".join(f"{x:.3f}" for x in stepped)
    shares = sorted({f"{r['cache']['block_evals_saved']:.0%}" for r in rows})  # a search's share differs by run
    return [label, len(rows), refs, f"{fixed_cells}; {_band(fixed)}", f"{stepped_cells}; {_band(stepped)}", ", ".join(shares)]


def least_change_schedule(change, share, depth):
    """The old rule: the pairs with the smallest single-step change, as many as `share` of the pass's block
    evaluations (evaluation 0 always computes)."""
    n = int(round(share * change.evaluations * depth))
    plan: dict[int, set[int]] = {}
    for k, i in sorted(change.at, key=lambda ki: (change.at[ki], ki))[:n]:
        plan.setdefault(k, set()).add(i)
    return {k: frozenset(v) for k, v in sorted(plan.items())}


def compare(run, overrides, device):
    from genlab.data import build_dataset
    from genlab.lab.analyze.run import HALF, Sampler, _cached_scores, _warm_up_and_pick
    from genlab.runs.load import _run_dir, load_run
    from genlab.runtime.parallel import unwrap
    from genlab.sampling.block_cache import forward_timer, step_schedule
    cfg, model, method, dev, _ = load_run(run, device, True, overrides)
    base = unwrap(model)
    method.cache_blocks = []
    cfg.eval.metrics = "accuracy,fd"
    sampler = Sampler(cfg, method, model, build_dataset(cfg.data), dev, _run_dir(run))
    blocks, _, measured = _warm_up_and_pick(sampler, base, HALF, output_probe=True)
    with forward_timer(base, dev) as tm:
        _, ref = sampler.score("unskipped")
    depth, every = len(base.blocks), cfg.method.cache_every
    fixed = _cached_scores(sampler, base, ref, tm["seconds"], "fixed cache", indices=blocks, every=every)
    share = fixed["block_evals_saved"]
    rows = [("every block computed", ref["feature_fd"], 1.0, ref.get("sample_accuracy")),
            (f"fixed cache, blocks {','.join(map(str, blocks))} every {every}", fixed["feature_fd"], fixed["fd_ratio"],
             fixed.get("sample_accuracy"))]
    for name, rule, change in (("step-aware, least single-step change (old)", least_change_schedule, measured),
                               ("step-aware, greedy on drift (new)", step_schedule, measured),
                               ("step-aware, greedy on output-level drift", step_schedule, measured.at_output())):
        m = _cached_scores(sampler, base, ref, tm["seconds"], name, indices=[], schedule=rule(change, share, depth),
                           period=measured.evaluations)
        rows.append((name, m["feature_fd"], m["fd_ratio"], m.get("sample_accuracy")))
    print(f"run {run}, overrides {' '.join(overrides) or '-'}, {measured.evaluations} evaluations per sample, "
          f"{cfg.eval.num_samples} samples, share of block evaluations reused {100 * share:.0f}%\n")
    print(markdown_table(["sampler", "feature FD", "FD / unskipped", "sample accuracy"],
                         [[name, f"{fd:.3f}", f"{ratio:.2f}", "" if acc is None else f"{100 * acc:.1f}%"]
                          for name, fd, ratio, acc in rows], "lrrr"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("table", help="the table over analysed runs")
    t.add_argument("analyses", nargs="+", metavar="LABEL=GLOB", help="a row: a label and the analysis folders it reads")
    c = sub.add_parser("compare", help="the old and new schedules and the fixed cache on one run")
    c.add_argument("run")
    c.add_argument("overrides", nargs="*")
    c.add_argument("--device", default="auto")
    a = p.parse_args()
    if a.what == "compare":
        return compare(a.run, a.overrides, a.device)
    print(markdown_table(["sampler", "analyses", "unskipped FD", "fixed cache: FD ratio (blocks)",
                          "step-aware, same share: FD ratio", "share reused"], [table_cells(x) for x in a.analyses], "lrlllr"))


if __name__ == "__main__":
    main()
