"""CUDA-event timing shared by the kernel benchmark scripts (imported by path: scripts run from benchmarks/)."""
from __future__ import annotations

import statistics

import torch


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
