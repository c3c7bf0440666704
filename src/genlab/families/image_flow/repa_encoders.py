"""The frozen encoders REPA aligns to (registry `repa_encoder`; docs/image_flow.md): clean images in [-1, 1] -> features
[B, grid^2, D], another grid pooled (or upsampled) onto the DiT's where the paper resizes the input.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry, Spec, spec_with_arg
from genlab.data import build_dataset
from genlab.eval.classifier import SmallConvNet, get_classifier
from genlab.families.build import build_teacher
from genlab.families.image_flow.dit import dit_size
from genlab.families.models import model_registry
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.parallel import resolve_device


@dataclass(frozen=True, kw_only=True)
class RepaEncoderSpec(Spec):
    """A frozen image encoder REPA aligns to, chosen by `method.repa_encoder=NAME[:ARG]`: builder(arg, cfg, data_spec,
    grid) -> module mapping images in [-1, 1] to [B, grid^2, D] (attributes out_dim, flops_per_sample())."""
    check: Callable | None = None          # check(arg, cfg): one-line GenlabError before any work (missing files...)
    arg: str = ""                          # what ARG names ("" = takes none)


repa_encoder_registry = Registry("repa_encoder", RepaEncoderSpec)

WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def check_encoder(cfg) -> None:
    """method.repa_encoder names a registered encoder, with the argument and files it needs: one line, before work."""
    _, arg, spec = spec_with_arg(repa_encoder_registry, cfg.method.repa_encoder, "method.repa_encoder")
    if spec.check is not None:
        spec.check(arg, cfg)


def build_encoder(cfg, data_spec, grid: int) -> nn.Module:
    name, _, arg = str(cfg.method.repa_encoder).partition(":")  # 'timm:vit_small_patch14_dinov2', 'classifier'
    return repa_encoder_registry.get(name)(arg, cfg, data_spec, grid)


def to_grid(f: torch.Tensor, grid: int) -> torch.Tensor:
    """Feature map [B, D, h, w] -> tokens [B, grid^2, D]: average-pooled down, or bilinearly upsampled."""
    if f.shape[-1] >= grid and f.shape[-2] >= grid:
        f = F.adaptive_avg_pool2d(f, grid)
    else:
        f = F.interpolate(f, size=(grid, grid), mode="bilinear", align_corners=False)
    return f.flatten(2).transpose(1, 2)


def tokens_to_map(t: torch.Tensor) -> torch.Tensor:
    """Square token grid [B, N, D] -> [B, D, sqrt N, sqrt N]."""
    s = math.isqrt(t.shape[1])
    if s * s != t.shape[1]:
        raise GenlabError(f"the encoder's {t.shape[1]} patch tokens are not a square grid")
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], s, s)


class _Frozen(nn.Module):
    def count_flops(self, channels: int, image_size: int) -> None:
        """Forward FLOPs of one image, counted once by torch.utils.flop_counter."""
        from torch.utils.flop_counter import FlopCounterMode
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            self(torch.zeros(1, channels, image_size, image_size))
        self._flops = int(fc.get_total_flops())

    def flops_per_sample(self) -> int:
        return self._flops


class ConvEncoder(_Frozen):
    """Convolutional features of the clean image pooled onto the DiT's patch grid: [B, C, H, W] -> [B, grid^2, 128]."""

    def __init__(self, features: nn.Sequential, channels: int, image_size: int, grid: int):
        super().__init__()
        self.features, self.grid = features, grid
        self.out_dim = [m for m in features if isinstance(m, nn.Conv2d)][-1].out_channels
        self.count_flops(channels, image_size)

    def forward(self, x):
        return to_grid(self.features(x), self.grid)


@repa_encoder_registry.register("random", "a frozen randomly initialised conv net (no pretraining: tests, ablations)")
def build_random(arg, cfg, spec, grid):
    # SmallConvNet's trunk (strides 1, 2, 2; 128 channels out), initialised from the seeded global RNG, then frozen
    return ConvEncoder(SmallConvNet(spec["channels"], 2).features[:6], spec["channels"], spec["image_size"], grid)


@repa_encoder_registry.register("classifier", "the in-project feature CNN (eval/classifier.py), trained on the "
                                              "dataset and cached")
def build_classifier(arg, cfg, spec, grid):
    # trained (when not cached) on the run's device: on the CPU it took a Fashion-MNIST run > 8 minutes
    device = resolve_device(cfg.train.device, int(os.environ.get("LOCAL_RANK", "0")))
    net, _ = get_classifier(build_dataset(cfg.data), device=device, epochs=cfg.eval.classifier_epochs)
    return ConvEncoder(net.features[:6].cpu(), spec["channels"], spec["image_size"], grid)


class RunEncoder(_Frozen):
    """A trained genlab image model's last-block tokens at t = 1 (the clean image) with the null class."""

    def __init__(self, model: nn.Module, channels: int, image_size: int, grid: int, dim: int):
        super().__init__()
        self.net, self.grid, self.out_dim = model, grid, dim
        self._out = []
        model.blocks[-1].register_forward_hook(lambda m, a, out: self._out.append(out))
        self.count_flops(channels, image_size)

    def forward(self, x):
        t = torch.ones(x.shape[0], device=x.device, dtype=x.dtype)
        y = torch.full((x.shape[0],), self.net.null_class, device=x.device, dtype=torch.long)
        self._out.clear()
        self.net(x, t, y)
        return to_grid(tokens_to_map(self._out.pop()), self.grid)


@repa_encoder_registry.register("run", "a trained genlab run's model (its last block's tokens at t=1, null class): "
                                       "e.g. the masked autoencoder of `genlab train mnist_mae_encoder`",
                                arg="RUN")  # read when built (a sweep stage may make it later)
