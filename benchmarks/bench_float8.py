"""Float8 vs bf16 crossover on a compiled MLP stack (one configuration per process: dynamo's recompile limit).

usage: python benchmarks/bench_float8.py --width W --recipe bf16|tensorwise|rowwise [--tokens 32768 --layers 4]
prints one JSON line: fwd+bwd ms and achieved TFLOP/s (6 x tokens x params of the linears per step).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn as nn


class Stack(nn.Module):
    def __init__(self, width, layers):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width)) for _ in range(layers))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--recipe", default="bf16")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    dev = torch.device("cuda")
    model = Stack(a.width, a.layers).to(dev)
    if a.recipe != "bf16":
        sys.path.insert(0, "src")
        from genlab.nn.float8 import check_float8_device, convert_float8, count_float8
        check_float8_device(dev)
        convert_float8(model, a.recipe)
        assert count_float8(model) == 2 * a.layers
    model = torch.compile(model)
    x = torch.randn(a.tokens, a.width, device=dev, requires_grad=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    ms = 1e3 * (time.perf_counter() - t0) / a.steps
    flops = 6 * a.tokens * a.layers * 8 * a.width ** 2
    print(json.dumps({"width": a.width, "recipe": a.recipe, "step_ms": ms, "tflops": flops / ms / 1e9}))


if __name__ == "__main__":
    main()
