"""The same `genlab bench` under two source trees, side by side on one machine: a restructure must not cost speed.
Each measurement is its own cold process (PYTHONPATH=<tree>) and the trees alternate (old, new, old, new, ...), so
drift in clocks or temperature hits both; one row per (bench, tree): img/s of every repeat, the best, the best
relative to the first tree.

    python benchmarks/compare_trees.py --tree new=src --tree old=.baseline/src \
        --bench "bench_dit_b2" --bench "mnist_flow train.graph_step=true" --repeats 2
"""
from __future__ import annotations

import argparse
import os

from common import genlab_bench, genlab_env

from genlab.core.tables import markdown_row, markdown_table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH of a src folder (the first is the reference)")
    p.add_argument("--bench", action="append", required=True, help="a preset and its overrides, as `genlab bench` takes them")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    a = p.parse_args()
    trees = [t.split("=", 1) for t in a.tree]
    head = ["bench", "tree", "device", "img/s (each cold process)", "best", f"vs {trees[0][0]}"]
    print(markdown_table(head, [], "llllrr"), flush=True)
    rows = []
    for b in a.bench:
        got = {name: [] for name, _ in trees}
        for _ in range(a.repeats):
            for name, path in trees:
                res = genlab_bench(b.split(), a.steps, a.warmup, env=genlab_env(os.path.abspath(path)))
                if "error" in res:
                    raise SystemExit(f"{path}: {b} failed:\n{res['output']}")
                got[name].append(res["samples_per_s"])
        ref = max(got[trees[0][0]])
        for name, _ in trees:
            vals = got[name]
            rows.append([f"`{b}`", name, res["device"], " / ".join(f"{v:,.0f}" for v in vals), f"{max(vals):,.0f}",
                         f"{max(vals) / ref:.3f}"])
            print(markdown_row(rows[-1]), flush=True)
    print(markdown_table(head, rows, "llllrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
