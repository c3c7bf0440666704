"""The one batched image sampler and the one evaluation context, shared by training-time eval and previews,
`genlab sample`, `genlab eval` and the Python API."""
from __future__ import annotations

import inspect

import torch

from genlab import progress


def eval_context(cfg, device, run_dir, **extra) -> dict:
    """What Method.evaluate / preview read: the eval config, device, run folder and a fixed-seed generator (the
    same seed at every evaluation, so two evaluations of the same weights draw the same samples)."""
    return {"eval": cfg.eval, "device": device, "cfg": cfg, "run_dir": run_dir,
            "generator": torch.Generator(device=device).manual_seed(cfg.train.seed + 12345), **extra}


def sample_images(method, model, labels, *, steps=None, cfg_scale=None, sampler=None, generator=None, device=None,
                  batch=256, desc="sampling", post=None, per_step: bool | None = None) -> torch.Tensor:
    """Images in [-1, 1], [n, C, H, W], drawn by `method.sample` in batches of `batch` labels; progress per sampler
    step where the method's sample() takes a callback (flow's ODE/SDE samplers), else per image. `post` maps each
    batch (e.g. to uint8 pixels on the CPU, so thousands of evaluation samples never sit on the device as floats);
    per_step=False counts images even where steps could be counted (evaluation: one line per phase in images)."""
    if per_step is None:
        per_step = "callback" in inspect.signature(method.sample).parameters
    steps = steps or getattr(method.mcfg, "sample_steps", 1)
    n_batches = -(-len(labels) // batch)
    out = []
    with progress.Task(f"{desc} {len(labels)} images", total=steps * n_batches if per_step else len(labels),
                       unit="step" if per_step else "img") as task:
        for i in range(0, len(labels), batch):
            kw = {"callback": lambda *_: task.update()} if per_step else {}
            x = method.sample(model, labels[i:i + batch], steps=steps, cfg_scale=cfg_scale, sampler=sampler,
                              generator=generator, device=device, **kw)
            out.append(post(x) if post is not None else x)
            if not per_step:
                task.update(len(out[-1]))
    return torch.cat(out)
