"""Does the loader keep up? Batches/s of each image loader path on this machine against a compute stand-in, or (--text)
streaming text preparation and the token loader.

    python benchmarks/bench_loader.py --device cuda --size 32 --channels 3 --n 50000 --batch 256 [--work-ms 20]
    python benchmarks/bench_loader.py --text --mb 50 --files 4 --tokenizers byte,char,gpt2 --workers 1,2

Images: the dataset resident on the device (gather by index there), and the host path (a memory-mapped dataset gathered
by background threads) with and without pinned memory and prefetch; run on the GPU machine to decide the defaults
(data.on_device, data.pin_memory, data.prefetch). --text: throughput and peak memory of `genlab data prepare text` on
the embedded Tiny Shakespeare excerpt repeated to --mb megabytes over --files files, and the memmap token loader's batch
time over the result. Each (tokenizer, workers) pair runs in its own process, so peak RSS is that run's alone: the main
process (reader, writer, hasher; VmHWM) and the largest worker (forked: pages shared with the main process count in
both).
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

import numpy as np
import torch
from common import wall_ms

from genlab.core.tables import markdown_row, markdown_table
from genlab.data.formats import read_image_dataset, write_image_dataset
from genlab.data.loader import ImageLoader
from genlab.data.text import prepare_text, read_corpus, read_token_dataset
from genlab.data.token_loader import TokenLoader


def measure(loader, device, steps, work_ms):
    """Batches/s of `loader` while the device runs `work_ms` of matmuls per step (a model stand-in)."""
    a = torch.randn(2048, 2048, device=device)
    per = max(1, int(work_ms / wall_ms(lambda: a @ a, 5, 0, device))) if work_ms > 0 else 0  # matmuls in work_ms
    for _ in range(3):
        loader.next()
    loader.wait_time = 0.0

    def step():
        loader.next()["image"].sum()
        for _ in range(per):
            a @ a
    dt = wall_ms(step, steps, 0, device) * steps / 1e3
    return steps / dt, loader.wait_time / dt


def images(args):
    device = torch.device(args.device)
    rng = np.random.default_rng(0)
    variants = [("resident on device", dict(on_device="yes"))] + [
        (f"host, prefetch {k}, {'pinned' if pin == 'yes' else 'not pinned'}", dict(on_device="no", prefetch=k, pin_memory=pin))
        for k in (1, 4) for pin in ("no", "yes")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        imgs = rng.integers(0, 256, (args.n, args.size, args.size, args.channels), dtype=np.uint8)
        write_image_dataset(f"{tmp}/d", imgs, rng.integers(0, 10, args.n), [str(i) for i in range(10)], source="bench")
        data = read_image_dataset(f"{tmp}/d", verify=False)
        for name, kw in variants:
            ld = ImageLoader(data, args.batch, device, seed=0, **kw)
            bps, wait = measure(ld, device, args.steps, args.work_ms)
            ld.close()
            rows.append([name, f"{bps:.1f}", f"{bps * args.batch:.0f}", f"{wait:.3f}"])
    print(markdown_table([f"loader path ({args.device}, {args.n}x{args.size}x{args.size}x{args.channels}, batch "
                          f"{args.batch}, work {args.work_ms} ms/step)", "batches/s", "img/s", "data-wait fraction"], rows))


def vm_hwm_mb() -> float:
    """This process's peak RSS since exec (ru_maxrss would include the launching process's RSS at fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prepare_once(src: str, out: str, tokenizer: str, workers: int) -> dict:
    t0 = time.perf_counter()
    prepare_text(src=[str(p) for p in sorted(Path(src).glob("*.txt"))], out=out, tokenizer=tokenizer, workers=workers)
    dt = time.perf_counter() - t0
    meta = json.loads((Path(out) / "meta.json").read_text())
    return {"seconds": dt, "tokens": meta["train_tokens"] + meta["val_tokens"], "rss_main_mb": vm_hwm_mb(),
            "rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def token_batch_ms(out: str, seq_len: int, batch: int, steps: int = 200) -> float:
    """Mean host time of one batch from the memmap (on_device=no), prefetch on: what a step would wait."""
    loader = TokenLoader(read_token_dataset(out, seq_len, verify=False).train, seq_len, batch, "cpu", on_device="no")
    for _ in range(5):
        loader.next()
    loader.wait_time = 0.0
    for _ in range(steps):
        loader.next()
    loader.close()
    return 1e3 * loader.wait_time / steps


def text(args):
    corpus, per_file = read_corpus(), args.mb * 10**6 // args.files
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for i in range(args.files):
            (src / f"part{i:03d}.txt").write_text((corpus * (per_file // len(corpus) + 1))[:per_file], encoding="utf-8")
        print(markdown_table(["tokenizer", "workers", "MB of text", "seconds", "MB/s", "tokens", "peak RSS main (MB)",
                              "peak RSS worker (MB)", "memmap batch 64x1024 (ms)"], [], "l" * 9))
        for tok in args.tokenizers.split(","):
            for w in args.workers.split(","):
                out = Path(tmp) / f"{tok}_{w}"
                r = subprocess.run([sys.executable, __file__, "--prepare-once", str(src), str(out), tok, w],
                                   capture_output=True, text=True)
                if r.returncode:
                    print(markdown_row([tok, w, f"failed: {r.stderr.strip().splitlines()[-1]}"]))
                    continue
                res = json.loads(r.stdout.strip().splitlines()[-1])
                print(markdown_row([tok, w, args.mb, f"{res['seconds']:.1f}", f"{args.mb / res['seconds']:.1f}", f"{res['tokens']:,}",
                                    f"{res['rss_main_mb']:.0f}", f"{res['rss_worker_mb']:.0f}",
                                    f"{token_batch_ms(str(out), 1024, 64):.2f}"]), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, default=50000)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--work-ms", type=float, default=0.0, help="simulated compute per step (ms)")
    p.add_argument("--text", action="store_true", help="text preparation and the token loader instead")
    p.add_argument("--mb", type=int, default=50, help="--text: megabytes of text")
    p.add_argument("--files", type=int, default=4, help="--text: files they are spread over")
    p.add_argument("--tokenizers", default="byte,char,gpt2", help="--text")
    p.add_argument("--workers", default="1,2", help="--text: comma list of genlab data prepare's worker counts")
    p.add_argument("--prepare-once", nargs=4, metavar=("SRC", "OUT", "TOKENIZER", "WORKERS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.prepare_once:
        print(json.dumps(prepare_once(*args.prepare_once[:3], int(args.prepare_once[3]))))
    else:
        (text if args.text else images)(args)


if __name__ == "__main__":
    main()
