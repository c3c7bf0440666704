"""What a training step costs, measured on the CPU (issues 18 and 33; the bytes do not depend on the device).

    PYTHONPATH=src python benchmarks/step_costs.py activations bench_dit_b2 --batches 2 4 --scale-to 256
    PYTHONPATH=src python benchmarks/step_costs.py optim-state --preset mnist_flow model.size=B model.patch_size=2
    PYTHONPATH=src python benchmarks/step_costs.py shampoo [--device cuda --layers 48]   # default: CPU, 24 x Linear(768)

`activations`: the bytes autograd saves for backward in one training step (genlab.runtime.saved_tensors) and what
COAT-style FP8 storage of them would save, at two small batches, fitted as fixed + per-sample x batch and scaled to
--scale-to. The step is the trainer's (genlab bench's BenchStep), eager (train.compile=off: inductor's partitioner saves
less, so this is the eager upper bound), in the config's precision (bf16 autocast on the CPU keeps the same ops in
fp32 as on CUDA except where their autocast lists differ). `optim-state`: the state of every AdamW storage format
after one step, measured by walking optimizer.state (genlab.optim.state.state_bytes, the `optim_state_mib` metric).
`shampoo`: where Shampoo's step time goes (2.0 s a step at DiT-B/2 width on an H100, against 0.07-0.36 s for the other
optimizers): genlab's `shampoo` entry on a stack of Linear layers, plain steps against one step that recomputes the
preconditioners (every optim.precondition_every steps), the latter profiled.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats

import torch
from common import wall_ms

from genlab.config.tree import OptimConfig, load_config
from genlab.core.tables import markdown_row, markdown_table
from genlab.families.build import build_model_and_method
from genlab.lab.bench import BenchStep
from genlab.optim.build import build_optimizer
from genlab.optim.state import state_bytes
from genlab.runtime.saved_tensors import FP8_GROUP, at_batch, fit_per_sample, measure_saved

MIB = 2 ** 20
OPTIMIZERS = ["adamw", "adamw8bit", "adamw4bit", "adamw_fp8", "adamw_coat"]
MNIST = {"kind": "image", "image_size": 28, "channels": 1, "num_classes": 10}  # data shape without the data folder


def saved_at(preset, overrides, batch):
    cfg = load_config(preset, [*overrides, f"train.batch_size={batch}", "train.compile=off", "train.device=cpu",
                               "train.grad_accum=1"])
    bs = BenchStep(cfg)
    bs.step()  # the first step builds lazy state (optimizer moments); the second is measured
    return measure_saved(bs.step, params=bs.train_step.model.parameters())


def activations(a):
    saved = [saved_at(a.preset, a.overrides, b) for b in a.batches]
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


def optim_state(a):
    cfg = load_config(a.preset, a.overrides)
    model, _ = build_model_and_method(cfg, MNIST)
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"{a.preset} {' '.join(a.overrides)}: {n / 1e6:.1f} M trainable parameters, fp32\n")
    print(markdown_table(["optimizer", "state MiB", "bytes / parameter", "vs adamw"], [], "lrrr"))
    base = None
    for name in a.optims.split(","):
        torch.manual_seed(0)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt = build_optimizer(model, load_config(a.preset, [*a.overrides, f"optim.name={name}"]).optim)
        opt.step()  # the state exists after the first step (torchao compiles each shape here: minutes on a CPU)
        b = state_bytes(opt)
        base = base or b
        print(markdown_row([name, f"{b / 2**20:.1f}", f"{b / n:.3f}", f"{b / base:.3f}"]), flush=True)
        del opt


def shampoo(a):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width) for _ in range(a.layers)]).to(a.device)
    # precondition_every 0 = every 10 steps, the first at step 10
    opt = build_optimizer(model, OptimConfig(name="shampoo", lr=3e-4))
    x = torch.randn(64, a.width, device=a.device)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    for _ in range(10):  # steps 1-10 (step 10 computes the first preconditioners)
        step()
    plain = sorted(wall_ms(step, 1, 0, a.device) / 1e3 for _ in range(9))  # steps 11-19
    prof = cProfile.Profile()
    recompute = wall_ms(lambda: prof.runcall(step), 1, 0, a.device) / 1e3  # step 20: recomputes the inverse roots
    stats = pstats.Stats(prof)
    rows = {f"{k[0].rsplit('/', 1)[-1]}:{k[2]}": v[3] for k, v in stats.stats.items()}  # cumulative seconds
    print(markdown_table(["step", f"seconds ({a.layers} x Linear({a.width}, {a.width}), {a.device})"],
                         [["plain step (median of 9)", f"{plain[4]:.3f}"],
                          ["step that recomputes the preconditioners", f"{recompute:.3f}"]]))
    inside = [n for n in sorted(rows, key=rows.get, reverse=True) if any(w in n for w in (
        "compute_pre_conditioners", "compute_power_schur_newton", "matrix_power", "power_iteration", "preconditioned_grad",
        "add_statistics"))]
    print("\n" + markdown_table(["inside the recomputing step", "cumulative s", "share"],
                                [[n, f"{rows[n]:.3f}", f"{rows[n] / recompute:.0%}"] for n in inside], "lrr"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    act, opt, sham = sub.add_parser("activations"), sub.add_parser("optim-state"), sub.add_parser("shampoo")
    act.add_argument("preset")
    act.add_argument("--batches", type=int, nargs=2, default=[2, 4])
    act.add_argument("--scale-to", type=int, default=256)
    act.add_argument("--group", type=int, default=FP8_GROUP, help="elements per fp32 scale in the FP8 form")
    opt.add_argument("--preset", default="mnist_flow")
    opt.add_argument("--optims", default=",".join(OPTIMIZERS))
    for p in (act, opt):
        p.add_argument("overrides", nargs="*")
    sham.add_argument("--device", default="cpu")
    sham.add_argument("--layers", type=int, default=24)
    sham.add_argument("--width", type=int, default=768)
    a = ap.parse_args()
    {"activations": activations, "optim-state": optim_state, "shampoo": shampoo}[a.what](a)


if __name__ == "__main__":
    main()
