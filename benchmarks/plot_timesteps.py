"""docs/timesteps.png: every training-time density (closed form, with a histogram of 200k draws on top), the step
schedules and the loss weightings, at their default parameters. genlab's convention: t=0 noise, t=1 data.

    PYTHONPATH=src python benchmarks/plot_timesteps.py [--out docs/timesteps.png]
"""
import argparse

import matplotlib.pyplot as plt
import torch

from genlab.config.tree import load_config
from genlab.families.image_flow.loss_weighting import min_snr
from genlab.families.image_flow.timesteps import DENSITIES, shift_time, timestep_sampler_registry
from genlab.sampling.samplers import time_grid


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/timesteps.png")
    args = ap.parse_args()
    plt.switch_backend("Agg")  # no display needed: the figure goes to a file
    cfg = load_config("digits_flow").method
    t = torch.linspace(1e-4, 1 - 1e-4, 2000, dtype=torch.float64)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ax = axes[0]
    for name, pdf in DENSITIES.items():
        draws = timestep_sampler_registry.get(name)(200_000, torch.Generator().manual_seed(0), "cpu", cfg)
        line, = ax.plot(t, pdf(t, cfg), lw=1.4, label=name)
        ax.hist(draws.numpy(), bins=100, range=(0, 1), density=True, histtype="step", lw=0.6, alpha=0.6,
                color=line.get_color())
    shifted = shift_time(torch.rand(200_000, generator=torch.Generator().manual_seed(0)), 3.0)
    # uniform t through t' = t / (a(1-t) + t): density a / (1 + (a-1) t')^2
    line, = ax.plot(t, 3.0 / (1 + 2.0 * t) ** 2, "k--", lw=1, label="uniform + time_shift=3")
    ax.hist(shifted.numpy(), bins=100, range=(0, 1), density=True, histtype="step", lw=0.6, alpha=0.6, color="k")
    ax.set_yscale("log")
    ax.set_ylim(0.05, 40)
    ax.set(xlabel="t  (0 = noise, 1 = data)", ylabel="density", title="training densities (lines) and draws (steps)")
    ax.legend(fontsize=7)
    ax = axes[1]
    n = 20
    for sched in ("uniform", "shifted", "linear_quadratic"):
        g = time_grid(n, schedule=sched, cfg=cfg)
        ax.plot(range(n + 1), g, "o-", ms=3, lw=1, label=sched + (f" (sample_shift={cfg.sample_shift:g})" if sched == "shifted" else ""))
    ax.set(xlabel="step i of 20", ylabel="t_i", title="sampler step schedules")
    ax.legend(fontsize=7)
    ax = axes[2]
    ax.plot(t, torch.ones_like(t), label="none")
    for g in (1.0, 5.0):
        cfg.snr_gamma = g  # the last use of cfg
        ax.plot(t, min_snr(t, cfg), label=f"min_snr, gamma={g:g}")
    ax.set(xlabel="t", ylabel="weight on |v_hat - v|^2", title="loss weighting w(t)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
