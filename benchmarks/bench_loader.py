"""Does the loader keep up? Batches/s of each loader path on this machine, against a compute stand-in.

Paths: the dataset resident on the device (gather by index there), and the host path (a memory-mapped
dataset gathered by background threads) with and without pinned memory and prefetch. Run on the GPU
machine to decide the defaults (data.on_device, data.pin_memory, data.prefetch):

    python benchmarks/bench_loader.py --device cuda --size 32 --channels 3 --n 50000 --batch 256
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from common import sync, wall_ms

from genlab.core.tables import markdown_table
from genlab.data.formats import read_image_dataset, write_image_dataset
from genlab.data.loader import ImageLoader


def measure(loader, device, steps, work_ms):
    """Batches/s of `loader` while the device runs `work_ms` of matmuls per step (a model stand-in)."""
    a = torch.randn(2048, 2048, device=device)
    per = max(1, int(work_ms / wall_ms(lambda: a @ a, 5, 0, device))) if work_ms > 0 else 0  # matmuls in work_ms
    for _ in range(3):
        loader.next()
    sync(device)
    loader.wait_time = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        loader.next()["image"].sum()
        for _ in range(per):
            a @ a
    sync(device)
    dt = time.perf_counter() - t0
    return steps / dt, loader.wait_time / dt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--n", type=int, default=50000)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--work-ms", type=float, default=0.0, help="simulated compute per step (ms)")
    args = p.parse_args()
    device = torch.device(args.device)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        imgs = rng.integers(0, 256, (args.n, args.size, args.size, args.channels), dtype=np.uint8)
        write_image_dataset(f"{tmp}/d", imgs, rng.integers(0, 10, args.n), [str(i) for i in range(10)], source="bench")
        data = read_image_dataset(f"{tmp}/d", verify=False)
        rows = []
        variants = [("resident on device", dict(on_device="yes")),
                    ("host, prefetch 1, not pinned", dict(on_device="no", prefetch=1, pin_memory="no")),
                    ("host, prefetch 1, pinned", dict(on_device="no", prefetch=1, pin_memory="yes")),
                    ("host, prefetch 4, not pinned", dict(on_device="no", prefetch=4, pin_memory="no")),
                    ("host, prefetch 4, pinned", dict(on_device="no", prefetch=4, pin_memory="yes"))]
        for name, kw in variants:
            ld = ImageLoader(data, args.batch, device, seed=0, **kw)
            bps, wait = measure(ld, device, args.steps, args.work_ms)
            ld.close()
            rows.append((name, bps, bps * args.batch, wait))
    print(markdown_table([f"loader path ({args.device}, {args.n}x{args.size}x{args.size}x{args.channels}, batch "
                          f"{args.batch}, work {args.work_ms} ms/step)", "batches/s", "img/s", "data-wait fraction"],
                         [[name, f"{bps:.1f}", f"{ips:.0f}", f"{wait:.3f}"] for name, bps, ips, wait in rows]))


if __name__ == "__main__":
    main()
