"""The one batched image sampler and the one evaluation context, shared by training-time eval and previews,
`genlab sample`, `genlab eval` and the Python API."""
from __future__ import annotations

import functools
import inspect

import torch
from torch import nn

from genlab.core import progress
from genlab.data.pixels import to_pixels
from genlab.nn.autoencoders import load_autoencoder


def eval_context(cfg, device, run_dir, **extra) -> dict:
    """What Method.evaluate / preview read: the eval config, device, run folder and a fixed-seed generator (the
    same seed at every evaluation, so two evaluations of the same weights draw the same samples)."""
    return {"eval": cfg.eval, "device": device, "cfg": cfg, "run_dir": run_dir,
            "generator": torch.Generator(device=device).manual_seed(cfg.train.seed + 12345), **extra}


def sample_images(method, model, labels, *, steps=None, cfg_scale=None, sampler=None, generator=None, device=None,
                  batch=256, desc="sampling", post=None, per_step: bool | None = None) -> torch.Tensor:
    """Images in [-1, 1], [n, C, H, W], drawn by `method.sample` in batches of `batch` labels (latents decoded here,
    before `post`). Progress per sampler step where sample() takes a callback, else (or per_step=False) per image.
    `post` maps each batch (e.g. to uint8 pixels on the CPU, so evaluation samples never sit on the device)."""
    if per_step is None:
        per_step = "callback" in inspect.signature(method.sample).parameters
    steps = steps or method.mcfg.sample_steps
    n_batches = -(-len(labels) // batch)
    out = []
    with progress.Task(f"{desc} {len(labels)} images", total=steps * n_batches if per_step else len(labels),
                       unit="step" if per_step else "img") as task:
        for i in range(0, len(labels), batch):
            kw = {"callback": lambda *_: task.update()} if per_step else {}
            x = method.sample(model, labels[i:i + batch], steps=steps, cfg_scale=cfg_scale, sampler=sampler,
                              generator=generator, device=device, **kw)
            x = decode_latents(method, x)
            out.append(post(x) if post is not None else x)
            if not per_step:
                task.update(len(out[-1]))
    return torch.cat(out)


def generate(method, model, labels, ctx, batch, desc="sampling") -> torch.Tensor:
    """uint8 pixels on the CPU with the evaluation's steps, guidance, sampler and generator (ctx): a method's
    evaluation binds this into the generate(labels, desc) callable that eval/ takes."""
    return sample_images(method, model, labels, steps=ctx["eval"].sample_steps, cfg_scale=ctx["eval"].cfg_scale,
                         sampler=ctx.get("sampler"), generator=ctx["generator"], device=ctx["device"], batch=batch,
                         desc=desc, post=lambda x: to_pixels(x).cpu(), per_step=False)


SAMPLE_COMPILE_MODES = ("off", "default", "max-autotune-no-cudagraphs", "reduce-overhead")


class _GraphReplay(nn.Module):
    """A reduce-overhead network: each call starts a new CUDA-graph step and returns a copy, because the graph's
    output buffer is overwritten by the next replay (a Heun step still holds its first velocity then)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return self.module(*args, **kwargs).clone()


def compiled_for_sampling(model, mode: str):
    """The network a sampler calls, compiled for evaluation at FID scale (eval.sample_compile): `default` and
    `max-autotune-no-cudagraphs` fuse the forward; `reduce-overhead` also replays each batch shape's forward as a CUDA
    graph (make eval.batch_size divide eval.num_samples: a last, smaller batch compiles again). The weights are shared,
    so the caller keeps it for the model's later evaluations. `off`, or a model already compiled for training, is
    returned as it is."""
    if mode == "off" or hasattr(model, "_orig_mod"):
        return model
    net = torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)
    return _GraphReplay(net) if mode == "reduce-overhead" else net


@functools.cache  # the frozen decoder, built once per process
def _codec(spec: str, device: str):
    return load_autoencoder(spec, torch.device(device))


def decode_latents(method, x: torch.Tensor) -> torch.Tensor:
    """Samples of a latent method (its data spec records the autoencoder) decoded to images in [-1, 1] [n, C, H, W];
    pixel samples unchanged."""
    spec = getattr(method, "spec", None)
    desc = spec.get("codec") if isinstance(spec, dict) else None
    return _codec(desc["spec"], str(x.device)).decode(x.float()) if desc else x
