"""DiT training throughput on synthetic latents: the foundation issue's benchmark.

Each configuration runs `genlab bench` in its own process (compiled models in one process share
dynamo's recompile budget and would silently fall back to eager), then one markdown table is printed.

    python benchmarks/bench_dit.py                 # DiT-B/2 bs256 and DiT-XL/2 bs64, bf16, eager and compiled
    python benchmarks/bench_dit.py --quick         # CPU smoke run of the same script at tiny size
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from genlab.core.tables import markdown_table  # noqa: E402

# (label, preset, overrides): 32x32x4 latents (256 tokens at patch 2), 1000 classes
CONFIGS = [
    ("DiT-B/2 bs256 bf16 eager", "bench_dit_b2", ["train.compile=off"]),
    ("DiT-B/2 bs256 bf16 compile", "bench_dit_b2", ["train.compile=model"]),
    ("DiT-XL/2 bs64 bf16 eager", "bench_dit_xl2", ["train.batch_size=64", "train.compile=off"]),
    ("DiT-XL/2 bs64 bf16 compile", "bench_dit_xl2", ["train.batch_size=64", "train.compile=model"]),
]
QUICK = ["model.size=tiny", "train.batch_size=8", "train.device=cpu", "train.precision=fp32", "train.compile=off"]


def run_one(preset, overrides, steps, warmup):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "genlab", "bench", preset, *overrides, "--steps", str(steps),
               "--warmup", str(warmup), "--json", str(out)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0 or not out.exists():
            return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
        return json.loads(out.read_text())


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="tiny CPU run that checks the script works")
    args = p.parse_args()
    rows = []
    for label, preset, ov in CONFIGS[:1] if args.quick else CONFIGS:
        res = run_one(preset, ov + (QUICK if args.quick else []), 3 if args.quick else args.steps,
                      1 if args.quick else args.warmup)
        rows.append((label, res))
    print(markdown_table(["config", "img/s", "step ms", "fwd / bwd / opt ms", "MFU", "peak mem GiB"],
                         [cells(label, r) for label, r in rows]))


def cells(label: str, r: dict) -> list[str]:
    if "error" in r:
        return [label, f"failed: {r['error']}", "", "", "", ""]
    split = " / ".join(fmt(r.get(k), ".1f") for k in ("fwd_ms", "bwd_ms", "opt_ms"))
    mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    return [label, fmt(r.get("samples_per_s"), ".0f"), fmt(r.get("step_ms"), ".1f"), split, mfu,
            fmt(r.get("peak_mem_gib"), ".2f")]


if __name__ == "__main__":
    main()
