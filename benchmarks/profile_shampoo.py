"""Where Shampoo's step time goes (issue 18: 2.0 s a step at DiT-B/2 width on an H100, against 0.07-0.36 s for the
other optimizers). Builds genlab's `shampoo` entry on a stack of Linear layers, times plain steps and one step that
recomputes the preconditioners (every optim.precondition_every steps), and profiles the latter.

    python benchmarks/profile_shampoo.py                  # CPU, 24 x Linear(768, 768), batch 64
    python benchmarks/profile_shampoo.py --device cuda --layers 48
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from genlab.config.tree import OptimConfig
from genlab.core.tables import markdown_table
from genlab.optim.build import build_optimizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=768)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width) for _ in range(a.layers)]).to(a.device)
    ocfg = OptimConfig(name="shampoo", lr=3e-4)  # precondition_every 0 = every 10 steps, the first at step 10
    opt = build_optimizer(model, ocfg)
    x = torch.randn(64, a.width, device=a.device)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if a.device != "cpu":
            torch.cuda.synchronize()

    def timed():
        t = time.perf_counter()
        step()
        return time.perf_counter() - t

    for _ in range(10):  # steps 1-10 (step 10 computes the first preconditioners)
        step()
    plain = [timed() for _ in range(9)]  # steps 11-19
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.runcall(step)  # step 20: recomputes the inverse roots
    recompute = time.perf_counter() - t
    stats = pstats.Stats(prof)
    rows = {f"{k[0].rsplit('/', 1)[-1]}:{k[2]}": v[3] for k, v in stats.stats.items()}  # cumulative seconds
    print(markdown_table(["step", f"seconds ({a.layers} x Linear({a.width}, {a.width}), {a.device})"],
                         [["plain step (median of 9)", f"{sorted(plain)[4]:.3f}"],
                          ["step that recomputes the preconditioners", f"{recompute:.3f}"]]))
    inside = [n for n in sorted(rows, key=rows.get, reverse=True) if any(w in n for w in (
        "compute_pre_conditioners", "compute_power_schur_newton", "matrix_power", "power_iteration", "preconditioned_grad",
        "add_statistics"))]
    print("\n" + markdown_table(["inside the recomputing step", "cumulative s", "share"],
                                [[n, f"{rows[n]:.3f}", f"{rows[n] / recompute:.0%}"] for n in inside], "lrr"))


if __name__ == "__main__":
    main()
