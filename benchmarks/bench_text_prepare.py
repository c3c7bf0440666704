"""Streaming text preparation: throughput and peak memory of `genlab data prepare text` on a generated corpus,
and the memmap token loader's batch time over the result.

The corpus is the embedded Tiny Shakespeare excerpt repeated to --mb megabytes over --files files. Each
(tokenizer, workers) pair runs in its own process, so peak RSS is that run's alone: the main process (reader,
writer, hasher; VmHWM) and the largest worker (forked: pages shared with the main process count in both).

    python benchmarks/bench_text_prepare.py --mb 50 --files 4 --tokenizers byte,char,gpt2 --workers 1,2
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO  # noqa: F401 - puts src/ on sys.path

from genlab.core.tables import markdown_row, markdown_table


def make_corpus(folder: Path, mb: int, files: int):
    from genlab.data.text import read_corpus
    text, per_file = read_corpus(), mb * 10**6 // files
    for i in range(files):
        (folder / f"part{i:03d}.txt").write_text((text * (per_file // len(text) + 1))[:per_file], encoding="utf-8")


def vm_hwm_mb() -> float:
    """This process's peak RSS since exec (ru_maxrss would include the launching process's RSS at fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_run(src: str, out: str, tokenizer: str, workers: int) -> dict:
    from genlab.data.text import prepare_text
    t0 = time.perf_counter()
    prepare_text(src=[str(p) for p in sorted(Path(src).glob("*.txt"))], out=out, tokenizer=tokenizer, workers=workers)
    dt = time.perf_counter() - t0
    meta = json.loads((Path(out) / "meta.json").read_text())
    return {"seconds": dt, "tokens": meta["train_tokens"] + meta["val_tokens"],
            "rss_main_mb": vm_hwm_mb(),
            "rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def loader_ms(out: str, seq_len: int, batch: int, steps: int = 200) -> float:
    """Mean host time of one batch from the memmap (on_device=no), prefetch on: what a step would wait."""
    from genlab.data.text import read_token_dataset
    from genlab.data.token_loader import TokenLoader
    data = read_token_dataset(out, seq_len, verify=False)
    loader = TokenLoader(data.train, seq_len, batch, "cpu", on_device="no")
    for _ in range(5):
        loader.next()
    loader.wait_time = 0.0
    for _ in range(steps):
        loader.next()
    loader.close()
    return 1e3 * loader.wait_time / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--tokenizers", default="byte,char,gpt2")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--one", nargs=4, metavar=("SRC", "OUT", "TOKENIZER", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_run(*args.one[:3], int(args.one[3]))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        make_corpus(src, args.mb, args.files)
        print(markdown_table(["tokenizer", "workers", "MB of text", "seconds", "MB/s", "tokens", "peak RSS main (MB)",
                              "peak RSS worker (MB)", "memmap batch 64x1024 (ms)"], [], "l" * 9))
        for tok in args.tokenizers.split(","):
            for w in args.workers.split(","):
                out = Path(tmp) / f"{tok}_{w}"
                r = subprocess.run([sys.executable, __file__, "--one", str(src), str(out), tok, w],
                                   capture_output=True, text=True)
                if r.returncode:
                    print(markdown_row([tok, w, f"failed: {r.stderr.strip().splitlines()[-1]}"]))
                    continue
                res = json.loads(r.stdout.strip().splitlines()[-1])
                ms = loader_ms(str(out), 1024, 64)
                print(markdown_row([tok, w, args.mb, f"{res['seconds']:.1f}", f"{args.mb / res['seconds']:.1f}", f"{res['tokens']:,}",
                                    f"{res['rss_main_mb']:.0f}", f"{res['rss_worker_mb']:.0f}", f"{ms:.2f}"]), flush=True)


if __name__ == "__main__":
    main()
