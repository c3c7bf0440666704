"""The fixed cache against the step-aware schedule, over runs already analysed (`genlab analyze RUN --what cache`):
per analysis folder the unskipped FD and both caches' FD ratios, then mean ± std over the folders of each sampler
(analyses whose search kept no block have no cached rows and are left out).

    python benchmarks/cache_schedule_table.py heun=RUNS/cache_s*/analysis euler=RUNS/cache_s*/analysis_euler
"""
from __future__ import annotations

import glob
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genlab.core.tables import markdown_table  # noqa: E402


def _band(xs):
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f} (one draw)"


def main(args):
    print(markdown_table(["sampler", "analyses", "unskipped FD", "fixed cache: FD ratio (blocks)",
                          "step-aware, same share: FD ratio", "share reused"], [cells(arg) for arg in args], "lrlllr"))


def cells(arg: str) -> list:
    label, pattern = arg.split("=", 1)
    rows = [json.loads(open(f"{d}/analysis.json").read()) for d in sorted(glob.glob(pattern))]
    rows = [r for r in rows if "scheduled" in r.get("cache", {})]
    if not rows:
        return [label, 0, "", "", "", ""]
    fixed = [r["cache"]["fd_ratio"] for r in rows]
    stepped = [r["cache"]["scheduled"]["fd_ratio"] for r in rows]
    refs = " / ".join(f"{r['reference']['feature_fd']:.3f}" for r in rows)
    blocks = [",".join(map(str, r["cache"]["blocks"])) for r in rows]
    fixed_cells = ", ".join(f"{x:.3f} ({b})" for x, b in zip(fixed, blocks))
    stepped_cells = ", ".join(f"{x:.3f}" for x in stepped)
    shares = sorted({f"{r['cache']['block_evals_saved']:.0%}" for r in rows})  # a search's share differs by run
    return [label, len(rows), refs, f"{fixed_cells}; {_band(fixed)}", f"{stepped_cells}; {_band(stepped)}", ", ".join(shares)]


if __name__ == "__main__":
    main(sys.argv[1:])
