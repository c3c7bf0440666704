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
    print("| command | median s | min s |")
    print("| --- | ---: | ---: |")
    for cmd in COMMANDS:
        times = [wall(cmd) for _ in range(args.repeats)]
        print(f"| genlab {' '.join(cmd)} | {statistics.median(times):.2f} | {min(times):.2f} |")


if __name__ == "__main__":
    main()
