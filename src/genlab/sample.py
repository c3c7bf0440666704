"""Sampling and evaluation of a finished run or checkpoint (`genlab sample`, `genlab eval`)."""
from __future__ import annotations

from pathlib import Path

import torch

from genlab.config import apply_overrides
from genlab.data import build_dataset
from genlab.errors import GenlabError
from genlab.train import checkpoint as ckpt
from genlab.train.parallel import resolve_device
from genlab.train.convert import apply_converters, converters_of
from genlab.train.step import build_model_and_method


def load_run(run_or_ckpt, device="auto", ema=True, overrides=()):
    """(config, model on the device in eval mode and converted as it trained, method, device, checkpoint state)."""
    state = ckpt.load_checkpoint(run_or_ckpt)
    cfg = ckpt.config_of(state)
    apply_overrides(cfg, list(overrides))
    dev = resolve_device(device)
    model, method = build_model_and_method(cfg, state["data_spec"])
    weights = state["ema"] if ema and state.get("ema") is not None else state["model"]
    model.load_state_dict(weights)
    apply_converters(model.to(dev), converters_of(cfg), dev)  # a run trained converted samples converted
    return cfg, model.eval(), method, dev, state


def _run_dir(run_or_ckpt) -> Path:
    p = Path(run_or_ckpt)
    return p if p.is_dir() else p.parent.parent


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
    imgs = []
    for i in range(0, n, 256):
        imgs.append(to_uint8(method.sample(model, labels[i:i + 256], steps=steps, cfg_scale=cfg_scale,
                                           sampler=sampler, generator=gen, device=dev)))
    imgs = torch.cat(imgs)
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
