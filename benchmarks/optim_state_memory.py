"""Optimizer-state memory of every AdamW storage format on one genlab model, measured by walking optimizer.state
(genlab.optim.state.state_bytes, the `optim_state_mib` metric) after one step. A CPU-measurable fact: the bytes do
not depend on the device. Prints a markdown table.

    PYTHONPATH=src python benchmarks/optim_state_memory.py --preset mnist_flow model.size=B model.patch_size=2
"""
from __future__ import annotations

import argparse

import torch

from genlab.config.tree import load_config
from genlab.core.tables import markdown_row, markdown_table
from genlab.optim.build import build_optimizer
from genlab.optim.state import state_bytes
from genlab.training.step import build_model_and_method

NAMES = ["adamw", "adamw8bit", "adamw4bit", "adamw_fp8", "adamw_coat"]
MNIST = {"kind": "image", "image_size": 28, "channels": 1, "num_classes": 10}  # data shape without the data folder


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mnist_flow")
    ap.add_argument("--optims", default=",".join(NAMES))
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
