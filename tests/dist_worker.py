"""Worker for the distributed tests, launched by torchrun (or plainly for one process).

It trains a tiny DiT on a FIXED global batch with fixed noise, so a run on any number of ranks must
follow the single-process trajectory: each rank takes its slice of the global batch, and the parallel
wrapper's gradient averaging has to reproduce the full-batch gradient. It uses the trainer's own
pieces (wrap_parallel, no_sync, clip_grads, shard_like/ema_update, DCP save/load).

usage: dist_worker.py OUT.json --mode none|ddp|fsdp|hsdp --steps N [--accum K] [--replicate R --shard S]
                      [--save-at K --ckpt DIR] [--resume DIR] [--optim NAME [--caution]]
       dist_worker.py OUT.json --batch RUNS.json   (RUNS.json: {"name": [the options above], ...}; each run is
                      trained in turn in this one process group, from the same start; OUT holds {name: result})
"""
from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from genlab.families.image_flow.dit import DiT, DiTSpec
from genlab.runtime.dcp import load_dcp_full, load_dcp_optimizer, save_dcp
from genlab.runtime.parallel import all_reduce_mean, clip_grads, exit_rank, full_state_dict, init_distributed, no_sync, shard_like, wrap_parallel
from genlab.training.trainer import ema_update

GLOBAL_BATCH = 8


def fixed_batch():
    g = torch.Generator().manual_seed(123)
    x1 = torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g)
    x0 = torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g)
    t = torch.rand(GLOBAL_BATCH, generator=g)
    y = torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)
    return x1, x0, t, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mode", default="none")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--replicate", type=int, default=0)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--save-at", type=int, default=0)
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--resume", default="")
    ap.add_argument("--fused", action="store_true", help="fused AdamW (on DTensor shards under fsdp/hsdp)")
    ap.add_argument("--prefetch", type=int, default=0, help="train.fsdp_prefetch")
    ap.add_argument("--keep-last", type=int, default=0, help="train.fsdp_keep_last")
    ap.add_argument("--optim", default="", help="a genlab optimizer entry (lr 1e-2, weight_decay 0.01) instead of torch AdamW")
    ap.add_argument("--caution", action="store_true", help="with --optim: optim.caution=true")
    ap.add_argument("--optims", default="", help="comma-separated genlab optimizers, each trained from the same start "
                    "in this process; OUT holds {name: result} and DCP checkpoints go to CKPT/name")
    ap.add_argument("--batch", default="", help="a JSON file {name: [options]}: several runs in one launch "
                    "(one interpreter + process-group start-up instead of one per run)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    info, device = init_distributed("cpu")
    if a.batch:
        out = {}
        for name, opts in json.loads(Path(a.batch).read_text()).items():
            b = ap.parse_args([a.out, *map(str, opts)])
            out[name] = train(b, info, device, b.ckpt)
    elif a.optims:
        results = {}
        for name in a.optims.split(","):
            a.optim = name
            results[name] = train(a, info, device, Path(a.ckpt) / name if a.ckpt else "")
        out = results
    else:
        out = train(a, info, device, a.ckpt)
    if info.is_main:
        torch.save(out, a.out)
    if info.enabled:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def train(a, info, device, ckpt_dir):
    tcfg = SimpleNamespace(parallel=a.mode, replicate=a.replicate, shard=a.shard, precision="fp32", device="cpu",
                           fsdp_prefetch=a.prefetch, fsdp_keep_last=a.keep_last)
    torch.manual_seed(0)
    model = DiT(DiTSpec(image_size=8, channels=1, num_classes=3, dim=32, depth=2, heads=2))
    start = 0
    if a.resume:
        state = load_dcp_full(a.resume)
        model.load_state_dict(state["model"])
        start = state["step"]
    ema = copy.deepcopy(model).requires_grad_(False)
    if a.resume and state.get("ema") is not None:
        ema.load_state_dict(state["ema"])
    wrapped = wrap_parallel(model, info, tcfg, device)
    ema = shard_like(ema, model)
    if a.optim:
        from genlab.config.tree import OptimConfig
        from genlab.optim.build import build_optimizer
        opt = build_optimizer(model, OptimConfig(name=a.optim, lr=1e-2, weight_decay=0.01, caution=a.caution))
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0,
                                **({"fused": True} if a.fused else {"foreach": True}))
    if a.resume:
        load_dcp_optimizer(a.resume, model, opt)
    x1, x0, t, y = fixed_batch()
    per_rank = GLOBAL_BATCH // info.world
    lo = info.rank * per_rank
    x1, x0, t, y = (v[lo:lo + per_rank] for v in (x1, x0, t, y))
    micro = per_rank // a.accum
    losses, gnorms = [], []
    for step in range(start, a.steps):
        total = torch.zeros(())
        for m in range(a.accum):
            sl = slice(m * micro, (m + 1) * micro)
            tt = t[sl]
            xt = (1 - tt[:, None, None, None]) * x0[sl] + tt[:, None, None, None] * x1[sl]
            with no_sync(wrapped, m == a.accum - 1):
                loss = F.mse_loss(wrapped(xt, tt, y[sl]), x1[sl] - x0[sl]) / a.accum
                loss.backward()
            total += loss.detach()
        gnorms.append(float(clip_grads(model.parameters(), 0.5, opt)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema_update(list(ema.parameters()), list(model.parameters()), 0.9)
        losses.append(float(all_reduce_mean(total, info)))
        if a.save_at and step + 1 == a.save_at:
            save_dcp(ckpt_dir, step + 1, model, opt, ema, {"step": step + 1}, info)
    weights, ema_w = full_state_dict(model), full_state_dict(ema)
    return {"losses": losses, "gnorms": gnorms, "model": weights, "ema": ema_w,
            "world": info.world, "mesh": list(getattr(getattr(model, "_genlab_mesh", None), "shape", ()))}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exit_rank(0)  # see exit_rank: skip the teardown that intermittently aborts a finished rank
