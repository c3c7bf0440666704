"""Helpers shared by the benchmark scripts (imported by path: a script's own folder is on sys.path). Importing it puts
this tree's src/ first on sys.path, so a script measures the tree it sits in."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402


def sync(device=None):
    if torch.device(device or "cpu").type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "CPU"


def wall_ms(fn, reps: int, warmup: int = 1, device=None, seconds: float = 0.0) -> float:
    """Mean wall-clock ms per call of `reps` calls (at least; as many as fit in `seconds` when given) after `warmup`
    untimed ones, synchronised around the timed loop."""
    for _ in range(warmup):
        fn()
    sync(device)
    n, t0 = 0, time.perf_counter()
    while n < reps or time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    sync(device)
    return 1e3 * (time.perf_counter() - t0) / n


def cuda_timed(fn, reps: int = 20, warmup: int = 5) -> tuple[float, float]:
    """(median ms per call over `reps` calls timed one by one with CUDA events, peak GiB allocated above the
    memory in use before the timed calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**30


def genlab_env(src=REPO / "src", **extra) -> dict:
    """os.environ with `src` first on PYTHONPATH: a `genlab` subprocess runs that tree."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])), **extra)


def genlab_bench(items, steps: int, warmup: int, *options, env=None, echo=False) -> dict:
    """`genlab bench ITEMS --json` in its own (cold) process: the result, or {"error": the last stderr line, "output":
    the tails of stdout and stderr}. echo: print those tails either way."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        r = subprocess.run([sys.executable, "-m", "genlab", "bench", *items, "--steps", str(steps), "--warmup", str(warmup),
                            "--json", str(out), *options], env=env or genlab_env(), capture_output=True, text=True)
        if echo:
            print(r.stdout[-4000:], r.stderr[-2000:], flush=True)
        if r.returncode != 0 or not out.exists():
            return {"error": ([x for x in r.stderr.strip().splitlines() if x.strip()] or ["failed"])[-1][:160],
                    "output": r.stdout[-2000:] + r.stderr[-2000:]}
        return json.loads(out.read_text())


def error_cell(e: BaseException, width: int = 80) -> str:
    """An exception as one table cell: a row that cannot run here (no CUDA, OOM, a backend refusing the shape)."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:width]}"


def report(lines, out=None):
    """Print the report's lines, and write them to `out` when given."""
    text = "\n".join(lines)
    print(text, flush=True)
    if out:
        Path(out).write_text(text + "\n")
