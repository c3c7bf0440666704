"""Worker of the MeanFlow DDP test (test_few_step_meanflow.py), launched by torchrun, or plainly for one process.

It computes the gradient of MeanFlow's loss (`MeanFlow.loss_at`, the trainer's code path: the prediction through the
parallel wrapper, the JVP target on the unwrapped module) on a FIXED global batch with fixed noise, times, steps
and labels; each rank takes its slice. DDP's all-reduce must reproduce the single-process gradient of the whole batch.

usage: meanflow_dist_worker.py OUT.pt --mode none|ddp
"""
from __future__ import annotations

import argparse
import os

import torch

from genlab.config.tree import load_config
from genlab.runtime.parallel import exit_rank, init_distributed, wrap_parallel
from genlab.training.step import build_model_and_method

GLOBAL_BATCH = 8
SPEC = {"kind": "image", "channels": 1, "image_size": 8, "num_classes": 10}


def fixed_batch():
    g = torch.Generator().manual_seed(123)
    data = torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g)
    noise = torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g)
    t = torch.rand(GLOBAL_BATCH, generator=g) * 0.5
    d = torch.rand(GLOBAL_BATCH, generator=g) * 0.5 * (torch.arange(GLOBAL_BATCH) % 2)  # every other sample d = 0
    y = torch.tensor([0, 3, 10, 7, 1, 10, 2, 9])  # 10: the null class of a dropped label
    return data, noise, t, d, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mode", default="none")
    a = ap.parse_args()
    torch.set_num_threads(1)
    info, device = init_distributed("cpu")
    cfg = load_config("digits_flow", ["model.dim=32", "model.depth=2", "model.heads=2", "method.name=meanflow",
                                      "method.sampler=flow_map", f"train.parallel={a.mode}"])
    torch.manual_seed(0)
    model, method = build_model_and_method(cfg, SPEC)
    with torch.no_grad():  # away from the zero-initialised output layers, so every term of the target counts
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    wrapped = wrap_parallel(model, info, cfg.train, device)
    per_rank = GLOBAL_BATCH // info.world
    lo = info.rank * per_rank
    data, noise, t, d, y = (v[lo:lo + per_rank] for v in fixed_batch())
    loss, _ = method.loss_at(wrapped, data, noise, t, d, y, per_rank)
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    total = loss.detach().clone()
    if info.enabled:
        torch.distributed.all_reduce(total)
        total /= info.world
        torch.distributed.barrier()
    if info.is_main:
        torch.save({"grads": grads, "loss": float(total), "world": info.world}, a.out)
    if info.enabled:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exit_rank(0)  # see exit_rank: skip the teardown that intermittently aborts a finished rank
