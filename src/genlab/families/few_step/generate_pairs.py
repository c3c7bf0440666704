"""`genlab data generate pairs RUN`: a velocity run's (noise, image, label) triples from a deterministic ODE sampler, in a
pairs folder (data/pairs.py) written under a temporary name and renamed at the end, after every check.
"""
from __future__ import annotations

import dataclasses
import inspect
import time
from pathlib import Path

import numpy as np
import torch

from genlab.core import progress
from genlab.core.errors import GenlabError
from genlab.data.formats import atomic_folder
from genlab.data.pairs import write_pairs
from genlab.data.pixels import to_pixels
from genlab.families.few_step.base import build_teacher
from genlab.families.image_flow.flow import cfg_velocity, guidance_plan, parse_interval
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.parallel import resolve_device
from genlab.sampling.samplers import call_sampler, nfe_per_step, sampler_registry, time_grid
from genlab.families.base import method_registry


def ode_samplers() -> list[str]:
    """The deterministic samplers: no noise of their own (no `generator` argument), no model input of their own."""
    return [n for n, s in sampler_registry.specs()
            if "generator" not in inspect.signature(s.builder).parameters and not s.condition]


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def generate_pairs(run, out, n, steps=None, sampler=None, cfg_scale=None, batch=256, seed=0, device="auto") -> Path:
    for flag, v, ok, want in (("--n", n, n >= 1, ">= 1"), ("--steps", steps, steps is None or steps >= 1, ">= 1"),
                              ("--cfg-scale", cfg_scale, cfg_scale is None or cfg_scale >= 0, ">= 0"),
                              ("--batch", batch, batch >= 1, ">= 1")):
        if not ok:
            raise GenlabError(f"{flag} must be {want}, got {v}")
    if Path(out).exists():
        raise GenlabError(f"--out {out} exists; remove it or choose another folder")
    if sampler is not None and sampler not in ode_samplers():
        sampler_registry.get(sampler)  # an unknown name: the valid choices
        raise GenlabError(f"sampler '{sampler}' is not a deterministic ODE sampler, so its samples are no function of "
                          f"their noise; pairs need one of: {', '.join(ode_samplers())}")
    state = ckpt.load_checkpoint(str(run))  # a run whose model predicts a velocity with no extra inputs, on images
    if not isinstance(state.get("data_spec"), dict):
        raise GenlabError(f"'{run}' is not a genlab checkpoint (no data spec)")
    tcfg = ckpt.config_of(state)
    method = method_registry.get(tcfg.method.name)
    if method.output != "velocity" or method.conditions or state["data_spec"].get("kind") != "image":
        fits = [name for name, m in method_registry.items() if m.output == "velocity" and not m.conditions]
        raise GenlabError(f"'{run}' was trained by method {tcfg.method.name}, which does not predict a velocity on "
                          f"images; pairs come from a run of: {', '.join(fits)}")
    if state["data_spec"].get("codec"):  # pairs hold pixels beside the sampler's endpoints: not defined for latents yet
        raise GenlabError(f"'{run}' was trained on autoencoder latents (data.name=latents); teacher pairs come from "
                          f"runs trained on pixels")
    m = tcfg.method
    sampler = sampler or (m.sampler if m.sampler in ode_samplers() else "heun")
    steps = steps or tcfg.eval.sample_steps
    scale = tcfg.eval.cfg_scale if cfg_scale is None else cfg_scale
    interval = parse_interval(m.cfg_interval)
    spec = state["data_spec"]
    k, C, S = spec.get("num_classes", 0), spec["channels"], spec["image_size"]
    classes = spec.get("classes") or [str(i) for i in range(k)]
    dev = resolve_device(device, key="--device")
    model = build_teacher(state, dev)
    fn = sampler_registry.get(sampler)
    ts = time_grid(steps, device=dev, schedule=m.step_schedule, cfg=m)
    plan = guidance_plan(fn, time_grid(steps, "cpu", m.step_schedule, m), interval)  # no host sync per step
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same pairs on any device
    labels = (torch.arange(n) % k)[torch.randperm(n, generator=gen)] if k else torch.zeros(n, dtype=torch.long)  # balanced

    out = Path(out)
    with atomic_folder(out) as tmp:
        samples = np.lib.format.open_memmap(tmp / "samples.npy", "w+", np.float32, (n, C, S, S))
        noise = np.lib.format.open_memmap(tmp / "noise.npy", "w+", np.float32, (n, C, S, S))
        images = np.empty((n, S, S, C), np.uint8)
        t0 = time.perf_counter()
        with progress.Task(f"pairs: {n} images", total=steps * -(-n // batch), unit="step") as task:
            for i in range(0, n, batch):
                z = torch.randn((min(batch, n - i), C, S, S), generator=gen)
                y = labels[i:i + len(z)].to(dev) if k else None
                v = cfg_velocity(model, y, model.null_class, scale, interval, plan)
                x = call_sampler(fn, v, z.to(dev), ts, callback=lambda *_: task.update())
                samples[i:i + len(z)] = x.float().cpu().numpy()
                noise[i:i + len(z)] = z.numpy()
                images[i:i + len(z)] = to_pixels(x).cpu().numpy()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - t0
        nfe = steps * nfe_per_step(sampler)
        write_pairs(tmp, images, labels.numpy(), samples, noise, classes, {
            "teacher": str(run), "teacher_step": int(state.get("step", 0)), "teacher_method": m.name,
            "teacher_data": dataclasses.asdict(tcfg.data), "sampler": sampler, "steps": steps, "nfe": nfe,
            "cfg_scale": scale, "cfg_interval": list(interval), "step_schedule": m.step_schedule, "seed": seed,
            "batch": batch, "seconds": round(seconds, 3), "device": device_name(dev),
            "guided": bool(scale != 1.0 and k)})  # guided: each evaluation is one forward of a doubled batch
        del samples, noise  # the memmaps close before the folder moves
        if out.exists():
            raise GenlabError(f"--out {out} appeared while the pairs were drawn; they were not written")
    return out
