"""Source trees side by side on one machine, each measurement its own cold process (PYTHONPATH=<tree>): a restructure
must cost neither training speed nor CLI start-up.

    python benchmarks/compare_trees.py --tree new=src --tree old=.baseline/src \
        --bench "bench_dit_b2" --bench "mnist_flow train.graph_step=true" --repeats 2
    python benchmarks/compare_trees.py --startup [--tree new=src --tree old=.baseline/src] [--repeats 5]

--bench: the same `genlab bench` under each tree, the trees alternating (old, new, old, new, ...) so that drift in
clocks or temperature hits both; one row per (bench, tree): img/s of every repeat, the best, the best relative to the
first tree. --startup: wall seconds of `python -m genlab ...` commands that end before any training (median and min of
--repeats; every test that drives the CLI and every one-line config error pays this), and whether importing the
trainer pulls in torch._dynamo (about 2 s on a 2-core CPU), which it should not.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from common import genlab_bench, genlab_env

from genlab.core.tables import markdown_row, markdown_table

STARTUP = [["--version"], ["train", "model.depht=3"], ["list"]]  # the second: a config error, exit 2 with one line


def startup(trees, repeats):
    rows = []
    for name, path in trees:
        env = genlab_env(os.path.abspath(path))
        probe = "import sys, genlab.training.trainer; print('torch._dynamo' in sys.modules)"
        dynamo = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env).stdout.strip()
        print(f"{name}: importing genlab.training.trainer imports torch._dynamo: {dynamo}")
        for cmd in STARTUP:
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "genlab", *cmd], capture_output=True, env=env)
                times.append(time.perf_counter() - t)
            rows.append([f"genlab {' '.join(cmd)}", name, f"{statistics.median(times):.2f}", f"{min(times):.2f}"])
    print("\n" + markdown_table(["command", "tree", "median s", "min s"], rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", help="NAME=PATH of a src folder (the first is the reference; default src)")
    p.add_argument("--bench", action="append", default=[], help="a preset and its overrides, as `genlab bench` takes them")
    p.add_argument("--startup", action="store_true", help="CLI start-up times instead of --bench")
    p.add_argument("--repeats", type=int, default=None, help="default: 2 (--bench), 5 (--startup)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    a = p.parse_args()
    trees = [t.split("=", 1) for t in a.tree or ["this=src"]]
    if a.startup:
        return startup(trees, a.repeats or 5) or 0
    if not a.bench:
        p.error("give --bench (or --startup)")
    head = ["bench", "tree", "device", "img/s (each cold process)", "best", f"vs {trees[0][0]}"]
    print(markdown_table(head, [], "llllrr"), flush=True)
    rows = []
    for b in a.bench:
        got = {name: [] for name, _ in trees}
        for _ in range(a.repeats or 2):
            for name, path in trees:
                res = genlab_bench(b.split(), a.steps, a.warmup, env=genlab_env(os.path.abspath(path)))
                if "error" in res:
                    raise SystemExit(f"{path}: {b} failed:\n{res['output']}")
                got[name].append(res["samples_per_s"])
        ref = max(got[trees[0][0]])
        for name, vals in got.items():
            rows.append([f"`{b}`", name, res["device"], " / ".join(f"{v:,.0f}" for v in vals), f"{max(vals):,.0f}",
                         f"{max(vals) / ref:.3f}"])
            print(markdown_row(rows[-1]), flush=True)
    print(markdown_table(head, rows, "llllrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
