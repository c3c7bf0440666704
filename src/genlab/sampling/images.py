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
                  batch=256, desc="sampling", post=None, per_step: bool | None = None, to_cpu: bool = False) -> torch.Tensor:
    """Images in [-1, 1], [n, C, H, W], drawn by `method.sample` in batches of `batch` labels (latents decoded here,
    before `post`). Progress per sampler step where sample() takes a callback, else (or per_step=False) per image.
    `post` maps each batch (e.g. to uint8 pixels). `to_cpu`: the batches come back on the CPU; on a CUDA device each
    batch's decode, `post` and copy run on a side stream into pinned memory while the next batch samples, so the
    loop never waits on the device (one synchronisation at the end, whatever the number of batches)."""
    if per_step is None:
        per_step = "callback" in inspect.signature(method.sample).parameters
    steps = steps or method.mcfg.sample_steps
    n_batches = -(-len(labels) // batch)
    finish = _Batches(method, post, to_cpu)
    with progress.Task(f"{desc} {len(labels)} images", total=steps * n_batches if per_step else len(labels),
                       unit="step" if per_step else "img") as task:
        for i in range(0, len(labels), batch):
            kw = {"callback": lambda *_: task.update()} if per_step else {}
            x = method.sample(model, labels[i:i + batch], steps=steps, cfg_scale=cfg_scale, sampler=sampler,
                              generator=generator, device=device, **kw)
            finish.add(x)
            if not per_step:
                task.update(len(x))
        return finish.result()


class _Batches:
    """Each drawn batch decoded (latent runs) and mapped by `post`; with `to_cpu` brought to the CPU. A CUDA batch is
    decoded, mapped and copied into pinned memory on a side stream that waits only for its own batch, so the default
    stream goes on with the next batch's sampler steps and the host never blocks until result()."""

    def __init__(self, method, post, to_cpu: bool):
        self.method, self.post, self.to_cpu, self.out, self.stream = method, post, to_cpu, [], None

    def _map(self, x):
        x = decode_latents(self.method, x)
        return self.post(x) if self.post is not None else x

    def add(self, x):
        if not (self.to_cpu and x.is_cuda):
            self.out.append(self._map(x).cpu() if self.to_cpu else self._map(x))
            return
        self.stream = self.stream or torch.cuda.Stream(x.device)
        self.stream.wait_stream(torch.cuda.current_stream(x.device))  # this batch's samples are ready on the side stream
        x.record_stream(self.stream)  # drawn on the default stream, read on the side one: not reused before that
        with torch.cuda.stream(self.stream):
            x = self._map(x)
            host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            host.copy_(x, non_blocking=True)
        self.out.append(host)  # the decode's own buffers belong to the side stream: the next batch never waits on it

    def result(self) -> torch.Tensor:
        if self.stream is not None:
            self.stream.synchronize()  # the one wait: every batch's copy has landed in host memory
        return torch.cat(self.out)


def generate(method, model, labels, ctx, batch, desc="sampling") -> torch.Tensor:
    """uint8 pixels on the CPU with the evaluation's steps, guidance, sampler and generator (ctx): a method's
    evaluation binds this into the generate(labels, desc) callable that eval/ takes."""
    return sample_images(method, model, labels, steps=ctx["eval"].sample_steps, cfg_scale=ctx["eval"].cfg_scale,
                         sampler=ctx.get("sampler"), generator=ctx["generator"], device=ctx["device"], batch=batch,
                         desc=desc, post=to_pixels, per_step=False, to_cpu=True)


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
