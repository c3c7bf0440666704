"""Every GPU test, split over the visible GPUs (one pytest process per GPU, items k, k + n, ...), with a result per test
even when a limit stops a stream: each stream runs `pytest -v` and its lines are read as they come.

    python benchmarks/gpu_tests.py                        # -m gpu over tests/, one stream per visible GPU
    python benchmarks/gpu_tests.py --limit 280 --per-test 150 -- tests/integration/test_gpu.py -k graph_step
    python benchmarks/gpu_tests.py --streams 2 --marker "" -- tests/test_foo.py   # CPU: two plain processes
    python benchmarks/gpu_tests.py --retry-alone 200      # then each failed test once more, alone in its own process

Prints (and writes to --out) a markdown table (stream, reached, passed, failed, skipped, stopped in) and the failed /
not-reached ids; exit 0 only when every selected test ran and none failed. --retry-alone S reruns each failed test in
a process of its own (GPU 0) within S more seconds, and lists which passed alone (a compile that outran its per-test
limit on a loaded host does); exit 0 then also when every failure passed alone. Streams run `python -m pytest` of this
interpreter with PYTHONPATH=src, as the suites do.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from common import REPO, genlab_env, report as write_report

from genlab.core.tables import markdown_table
from genlab.lab.sweep.runner import _stop

OUTCOME = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")


def selection(marker: str, args: list[str]) -> list[str]:
    return [*(["-m", marker] if marker else []), *(args or [str(REPO / "tests")])]


def collect(marker: str, args: list[str], env: dict) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *selection(marker, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    ids = [line.strip() for line in r.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if r.returncode not in (0, 5) or (not ids and r.returncode != 5):
        sys.exit(f"gpu_tests.py: collection failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return ids


def run_stream(k: int, n: int, sel: list[str], ids: list[str], gpu: int | None, env: dict, limit: float,
               per_test: int | None, log: Path, only: str | None = None) -> dict:
    """pytest -v over the selection's items k, k + n, ... (this module as a plugin picks them: the same items as
    `ids`; `only`: that one test id) on one GPU, stopped (SIGTERM, then SIGKILL) at `limit` seconds; outcomes read per
    line."""
    # unbuffered: to a pipe, Python block-buffers stdout, so a stream stopped by the limit can lose its last lines
    # (three H200 streams on 2026-11-28 left empty logs after 460 s; buffering or a hang in collection, not known)
    env = dict(env, GENLAB_TEST_STREAM=f"{k}/{n}", PYTHONUNBUFFERED="1", **({"GENLAB_TEST_ONLY": only} if only else {}),
               **({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {}))
    timeout = ["--timeout", str(per_test)] if per_test else []
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "gpu_tests_plugin", "-W", "ignore", *timeout,
           *sel]
    outcomes: dict[str, str] = {}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        timer = threading.Timer(limit, lambda: _stop(proc, signal.SIGTERM, 10))  # pytest stops at once
        timer.start()
        try:
            for line in proc.stdout:
                f.write(line)
                m = OUTCOME.match(line.strip())
                # -v names a test by its path from the current folder, the collection by its path from the rootdir
                hit = m and next((i for i in ids if m.group(1) == i or m.group(1).endswith("/" + i)), None)
                if hit:
                    outcomes[hit] = m.group(2)
        finally:
            timer.cancel()
            proc.wait()
    missing = [i for i in ids if i not in outcomes]
    return {"stream": k, "gpu": gpu, "ids": ids, "outcomes": outcomes, "stopped_in": missing[0] if missing else None,
            "log": str(log)}


def failed_ids(results: list[dict]) -> list[str]:
    return [i for r in results for i, v in r["outcomes"].items() if v in ("FAILED", "ERROR")]


def report(results: list[dict], alone: dict | None = None) -> tuple[str, bool]:
    """The streams' table and lists; `alone`: failed id -> its outcome when rerun alone."""
    cells, failed, missing = [], failed_ids(results), []
    for r in results:
        out = r["outcomes"]
        count = {s: sum(v == s for v in out.values()) for s in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
        cells.append([f"{r['stream']} ({'-' if r['gpu'] is None else r['gpu']})", len(r["ids"]), len(out), count["PASSED"],
                      count["FAILED"] + count["ERROR"], count["SKIPPED"], r["stopped_in"] or "-"])
        missing += [i for i in r["ids"] if i not in out]
    total = sum(len(r["ids"]) for r in results)
    reached = sum(len(r["outcomes"]) for r in results)
    lines = [markdown_table(["stream (GPU)", "tests", "reached", "passed", "failed", "skipped", "stopped in"], cells,
                            "lrrrrrl"), "", f"{reached} of {total} tests reached; {len(failed)} failed; {len(missing)} not reached."]
    lines += [f"- failed: {i}" for i in failed] + [f"- not reached: {i}" for i in missing]
    if alone is not None:
        lines += [f"- rerun alone: {i}: {alone.get(i, 'not rerun (no time left)')}" for i in failed]
        failed = [i for i in failed if alone.get(i) != "PASSED"]
    return "\n".join(lines), not failed and not missing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--marker", default="gpu", help="pytest -m expression of the selection (default: gpu; '' for none)")
    p.add_argument("--streams", type=int, default=0, help="processes (default: one per visible GPU, at least 1)")
    p.add_argument("--limit", type=float, default=540, help="seconds before a stream is stopped (default: 540)")
    p.add_argument("--per-test", type=int, default=None, help="pytest-timeout per test, seconds (needs pytest-timeout)")
    p.add_argument("--retry-alone", type=float, default=0, metavar="S",
                   help="rerun each failed test alone in its own process, within S more seconds (default: 0, none)")
    p.add_argument("--out", default=None, help="also write the table to this markdown file; stream logs beside it")
    p.add_argument("pytest_args", nargs="*", help="after --: paths and options of the selection (default: tests)")
    args = p.parse_args(argv)
    if args.streams < 0 or args.limit <= 0:
        p.error("--streams must be >= 0 and --limit > 0")
    env = genlab_env(PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO / "benchmarks")])  # gpu_tests_plugin.py as the streams' plugin
    ids = collect(args.marker, args.pytest_args, env)
    gpus = torch.cuda.device_count()
    n = max(1, min(args.streams or gpus or 1, len(ids) or 1))
    logs = Path(args.out).parent if args.out else Path(os.environ.get("TMPDIR", "/tmp"))
    logs.mkdir(parents=True, exist_ok=True)
    sel = selection(args.marker, args.pytest_args)
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda k: run_stream(k, n, sel, ids[k::n], k % gpus if gpus else None, env, args.limit,
                                                     args.per_test, logs / f"gpu_tests_stream{k}.log"), range(n)))
    alone = None
    if args.retry_alone > 0:
        alone, deadline = {}, time.monotonic() + args.retry_alone
        for i in failed_ids(results):
            if time.monotonic() >= deadline:
                break
            r = run_stream(0, 1, sel, [i], 0 if gpus else None, env, deadline - time.monotonic(), args.per_test,
                           logs / f"gpu_tests_alone{len(alone)}.log", only=i)
            alone[i] = r["outcomes"].get(i, "stopped by the limit")
    text, ok = report(results, alone)
    write_report([text], args.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
