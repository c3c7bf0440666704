"""The same `genlab bench` under two source trees, side by side on one machine: a restructure must not cost speed.

    python benchmarks/compare_trees.py --tree new=src --tree old=.baseline/src \
        --bench "bench_dit_b2" --bench "mnist_flow train.graph_step=true" --repeats 2

Each measurement is its own cold process (PYTHONPATH=<tree>), the trees alternate (old, new, old, new, ...) so drift
in clocks or temperature hits both; prints one row per (bench, tree): img/s of every repeat, the best, and the best
relative to the first tree.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def bench_once(tree: str, items: list[str], steps: int, warmup: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        cmd = [sys.executable, "-m", "genlab", "bench", *items, "--steps", str(steps), "--warmup", str(warmup), "--json", f.name]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{tree}: {' '.join(items)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        return json.load(open(f.name))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH of a src folder (the first is the reference)")
    p.add_argument("--bench", action="append", required=True, help="a preset and its overrides, as `genlab bench` takes them")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    a = p.parse_args()
    trees = [t.split("=", 1) for t in a.tree]
    rows = ["| bench | tree | device | img/s (each cold process) | best | vs " + trees[0][0] + " |", "| --- | --- | --- | --- | ---: | ---: |"]
    for b in a.bench:
        items = b.split()
        got = {name: [] for name, _ in trees}
        dev = ""
        for _ in range(a.repeats):
            for name, path in trees:
                res = bench_once(path, items, a.steps, a.warmup)
                got[name].append(res["samples_per_s"])
                dev = res["device"]
        ref = max(got[trees[0][0]])
        for name, _ in trees:
            vals = got[name]
            rows.append(f"| `{b}` | {name} | {dev} | {' / '.join(f'{v:,.0f}' for v in vals)} | {max(vals):,.0f} | {max(vals) / ref:.3f} |")
        print("\n".join(rows[-len(trees):]), flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
