"""Sampling and evaluation of a finished run or checkpoint (`genlab sample`, `genlab eval`)."""
from __future__ import annotations

from pathlib import Path

import torch

from genlab import progress
from genlab.config import apply_overrides, from_dict
from genlab.data import build_dataset
from genlab.errors import GenlabError
from genlab.train import checkpoint as ckpt
from genlab.train.parallel import resolve_device
from genlab.train.trainer import build_model_and_method


def load_run(run_or_ckpt, device="auto", ema=True, overrides=()):
    state = ckpt.load_checkpoint(run_or_ckpt)
    cfg = from_dict(state["config"])
    apply_overrides(cfg, list(overrides))
    dev = resolve_device(device)
    model, method = build_model_and_method(cfg, state["data_spec"])
    weights = state["ema"] if ema and state.get("ema") is not None else state["model"]
    model.load_state_dict(weights)
    return cfg, model.to(dev).eval(), method, dev, state


def _run_dir(run_or_ckpt) -> Path:
    p = Path(run_or_ckpt)
    return p if p.is_dir() else p.parent.parent


def sample_images(method, model, labels, steps=None, cfg_scale=None, sampler=None, generator=None, device=None,
                  batch=256):
    """Images in [-1, 1], [n, C, H, W], drawn in batches with a progress bar over the sampler steps."""
    steps = steps or method.mcfg.sample_steps
    out = []
    with progress.Task(f"sampling {len(labels)} images", total=steps * -(-len(labels) // batch), unit="step") as task:
        for i in range(0, len(labels), batch):
            out.append(method.sample(model, labels[i:i + batch], steps=steps, cfg_scale=cfg_scale, sampler=sampler,
                                     generator=generator, device=device, callback=lambda *_: task.update()))
    return torch.cat(out)


def sample_to_file(run, n=64, steps=None, cfg_scale=None, class_id=None, out=None, seed=0, sampler=None,
                   device="auto", ema=True, **text_kwargs):
    cfg, model, method, dev, state = load_run(run, device, ema)
    gen = torch.Generator(device=dev).manual_seed(seed)
    out = Path(out) if out else _run_dir(run) / "sample_grid.png"
    if hasattr(method, "sample_to_file"):  # non-image families write their own output (text, video)
        return method.sample_to_file(model, out, n=n, steps=steps, generator=gen, device=dev, **text_kwargs)
    k = state["data_spec"]["num_classes"]
    if class_id is not None and not (0 <= class_id < k):
        raise GenlabError(f"--class {class_id} out of range; this model has classes 0..{k - 1}")
    labels = torch.full((n,), class_id, device=dev) if class_id is not None else torch.arange(n, device=dev) % k
    from genlab.eval.image_quality import save_grid, to_uint8
    imgs = to_uint8(sample_images(method, model, labels, steps=steps, cfg_scale=cfg_scale, sampler=sampler,
                                  generator=gen, device=dev))
    cols = k if class_id is None and n % k == 0 and k <= 16 else int(n ** 0.5 + 0.999)
    rows = (n + cols - 1) // cols
    return save_grid(imgs, rows, cols, out)


def evaluate_run(run, overrides=(), device="auto"):
    cfg, model, method, dev, state = load_run(run, device, True, overrides)
    data = build_dataset(cfg.data)
    ctx = {"eval": cfg.eval, "device": dev, "cfg": cfg, "run_dir": _run_dir(run),
           "generator": torch.Generator(device=dev).manual_seed(cfg.train.seed + 12345)}
    res = method.evaluate(model, data, ctx)
    res["step"] = state["step"]
    return res
