"""Model converters (`train.convert = ["float8"]`): swap modules of a built model before it is wrapped, and again
whenever `sample`/`eval`/`export` load the run. Parameters of a converter's own (BitNet's input norms) are added in
`prepare`, when the model is built: weights load before `apply` runs, so parameters made there would miss them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from genlab.config.check import check_converter_combination
from genlab.core.registry import Registry
from genlab.nn.bitlinear import BitlinearKeys, NormedLinear, add_input_norm, to_bitlinear

# module-name parts never converted: embeddings, conditioning and output layers (float8's list, shared)
from genlab.nn.float8 import Float8Keys, SKIP_PARTS, check_float8_device, convert_float8

convert_registry = Registry("convert")


@dataclass
class Converter:
    apply: Callable[[nn.Module, torch.device, object], nn.Module]   # (model, device, cfg or None): in place; returns it
    check: Callable[[torch.device], None] = lambda device: None   # before training builds anything
    after_step: Callable[[nn.Module, object], None] | None = None  # (model, cfg) after each optimizer step
    linears: bool = False  # replaces the block linears' arithmetic: at most one such converter per run
    prepare: Callable[[nn.Module, object], None] | None = None  # (model, cfg) when built, before any weights load


def _float8(recipe):
    def apply(model, device, cfg=None):
        min_dim = cfg.train.float8_min_dim if cfg is not None else 0
        emulate = device.type != "cuda"  # emulated off CUDA: sampling only
        # only the trained copy: the EMA (no grads) is gathered for sampling, where a plain weight is what is wanted
        trained = any(p.requires_grad for p in model.parameters())
        all_gather = bool(cfg is not None and cfg.train.float8_all_gather and not emulate and trained)
        return convert_float8(model, recipe, emulate=emulate, min_dim=min_dim, all_gather=all_gather)

    def after_step(model, cfg):
        if cfg.train.float8_all_gather:
            # one fused amax over every sharded float8 weight, so the next forward's all-gathers cast with ready
            # scales (torchao's recommendation, as torchtitan does)
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
            precompute_float8_dynamic_scale_for_fsdp(model)
    return Converter(apply, check_float8_device, after_step, linears=True)


for _recipe in ("tensorwise", "rowwise"):
    convert_registry.register(f"float8_{_recipe}", f"torchao Float8Linear for the block linears, {_recipe} scales "
                                                   "(trains on SM89+/H100; emulated when a CPU loads the run)",
                              keys=Float8Keys)(_float8(_recipe))
convert_registry.register("float8", "alias of float8_tensorwise", reads=("train.float8_min_dim", "train.float8_all_gather"))(_float8("tensorwise"))


def bitlinear_filter(module: nn.Module, name: str) -> bool:
    """The block linears BitNet converts: plain (or given their input norm), not embeddings, adaLN or outputs."""
    return type(module) in (nn.Linear, NormedLinear) and not any(p in SKIP_PARTS for p in name.split("."))


def add_bitnet_norms(model: nn.Module, cfg) -> None:
    """train.bitlinear_norm=rmsnorm: BitNet's input RMSNorm in front of every block linear the converter will
    quantise (nn/bitlinear.py); both BitNet converters read it, so their models and checkpoints match."""
    if cfg is not None and cfg.train.bitlinear_norm == "none":
        return
    for name, m in list(model.named_modules()):
        if type(m) is nn.Linear and bitlinear_filter(m, name):
            add_input_norm(m)


def _bitlinear(model, device, cfg=None):
    for name, m in list(model.named_modules()):
        if bitlinear_filter(m, name):
            to_bitlinear(m)
    return model


convert_registry.register("bitlinear", "BitNet b1.58 BitLinear for the block linears: ternary absmean weights, "
                                       "int8 absmax activations after an input RMSNorm (train.bitlinear_norm), "
                                       "straight-through gradients", keys=BitlinearKeys)(
    Converter(_bitlinear, linears=True, prepare=add_bitnet_norms))


def converters_of(cfg, precision=None) -> list[str]:
    """train.convert plus what the precision implies (float8_* precision names are aliases), deduplicated."""
    names, p = list(cfg.train.convert), cfg.train.precision
    implied = (p,) if p.startswith("float8_") and p in convert_registry else ()
    for n in (precision.convert if precision is not None else implied):
        if n not in names and not (n == "float8_tensorwise" and "float8" in names):
            names.append(n)
    for n in names:
        convert_registry.get(n)
    check_converter_combination(names)  # also checked with the config, before any work
    return names


def prepare_converters(model: nn.Module, cfg, names=None) -> nn.Module:
    """The converters' own modules (BitNet's input norms), added to a freshly built model before weights load into it."""
    for n in (converters_of(cfg) if names is None else names):
        prepare = convert_registry.get(n).prepare
        if prepare is not None:
            prepare(model, cfg)
    return model


def check_converters(names, device):
    for n in names:
        convert_registry.get(n).check(device)


def apply_converters(model: nn.Module, names, device, cfg=None) -> nn.Module:
    """`cfg`: the run's config, for converters with options (train.float8_min_dim); None = their defaults."""
    for n in names:
        model = convert_registry.get(n).apply(model, torch.device(device), cfg)
    return model


def after_step_hooks(names) -> list:
    """The converters' work after each optimizer step (float8 all-gather scales), in train.convert order."""
    return [h for h in (convert_registry.get(n).after_step for n in names) if h is not None]
