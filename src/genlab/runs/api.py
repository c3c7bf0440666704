"""The public Python API, re-exported by `import genlab` (its docstring shows the use): a thin layer over the CLI's
code paths (config.load_config, the trainer, runs/load.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from genlab.config.fields import did_you_mean
from genlab.config.tree import Config
from genlab.config.tree import load_config as _load
from genlab.core.errors import GenlabError
from genlab.runs import load as run_loader
from genlab.training.seeds import train  # noqa: F401 (genlab.train: one run, or a batched process's members)


def load_config(preset: str | None = None, overrides=()) -> Config:
    """Defaults <- preset (a name from `genlab list`, or a .toml path; None = digits_flow) <- overrides,
    given as `["section.key=value", ...]` or `{"section.key": value}`. Checked like the CLI's."""
    if isinstance(overrides, str):
        raise GenlabError(f"overrides must be a list of 'key=value' strings or a dict, got the string {overrides!r}")
    return _load(preset, overrides if isinstance(overrides, dict) else list(overrides))


class Run:
    """A trained run loaded for sampling: `.model` (eval mode, EMA weights by default), `.method`,
    `.config`, `.device`, `.step`, `.spec` (the dataset spec the model was built for)."""

    def __init__(self, path, device="auto", ema=True):
        self.path = Path(path)
        self.config, self.model, self.method, self.device, state = run_loader.load_run(path, device, ema)
        self.step, self.spec = state["step"], state["data_spec"]

    def __repr__(self):
        return (f"Run({str(self.path)!r}, model={self.config.model.name}, method={self.config.method.name}, "
                f"step={self.step}, device={self.device})")

    @torch.no_grad()
    def sample(self, n: int = 16, *, seed: int = 0, steps: int | None = None, text: bool = False, **options):
        """n samples on the CPU, drawn by the run's method (`Method.draw`) as `genlab sample` draws them (runs/load.py).
        Images: a float tensor [n, C, H, W] in [-1, 1]; flow keywords: class_id (one class) or labels (a tensor of
        n class ids; default: cycle over the classes), cfg_scale, sampler, steps.
        Text: token ids [n, L] (or, with text=True, a list of n strings); keywords: prompt, temperature, length
        (tokens; default method.sample_len or data.seq_len), autoregressive top_k, mdlm block_len; steps: the mdlm
        sampler's step count (autoregressive: new tokens, as in `genlab sample`).
        `run.method.sample_options` lists the keywords this run takes."""
        valid = self.method.sample_options
        for k in options:
            if k not in valid:
                raise GenlabError(f"Run.sample: unknown option '{k}'{did_you_mean(k, valid)} for method "
                                  f"{self.config.method.name}; valid: n, seed, steps, text, {', '.join(valid)}")
        if n < 1:
            raise GenlabError(f"Run.sample: n must be >= 1, got {n}")
        out = run_loader.draw(self.config, self.model, self.method, self.device, n, seed, steps, **options).cpu()
        if text:
            return self.decode(out)
        return out.float().clamp(-1, 1) if out.is_floating_point() else out  # images as the PNG grids quantise

    def decode(self, ids) -> list[str]:
        """Token ids [n, L] -> n strings with the run's tokenizer (language models)."""
        return self.method.decode(ids)


def load_run(path, device: str = "auto", ema: bool = True) -> Run:
    """A run folder (its latest checkpoint), a checkpoint file (.pt, .dcp, model.safetensors) or a folder written by
    `genlab export RUN --out DIR` -> Run."""
    return Run(path, device=device, ema=ema)
