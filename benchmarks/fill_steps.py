"""Train for about S seconds: `genlab train` with train.steps sized from a measured step time (a probe run's
summary.json, or `genlab bench` of the same config first with --bench), so that its schedule ends when the time is up;
prints the run's summary.json last (the row of a suite's table). Without --seconds (or with an empty one) it trains
the steps it was given.

    python benchmarks/fill_steps.py --bench 40 --seconds 170 --startup 50 --factor 1.1 -- mnist_flow data.path=... \\
        train.out_dir=OUT train.name=run
    python benchmarks/fill_steps.py --json PROBE/summary.json --key step_time --seconds 360 -- pong_world ...
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def steps(a, out_dir: Path) -> int | None:
    """(seconds - startup) / (factor x step seconds), a multiple of --multiple, at least --min; None: not sized."""
    if not a.seconds.strip() or a.seconds.strip() == "0":
        return None
    path = Path(a.json or out_dir / "bench.json")
    if a.bench:  # genlab bench ignores the run's log.* and eval.* keys
        subprocess.run([sys.executable, "-m", "genlab", "bench", *a.train, "--steps", str(a.bench), "--warmup",
                        str(a.warmup), "--json", str(path)], stdout=sys.stderr)
    step = json.loads(path.read_text()).get(a.key) if path.exists() else None
    if step is None and a.default is None:
        sys.exit(f"fill_steps.py: no {a.key} in {path} (and no --default)")
    step_s = float(a.default if step is None else step) * a.unit
    n = max(a.min, int((float(a.seconds) - a.startup) / (a.factor * step_s)) // a.multiple * a.multiple)
    print(f"fill_steps.py: step {step_s * 1e3:.1f} ms -> train.steps={n} for {a.seconds} s", file=sys.stderr)
    return n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="the measured step time's JSON file (with --bench: where bench writes it)")
    p.add_argument("--bench", type=int, default=0, metavar="N", help="first time N steps with genlab bench")
    p.add_argument("--warmup", type=int, default=15, help="--bench's untimed steps")
    p.add_argument("--key", default="step_ms", help="the step time's key (step_ms of genlab bench, step_time of a summary)")
    p.add_argument("--unit", type=float, default=None, help="seconds per unit of the key (default: 0.001 for step_ms)")
    p.add_argument("--seconds", default="", help="the training time to fill")
    p.add_argument("--startup", type=float, default=0.0, help="seconds of start-up and compilation to leave out")
    p.add_argument("--factor", type=float, default=1.0, help="a training step costs this many measured steps")
    p.add_argument("--multiple", type=int, default=1)
    p.add_argument("--min", type=int, default=1)
    p.add_argument("--default", type=float, default=None, help="the step time when the JSON has none")
    p.add_argument("train", nargs="+", help="after --: genlab train's preset and overrides (train.out_dir, train.name)")
    a = p.parse_args(argv)
    a.unit = a.unit or (0.001 if a.key.endswith("_ms") else 1.0)
    ov = dict(x.split("=", 1) for x in a.train if x.startswith(("train.out_dir=", "train.name=")))
    out_dir = Path(ov.get("train.out_dir", "runs"))
    n = steps(a, out_dir)
    args = a.train if n is None else [x for x in a.train if not x.startswith("train.steps=")] + [f"train.steps={n}"]
    rc = subprocess.run([sys.executable, "-m", "genlab", "train", *args]).returncode
    summary = out_dir / ov.get("train.name", "") / "summary.json"
    if summary.exists():
        print(json.dumps(json.loads(summary.read_text())))
    return rc


if __name__ == "__main__":
    sys.exit(main())
