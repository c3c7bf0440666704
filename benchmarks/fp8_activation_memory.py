"""Activation memory of one training step and what COAT-style FP8 storage of it would save (issue 33), measured on
the CPU: the bytes autograd saves for backward (genlab.runtime.saved_tensors), at two small batches, fitted as
fixed + per-sample x batch and scaled to --scale-to. The step is the trainer's (genlab bench's BenchStep), eager
(train.compile=off: inductor's partitioner saves less, so this is the eager upper bound) in the config's precision
(bf16 autocast on the CPU keeps the same ops in fp32 as on CUDA except where their autocast lists differ).

    PYTHONPATH=src python benchmarks/fp8_activation_memory.py bench_dit_b2 --batches 2 4 --scale-to 256
"""
from __future__ import annotations

import argparse
import json

from genlab.config.tree import load_config
from genlab.lab.bench import BenchStep
from genlab.runtime.saved_tensors import FP8_GROUP, at_batch, fit_per_sample, measure_saved

MIB = 2 ** 20


def measure(preset, overrides, batch):
    cfg = load_config(preset, [*overrides, f"train.batch_size={batch}", "train.compile=off", "train.device=cpu",
                               "train.grad_accum=1"])
    bs = BenchStep(cfg)
    bs.step()  # the first step builds lazy state (optimizer moments); the second is measured
    return measure_saved(bs.step, params=bs.train_step.model.parameters())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("preset")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--batches", type=int, nargs=2, default=[2, 4])
    ap.add_argument("--scale-to", type=int, default=256)
    ap.add_argument("--group", type=int, default=FP8_GROUP, help="elements per fp32 scale in the FP8 form")
    a = ap.parse_args()
    saved = [measure(a.preset, a.overrides, b) for b in a.batches]
    fit = fit_per_sample(tuple(a.batches), tuple(saved), a.group)
    total, fp8 = at_batch(fit, a.scale_to)
    for b, s in zip(a.batches, saved):
        print(f"batch {b}: saved for backward {s.total / MIB:.1f} MiB by dtype "
              + ", ".join(f"{k} {v / MIB:.1f}" for k, v in sorted(s.bytes_by_dtype.items()))
              + f"; in FP8 {s.fp8_bytes(a.group) / MIB:.1f} MiB; parameters saved (not counted) {s.param_bytes / MIB:.1f} MiB")
    print(f"fit: {fit['per_sample'] / MIB:.2f} MiB per sample + {fit['fixed'] / MIB:.1f} MiB fixed "
          f"(FP8: {fit['fp8_per_sample'] / MIB:.2f} + {fit['fp8_fixed'] / MIB:.1f})")
    print(f"batch {a.scale_to}: {total / 2**30:.2f} GiB saved for backward, {fp8 / 2**30:.2f} GiB in FP8 "
          f"(group {a.group}): saves {(total - fp8) / 2**30:.2f} GiB ({1 - fp8 / total:.1%})")
    print(json.dumps({"preset": a.preset, "overrides": a.overrides, "batches": a.batches, "scale_to": a.scale_to,
                      "by_dtype": [s.bytes_by_dtype for s in saved], **fit, "total_at": total, "fp8_at": fp8}))


if __name__ == "__main__":
    main()
