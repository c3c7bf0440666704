"""The public Python API, for notebooks and scripts (re-exported by `import genlab`):

    cfg = genlab.load_config("digits_flow", ["train.steps=200"])   # or a dict {"train.steps": 200}
    summary = genlab.train(cfg)                                      # the same loop as `genlab train`
    run = genlab.load_run(summary["run_dir"])                        # run folder or checkpoint file
    images = run.sample(n=16, class_id=3)                            # [16, C, H, W] in [-1, 1]

Everything here is a thin layer over the CLI's code paths (config.load_config, the Trainer, sample.load_run).
"""
from __future__ import annotations

from pathlib import Path

import torch

from genlab.config import Config
from genlab.errors import GenlabError


def load_config(preset: str | None = None, overrides=()) -> Config:
    """Defaults <- preset (a name from `genlab list`, or a .toml path; None = digits_flow) <- overrides,
    given as `["section.key=value", ...]` or `{"section.key": value}`. Checked like the CLI's."""
    from genlab.config import apply_dict, parse_override, validate
    from genlab.config import load_config as _load
    if isinstance(overrides, str):
        raise GenlabError(f"overrides must be a list of 'key=value' strings or a dict, got the string {overrides!r}")
    if not isinstance(overrides, dict):
        return _load(preset, list(overrides))
    cfg = _load(preset)
    for k, v in overrides.items():  # typed values go in as they are, checked like TOML values
        section, key, _ = parse_override(f"{k}=")
        apply_dict(cfg, {section: {key: v}}, source=f"override {k}={v!r}")
    validate(cfg)
    return cfg


def train(cfg: Config | str | None = None, resume: str | None = None) -> dict:
    """Train one run (a Config, or a preset name) and return its summary: run_dir, status, step, loss,
    samples_per_s, wall_time and the evaluation metrics. `resume` continues a run folder or checkpoint."""
    from genlab.train.trainer import Trainer
    if cfg is None or isinstance(cfg, str):
        cfg = load_config(cfg)
    if not isinstance(cfg, Config):
        raise GenlabError(f"genlab.train takes a Config (genlab.load_config(...)) or a preset name, got {type(cfg).__name__}")
    return Trainer(cfg, resume=resume).fit()


IMAGE_KW = ("class_id", "labels", "cfg_scale", "sampler")
TEXT_KW = ("prompt", "temperature", "length", "top_k", "block_len")


class Run:
    """A trained run loaded for sampling: `.model` (eval mode, EMA weights by default), `.method`,
    `.config`, `.device`, `.step`, `.spec` (the dataset spec the model was built for)."""

    def __init__(self, path, device="auto", ema=True):
        from genlab.sample import load_run as _load
        self.path = Path(path)
        self.config, self.model, self.method, self.device, state = _load(path, device, ema)
        self.step, self.spec = state["step"], state["data_spec"]

    @property
    def family(self) -> str:
        return getattr(self.method, "family", "image")

    def __repr__(self):
        return (f"Run({str(self.path)!r}, model={self.config.model.name}, method={self.config.method.name}, "
                f"step={self.step}, device={self.device})")

    @torch.no_grad()
    def sample(self, n: int = 16, *, seed: int = 0, steps: int | None = None, text: bool = False, **kw):
        """n samples on the CPU.

        Images: a float tensor [n, C, H, W] in [-1, 1]. Keywords: class_id (one class) or labels (a tensor of
        n class ids; default: cycle over the classes), cfg_scale, sampler, steps.
        Text: token ids [n, L] (or, with text=True, a list of n strings). Keywords: prompt, temperature,
        length (tokens; default method.sample_len or data.seq_len), autoregressive top_k, mdlm block_len;
        steps: the mdlm sampler's step count (autoregressive: new tokens, as in `genlab sample`)."""
        valid = TEXT_KW if self.family == "text" else IMAGE_KW
        for k in kw:
            if k not in valid:
                from genlab.config_fields import did_you_mean
                raise GenlabError(f"Run.sample: unknown option '{k}'{did_you_mean(k, valid)} for this {self.family} run; "
                                  f"valid: n, seed, steps, text, {', '.join(valid)}")
        if n < 1:
            raise GenlabError(f"Run.sample: n must be >= 1, got {n}")
        gen = torch.Generator(device=self.device).manual_seed(seed)
        if self.family == "text":
            ids = self._sample_ids(n, steps, gen, **kw).cpu()
            return self.decode(ids) if text else ids
        if text:
            raise GenlabError("text=True is for language models; this run samples images")
        if self.family != "image":
            raise GenlabError(f"Run.sample draws images or text; a '{self.family}' run ({self.config.method.name}) "
                              f"samples from data context: use `genlab sample {self.path}`")
        return self._sample_images(n, steps, gen, **kw).float().clamp(-1, 1).cpu()  # as the PNG grids quantise

    def decode(self, ids) -> list[str]:
        """Token ids [n, L] -> n strings with the run's tokenizer."""
        from genlab.methods import lm_common as lm
        return [lm.decode(self.spec, row.tolist()) for row in ids]

    def _sample_images(self, n, steps, gen, class_id=None, labels=None, cfg_scale=None, sampler=None):
        from genlab.sample import sample_images
        k = self.spec.get("num_classes", 0)
        if labels is None:
            if class_id is not None and not 0 <= class_id < k:
                raise GenlabError(f"class_id {class_id} out of range; this model has classes 0..{k - 1}")
            labels = torch.full((n,), class_id) if class_id is not None else torch.arange(n) % max(k, 1)
        labels = torch.as_tensor(labels, dtype=torch.long, device=self.device)
        return sample_images(self.method, self.model, labels, steps=steps, cfg_scale=cfg_scale, sampler=sampler,
                             generator=gen, device=self.device)

    def _sample_ids(self, n, steps, gen, prompt="", temperature=None, length=None, top_k=None, block_len=None):
        m, mc = self.method, self.config.method
        if self.config.method.name == "mdlm":
            return m.sample_ids(self.model, n, steps or mc.sample_steps, gen, self.device, prompt, temperature,
                                length, block_len)
        if block_len is not None:
            raise GenlabError("block_len is an mdlm sampling option; this run is autoregressive")
        length = length or steps or mc.sample_len or m.T  # as `genlab sample`: steps = new tokens
        return m._sample_ids(self.model, n, length, gen, self.device, prompt, temperature, top_k)


def load_run(path, device: str = "auto", ema: bool = True) -> Run:
    """A run folder (its latest checkpoint) or a checkpoint file (.pt, .dcp, model.safetensors) -> Run."""
    return Run(path, device=device, ema=ema)
