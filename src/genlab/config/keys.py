"""The config keys: the core keys every run reads, every key a registered component declares, and the section
classes assembled from them (rebuilt when a component registers, e.g. a plugin). One job: what keys exist."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from genlab.config.fields import F, declare
from genlab.core import registry
from genlab.core.registry import all_registries

# Keys every run reads (the trainer, the loader, the optimizer wrapper, logging). Every other key is declared by
# the component that reads it, next to its code (registry specs' `keys`), and the section classes below are
# assembled from both, so `genlab config`, docs/config.md and validation all read the same declarations.
_DATA = declare("data",
    name=F("digits", "dataset to train on", registry="dataset"),
    on_device=F("auto", "keep the whole uint8 dataset resident on the device", choices=("auto", "yes", "no")),
    prefetch=F(2, "batches gathered ahead by the host loader thread (when not on device)", ge=0),
    pin_memory=F("auto", "pin host batches for asynchronous copies to the GPU", choices=("auto", "yes", "no")),
)
_MODEL = declare("model",
    name=F("dit", "backbone", registry="model"),
    size=F("tiny", "named size preset (dit: tiny small S B L XL; gpt: tiny small gpt2 gpt2-medium gpt2-large gpt2-xl)", free="a size name of the chosen model"),
    dim=F(0, "width (0 = from model.size)", ge=0),
    depth=F(0, "number of blocks (0 = from model.size)", ge=0),
    heads=F(0, "attention heads (0 = from model.size); must divide model.dim", ge=0),
    mlp_ratio=F(4.0, "MLP hidden width / model width", gt=0),
    attention=F("sdpa", "attention kernel", registry="attention"),
)
_METHOD = declare("method",
    name=F("flow", "training objective and sampler", registry="method"),
)
_OPTIM = declare("optim",
    name=F("adamw", "optimizer", registry="optimizer"),
    lr=F(1e-3, "peak learning rate", gt=0),
    betas=F((0.9, 0.99), "Adam betas (sgd: betas[0] is the momentum)", ge=0, lt=1),
    weight_decay=F(0.0, "decoupled weight decay", ge=0),
    eps=F(1e-8, "Adam denominator epsilon", gt=0),
    schedule=F("cosine", "learning-rate schedule", registry="lr_schedule"),
    warmup_steps=F(100, "linear warmup steps", ge=0),
    min_lr_ratio=F(0.1, "final lr / peak lr of the decaying schedules", ge=0, le=1),
    grad_clip=F(1.0, "clip the global gradient norm to this (0 = no clipping)", ge=0),
    caution=F(False, "cautious updates (Liang et al. 2024) on any optimizer: the library's own where faithful, else genlab's wrapper"),
)
_TRAIN = declare("train",
    steps=F(2000, "optimizer steps", ge=1),
    batch_size=F(128, "global batch (summed over micro-steps and ranks)", ge=1),
    grad_accum=F(1, "micro-steps per optimizer step; must divide train.batch_size", ge=1),
    device=F("auto", "auto | cpu | cuda | cuda:N", free="auto, cpu, cuda or cuda:N"),
    precision=F("auto", "numeric precision (auto = bf16 on CUDA, fp32 on CPU)", registry="precision"),
    compile=F("off", "what torch.compile wraps", registry="compile"),
    compile_mode=F("default", "the torch.compile mode", registry="compile_mode"),
    activation_checkpointing=F("none", "recompute activations in the backward pass", registry="activation_checkpointing"),
    parallel=F("auto", "data parallelism", registry="parallel"),
    replicate=F(0, "HSDP replicate degree (0 = world / shard)", ge=0),
    shard=F(0, "HSDP/FSDP shard degree (0 = all ranks)", ge=0),
    fsdp_prefetch=F(1, "FSDP/HSDP: explicit prefetch of this many blocks ahead (0 = implicit only)", ge=0),
    fsdp_keep_last=F(1, "FSDP/HSDP: last blocks left unsharded after the forward", ge=0),
    compiled_autograd=F(False, "trace the backward with compiled autograd (use with compile=model|blocks)"),
    compile_optimizer=F(False, "torch.compile the optimizer step and the EMA update as one function (train.compile_mode "
                                     "without CUDA graphs; torch adamw/adam/sgd; LR kept in a tensor)"),
    graph_step=F(False, "capture the whole step (forward, backward, clip, optimizer, EMA) as one CUDA graph after "
                        "3 eager steps and replay it (one CUDA device; methods that declare graph_step)"),
    seed=F(0, "seed of data order, init and noise", ge=0),
    seeds=F("", "train these seeds in one process as one batched computation (torch.vmap over stacked weights), "
            "each in its own run folder NAME-s<seed> (empty = one run of train.seed; docs/performance.md: Batched seeds)",
            free="comma-separated distinct integers >= 0"),
    lrs=F("", "batched variants: train these optim.lr values in one process as one batched computation, crossed with "
          "train.seeds (or train.seed) and the other train.*s lists; each member in its own run folder "
          "NAME-lr=<value>-s<seed> with the config of a single run at that optim.lr (empty = optim.lr; "
          "docs/performance.md: Batched variants)", free="comma-separated distinct numbers > 0"),
    weight_decays=F("", "batched variants: these optim.weight_decay values in one process (as train.lrs; run folders "
                    "NAME-weight_decay=<value>-s<seed>)", free="comma-separated distinct numbers >= 0"),
    ema_decays=F("", "batched variants: these train.ema_decay values in one process (as train.lrs; run folders "
                 "NAME-ema_decay=<value>-s<seed>)", free="comma-separated distinct numbers in (0, 1)"),
    ema_decay=F(0.999, "EMA decay of the sampling weights (0 = no EMA)", ge=0, lt=1),
    ema_warmup=F(True, "decay min(ema_decay, (1+n)/(10+n)) so early EMA tracks the model"),
    skip_nonfinite=F(False, "skip (and count) steps with a non-finite loss instead of stopping"),
    name=F("", "run name (default: preset name + timestamp)", free="a folder name"),
    out_dir=F("runs", "folder that holds the run folders", free="a folder path"),
    resume=F("", "run folder or checkpoint to continue from", free="a run folder or checkpoint path"),
    init_from=F("", "start from these weights (run folder, checkpoint or exported model.safetensors; strict shapes)", free="a run folder, checkpoint or .safetensors path"),
    convert=F([], "model converters applied before wrapping and when sample/eval/export load the run", registry="convert"),
)
_LOG = declare("log",
    every=F(50, "steps between metric lines (the only host syncs in the loop)", ge=1),
    tensorboard=F(True, "write TensorBoard event files"),
    progress=F(True, "console: a status line every log.every steps and eval/sampling progress (a tqdm bar only on a terminal); false keeps the start line, the slow-CPU warning with its step-1 line, and the summary"),
    ckpt_every=F(500, "steps between checkpoints (0 = only at the end)", ge=0),
    keep_last=F(3, "checkpoints kept (0 = all)", ge=0),
    keep_best=F(False, "also keep checkpoints/best.pt: the lowest validation metric seen"),
    sample_every=F(0, "steps between sample previews (0 = only at the end)", ge=0),
    eval_every=F(0, "steps between evaluations (0 = only at the end)", ge=0),
    wandb=F(False, 'also log to Weights & Biases (pip install "genlab[wandb]"; WANDB_MODE=offline works)'),
    wandb_project=F("genlab", "W&B project of the run (the W&B run is named after the run folder)", free="a W&B project name"),
)
_EVAL = declare("eval",
    num_samples=F(500, "samples for sample accuracy / feature distance / validation windows (0 = no eval)", ge=0),
    batch_size=F(250, "evaluation batch size", ge=1),
)

CORE_KEYS = _DATA + _MODEL + _METHOD + _OPTIM + _TRAIN + _LOG + _EVAL
SECTIONS = ("data", "model", "method", "optim", "train", "log", "eval")

# Keys that existed once and were removed: a saved run config that holds one at its old default still loads.
RETIRED: dict[str, object] = {}


def declared_keys() -> dict[str, tuple]:
    """dotted key -> (Key, owners): the core keys (owner "core") and every key a registered component declares in
    its spec's `keys`. A key declared twice must be the same declaration (one Key object shared by its readers).
    Computed once per registry state (validation asks several times per config)."""
    registry.load_entries()
    if _declared.get("generation") != registry.generation:
        _declared.update(generation=registry.generation, keys=_collect_keys())
    return _declared["keys"]


_declared: dict = {}


def _collect_keys() -> dict[str, tuple]:
    out = {k.dotted: (k, ["core"]) for k in CORE_KEYS}
    for kind, reg in all_registries().items():
        for name, spec in reg.specs():
            for k in spec.keys:
                if k.dotted in out and out[k.dotted][0] is not k:
                    raise RuntimeError(f"config key {k.dotted} declared twice ({kind} '{name}' and "
                                       f"{', '.join(out[k.dotted][1])}): declare it once and list it in `reads`")
                out.setdefault(k.dotted, (k, []))[1].append(f"{kind} '{name}'")
    for kind, reg in all_registries().items():
        for name, spec in reg.specs():
            for dotted in spec.reads:
                if dotted not in out:
                    raise RuntimeError(f"{kind} '{name}' reads {dotted}, which no component declares")
    return out


_classes: dict = {}


def section_class(sec: str):
    """The dataclass of one config section, assembled from the declarations (rebuilt when a component registers)."""
    registry.load_entries()
    if _classes.get("generation") != registry.generation:
        keys = declared_keys()
        _classes.clear()
        _classes["generation"] = registry.generation
        for s in SECTIONS:
            fields = [(k.name, k.type, k.field) for k, _ in keys.values() if k.section == s]
            _classes[s] = dataclasses.make_dataclass(f"{s.capitalize()}Config", fields)
    return _classes[sec]


def _section(sec):
    return field(default_factory=lambda: section_class(sec)())


@dataclass
class Config:
    data: Any = _section("data")
    model: Any = _section("model")
    method: Any = _section("method")
    optim: Any = _section("optim")
    train: Any = _section("train")
    log: Any = _section("log")
    eval: Any = _section("eval")
    preset: str = F("default", "name of the preset the config started from", free="a preset name")


def sections(cfg=None):
    """(section name, dataclass type or instance) for every table of the config."""
    cfg = cfg if cfg is not None else Config()
    return [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(Config) if dataclasses.is_dataclass(getattr(cfg, f.name))]