def build_run(arg, cfg, spec, grid):
    try:
        state = ckpt.load_checkpoint(Path(arg).expanduser())
    except GenlabError as e:
        raise GenlabError(f"method.repa_encoder=run:{arg}: {e}") from None
    rcfg = ckpt.config_of(state)
    if not model_registry.spec(rcfg.model.name).block_tokens:
        raise GenlabError(f"method.repa_encoder=run:{arg}: its model {rcfg.model.name} has no patch-token blocks")
    rspec = state.get("data_spec") or {}
    for key in ("kind", "channels", "image_size"):
        if rspec.get(key) != spec.get(key):
            raise GenlabError(f"method.repa_encoder=run:{arg} was trained on other data ({key} {rspec.get(key)!r}, "
                              f"this run's data has {spec.get(key)!r})")
    return RunEncoder(build_teacher(state), spec["channels"], spec["image_size"], grid, dit_size(rcfg.model)[0])


def load_weights(path, what: str) -> dict:
    """A state dict from .safetensors, or from a torch file read with weights_only=True: a file that asks to run code
    (a pickle payload) is refused in one line, unexecuted."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise GenlabError(f"{what}: no such weights file '{path}'")
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(p))
        else:
            state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (refused pickle, truncated file, not a weights file)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if "Weights only load failed" in str(e):
            raise GenlabError(f"{what}: refused to load '{path}': it holds more than tensors (nothing in it was run); "
                              f"use a .safetensors file or a plain state dict") from None
        raise GenlabError(f"{what}: cannot read '{path}': {first}") from None
    for key in ("state_dict", "model"):  # the usual wrappers of a training checkpoint
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise GenlabError(f"{what}: '{path}' holds no state dict of tensors")
    return state


def _floats(text: str, key: str) -> tuple[float, ...] | None:
    if not text:
        return None
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise GenlabError(f"{key} must be comma-separated numbers, got {text!r}") from None


def import_timm():
    try:
        import timm
    except ImportError:
        raise GenlabError("method.repa_encoder=timm:... needs the timm package (pip install timm)") from None
    return timm


class TimmEncoder(_Frozen):
    """A timm model's forward_features (inputs fit to its channels, size and normalisation) on the DiT's grid."""

    def __init__(self, net: nn.Module, channels: int, image_size: int, grid: int, size: int, mean, std):
        super().__init__()
        self.net, self.grid, self.size = net, grid, size
        self.in_chans = getattr(net, "in_chans", None) or 3
        self.prefix = getattr(net, "num_prefix_tokens", 1 if getattr(net, "cls_token", None) is not None else 0)
        self.out_dim = net.num_features
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.count_flops(channels, image_size)

    def forward(self, x):
        x = (x.float() + 1) / 2
        if x.shape[1] != self.in_chans:
            x = x.mean(1, keepdim=True).expand(-1, self.in_chans, -1, -1)
        x = F.interpolate(x, size=(self.size, self.size), mode="bicubic", align_corners=False)
        f = self.net.forward_features((x - self.mean) / self.std)
        if f.dim() == 3:  # ViT: [B, prefix + N, D]
            f = tokens_to_map(f[:, self.prefix:])
        return to_grid(f, self.grid)


def _check_timm(arg, cfg):
    m = cfg.method
    if not m.repa_encoder_path:
        raise GenlabError(f"method.repa_encoder=timm:{arg} needs method.repa_encoder_path=<weights: "
                          f"{' or '.join(WEIGHT_SUFFIXES)}> (genlab downloads nothing)")
    p = Path(m.repa_encoder_path).expanduser()
    if not p.is_file():
        raise GenlabError(f"method.repa_encoder_path={m.repa_encoder_path}: no such file")
    if p.suffix not in WEIGHT_SUFFIXES:
        raise GenlabError(f"method.repa_encoder_path={m.repa_encoder_path}: expected a {', '.join(WEIGHT_SUFFIXES)} file")
    for key in ("repa_encoder_mean", "repa_encoder_std"):
        _floats(getattr(m, key), f"method.{key}")
    timm = import_timm()
    if not timm.is_model(arg):
        raise GenlabError(f"method.repa_encoder=timm:{arg}: timm has no model {arg!r} (timm.list_models() lists them)")


@repa_encoder_registry.register("timm", "a timm model (patch tokens of forward_features) with weights from "
                                        "method.repa_encoder_path (.safetensors or weights-only .pt)",
                                check=_check_timm, arg="MODEL")
def build_timm(arg, cfg, spec, grid):
    m = cfg.method
    timm = import_timm()
    net = timm.create_model(arg, pretrained=False)
    what = f"method.repa_encoder=timm:{arg}"
    try:
        res = net.load_state_dict(load_weights(m.repa_encoder_path, what), strict=False)
    except RuntimeError as e:  # a shape mismatch
        raise GenlabError(f"{what}: {m.repa_encoder_path} does not fit the model: "
                          f"{str(e).strip().splitlines()[-1].strip()}") from None
    if res.missing_keys:
        raise GenlabError(f"{what}: {m.repa_encoder_path} lacks {len(res.missing_keys)} of the model's weights "
                          f"(e.g. {res.missing_keys[0]}): weights of another model?")
    pc = getattr(net, "pretrained_cfg", None) or {}
    size = m.repa_encoder_size or (pc.get("input_size") or (3, 224, 224))[-1]
    mean = _floats(m.repa_encoder_mean, "method.repa_encoder_mean") or tuple(pc.get("mean") or (0.485, 0.456, 0.406))
    std = _floats(m.repa_encoder_std, "method.repa_encoder_std") or tuple(pc.get("std") or (0.229, 0.224, 0.225))
    return TimmEncoder(net.eval(), spec["channels"], spec["image_size"], grid, size, mean, std)
