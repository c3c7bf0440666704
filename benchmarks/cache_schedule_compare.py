"""The step-aware cache schedule before and after session 25, on one trained run and the same noise: the pick by each
(evaluation, block) pair's single-step change (the old rule, reimplemented here as the baseline) against
`genlab.sampling.block_cache.step_schedule` (greedy on the drift a reuse adds), measured on each block's residual and on
the model's output (the output probe: one reuse's effect after the later blocks), all at the share of block
evaluations the fixed cache of the `half` pick saves, beside that fixed cache. Prints one markdown table.

    python benchmarks/cache_schedule_compare.py RUN [overrides ...]      # e.g. method.sampler=heun eval.sample_steps=10
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def least_change_schedule(change, share, depth):
    """The old rule: the pairs with the smallest single-step change, as many as `share` of the pass's block
    evaluations (evaluation 0 always computes)."""
    n = int(round(share * change.evaluations * depth))
    plan: dict[int, set[int]] = {}
    for k, i in sorted(change.at, key=lambda ki: (change.at[ki], ki))[:n]:
        plan.setdefault(k, set()).add(i)
    return {k: frozenset(v) for k, v in sorted(plan.items())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--device", default="auto")
    a = p.parse_args()
    from genlab.data import build_dataset
    from genlab.lab.analyze.run import HALF, Sampler, _cached_scores, _warm_up_and_pick
    from genlab.runs.load import _run_dir, load_run
    from genlab.runtime.parallel import unwrap
    from genlab.sampling.block_cache import forward_timer, step_schedule
    cfg, model, method, dev, _ = load_run(a.run, a.device, True, a.overrides)
    base = unwrap(model)
    method.cache_blocks = []
    cfg.eval.metrics = "accuracy,fd"
    sampler = Sampler(cfg, method, model, build_dataset(cfg.data), dev, _run_dir(a.run))
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
        plan = rule(change, share, depth)
        m = _cached_scores(sampler, base, ref, tm["seconds"], name, indices=[], schedule=plan,
                           period=measured.evaluations)
        rows.append((name, m["feature_fd"], m["fd_ratio"], m.get("sample_accuracy")))
    print(f"run {a.run}, overrides {' '.join(a.overrides) or '-'}, {measured.evaluations} evaluations per sample, "
          f"{cfg.eval.num_samples} samples, share of block evaluations reused {100 * share:.0f}%\n")
    from genlab.core.tables import markdown_table
    print(markdown_table(["sampler", "feature FD", "FD / unskipped", "sample accuracy"],
                         [[name, f"{fd:.3f}", f"{ratio:.2f}", "" if acc is None else f"{100 * acc:.1f}%"]
                          for name, fd, ratio, acc in rows], "lrrr"))


if __name__ == "__main__":
    main()
