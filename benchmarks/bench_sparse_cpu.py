"""Sparse Transformer on a CPU (issue 16): one training step (forward + backward) of a small model on MNIST-sized
byte sequences (28x28x1 = 784 tokens), backend `dense` (masked SDPA over all n x n scores) vs `blocked` (the
segment forms: flash-style SDPA on runs / columns / run pairs, no n x n mask; fixed/summary stays masked).
`model.sparse_backend=auto` picks `blocked` on a CPU.

    python benchmarks/bench_sparse_cpu.py                  # dim 128, depth 4, 4 heads, batch 8
    python benchmarks/bench_sparse_cpu.py --batch 4 --iters 3
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from genlab.core.tables import markdown_row, markdown_table  # noqa: E402
from genlab.families.sparse.sparse_transformer import SparseSpec, SparseTransformer  # noqa: E402

ROWS = [("strided", "split"), ("strided", "interleaved"), ("fixed", "split"), ("fixed", "interleaved")]


def step_ms(model, idx, backend, iters):
    def step():
        model.zero_grad(set_to_none=True)
        model(idx, backend=backend).float().mean().backward()
    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t0) / iters * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"Sparse Transformer training step on CPU ({torch.get_num_threads()} threads), 784 tokens, dim 128, depth 4, "
          f"4 heads, batch {a.batch}, fp32, mean of {a.iters}\n")
    print(markdown_table(["pattern", "mode", "dense ms", "blocked ms", "speedup"], [], "llrrr"))
    for pattern, mode in ROWS:
        torch.manual_seed(0)
        model = SparseTransformer(SparseSpec(image_size=28, channels=1, dim=128, depth=4, heads=4, pattern=pattern, mode=mode))
        idx = torch.randint(0, 257, (a.batch, model.spec.seq_len))
        dense, blocked = (step_ms(model, idx, b, a.iters) for b in ("dense", "blocked"))
        print(markdown_row([pattern, mode, f"{dense:.0f}", f"{blocked:.0f}", f"{dense / blocked:.2f}x"]), flush=True)


if __name__ == "__main__":
    main()
