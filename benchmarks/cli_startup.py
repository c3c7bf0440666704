"""CLI start-up time: wall seconds of `python -m genlab ...` commands that end before any training (median of N).

Every test that drives the CLI and every one-line config error pays this, so it is worth watching. Also prints
whether importing the trainer pulls in torch._dynamo (about 2 s on a 2-core CPU), which it should not.

    python benchmarks/cli_startup.py            # 5 repeats
    python benchmarks/cli_startup.py --repeats 9
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genlab.core.tables import markdown_table  # noqa: E402

COMMANDS = [
    ["--version"],
    ["train", "model.depht=3"],  # a config error: exit 2 with one line
    ["list"],
]


def wall(args) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "genlab", *args], capture_output=True)
    return time.perf_counter() - t


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    probe = "import sys, genlab.training.trainer; print('torch._dynamo' in sys.modules)"
    dynamo = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
    print(f"importing genlab.training.trainer imports torch._dynamo: {dynamo}\n")
    print(markdown_table(["command", "median s", "min s"], [row(cmd, args.repeats) for cmd in COMMANDS]))


def row(cmd: list[str], repeats: int) -> list[str]:
    times = [wall(cmd) for _ in range(repeats)]
    return [f"genlab {' '.join(cmd)}", f"{statistics.median(times):.2f}", f"{min(times):.2f}"]


if __name__ == "__main__":
    main()
