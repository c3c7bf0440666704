"""The config keys: the core keys every run reads, every key a registered component declares, and the section
classes composed from them (rebuilt when a component registers, e.g. a plugin). One job: what keys exist."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from genlab.config.fields import F, Keys, key_classes, lineage
from genlab.core import registry
from genlab.core.registry import all_registries


# Keys every run reads (the trainer, the loader, the optimizer wrapper, logging). Every other key is declared by
# the component that reads it, next to its code (registry specs' `keys`), and the section classes below are
# composed from both, so `genlab config`, docs/config.md and validation all read the same declarations.
class DataConfig(Keys, section="data"):
    name: str = F("digits", "dataset to train on", registry="dataset")
    on_device: str = F("auto", "keep the whole uint8 dataset resident on the device", choices=("auto", "yes", "no"))
    prefetch: int = F(2, "batches gathered ahead by the host loader thread (when not on device)", ge=0)
    pin_memory: str = F("auto", "pin host batches for asynchronous copies to the GPU", choices=("auto", "yes", "no"))


class ModelConfig(Keys, section="model"):
    name: str = F("dit", "backbone", registry="model")
    size: str = F("tiny", "named size preset (dit: tiny small S B L XL; gpt: tiny small gpt2 gpt2-medium gpt2-large gpt2-xl)", free="a size name of the chosen model")
    dim: int = F(0, "width (0 = from model.size)", ge=0)
    depth: int = F(0, "number of blocks (0 = from model.size)", ge=0)
    heads: int = F(0, "attention heads (0 = from model.size); must divide model.dim", ge=0)
    mlp_ratio: float = F(4.0, "MLP hidden width / model width", gt=0)
    attention: str = F("sdpa", "attention kernel", registry="attention")


class MethodConfig(Keys, section="method"):
    name: str = F("flow", "training objective and sampler", registry="method")


class OptimConfig(Keys, section="optim"):
    name: str = F("adamw", "optimizer", registry="optimizer")
    lr: float = F(1e-3, "peak learning rate", gt=0)
    betas: tuple[float, ...] = F((0.9, 0.99), "Adam betas (sgd: betas[0] is the momentum)", ge=0, lt=1)
    weight_decay: float = F(0.0, "decoupled weight decay", ge=0)
    eps: float = F(1e-8, "Adam denominator epsilon", gt=0)
    schedule: str = F("cosine", "learning-rate schedule", registry="lr_schedule")
    warmup_steps: int = F(100, "linear warmup steps", ge=0)
    min_lr_ratio: float = F(0.1, "final lr / peak lr of the decaying schedules", ge=0, le=1)
    grad_clip: float = F(1.0, "clip the global gradient norm to this (0 = no clipping)", ge=0)
    caution: bool = F(False, "cautious updates (Liang et al. 2024) on any optimizer: the library's own where faithful, else genlab's wrapper")


class TrainConfig(Keys, section="train"):
    steps: int = F(2000, "optimizer steps", ge=1)
    batch_size: int = F(128, "global batch (summed over micro-steps and ranks)", ge=1)
    grad_accum: int = F(1, "micro-steps per optimizer step; must divide train.batch_size", ge=1)
    device: str = F("auto", "auto | cpu | cuda | cuda:N", free="auto, cpu, cuda or cuda:N")
    precision: str = F("auto", "numeric precision (auto = bf16 on CUDA, fp32 on CPU)", registry="precision")
    compile: str = F("off", "what torch.compile wraps", registry="compile")
    compile_mode: str = F("default", "the torch.compile mode", registry="compile_mode")
    activation_checkpointing: str = F("none", "recompute activations in the backward pass", registry="activation_checkpointing")
    parallel: str = F("auto", "data parallelism", registry="parallel")
    replicate: int = F(0, "HSDP replicate degree (0 = world / shard)", ge=0)
    shard: int = F(0, "HSDP/FSDP shard degree (0 = all ranks)", ge=0)
    fsdp_prefetch: int = F(1, "FSDP/HSDP: explicit prefetch of this many blocks ahead (0 = implicit only)", ge=0)
    fsdp_keep_last: int = F(1, "FSDP/HSDP: last blocks left unsharded after the forward", ge=0)
    compiled_autograd: bool = F(False, "trace the backward with compiled autograd (use with compile=model|blocks)")
    compile_optimizer: bool = F(False, "torch.compile the optimizer step and the EMA update as one function (train.compile_mode "
                                             "without CUDA graphs; torch adamw/adam/sgd; LR kept in a tensor)")
    graph_step: str = F("auto", "capture the whole step (forward, backward, clip, optimizer, EMA) as one CUDA graph after "
                        "3 eager steps and replay it (one CUDA device; methods that declare graph_step); auto: on wherever "
                        "the run supports it on a CUDA device, else the plain step with a one-line note saying why",
                        choices=("auto", "true", "false"))
    seed: int = F(0, "seed of data order, init and noise", ge=0)
    seeds: str = F("", "train these seeds in one process as one batched computation (torch.vmap over stacked weights), "
                   "each in its own run folder NAME-s<seed> (empty = one run of train.seed; docs/performance.md: Batched seeds)",
                   free="comma-separated distinct integers >= 0")
    lrs: str = F("", "batched variants: train these optim.lr values in one process as one batched computation, crossed with "
                 "train.seeds (or train.seed) and the other train.*s lists; each member in its own run folder "
                 "NAME-lr=<value>-s<seed> with the config of a single run at that optim.lr (empty = optim.lr; "
                 "docs/performance.md: Batched variants)", free="comma-separated distinct numbers > 0")
    weight_decays: str = F("", "batched variants: these optim.weight_decay values in one process (as train.lrs; run folders "
                           "NAME-weight_decay=<value>-s<seed>)", free="comma-separated distinct numbers >= 0")
    ema_decays: str = F("", "batched variants: these train.ema_decay values in one process (as train.lrs; run folders "
                        "NAME-ema_decay=<value>-s<seed>)", free="comma-separated distinct numbers in (0, 1)")
    ema_decay: float = F(0.999, "EMA decay of the sampling weights (0 = no EMA)", ge=0, lt=1)
    ema_warmup: bool = F(True, "decay min(ema_decay, (1+n)/(10+n)) so early EMA tracks the model")
    skip_nonfinite: bool = F(False, "skip (and count) steps with a non-finite loss instead of stopping")
    name: str = F("", "run name (default: preset name + timestamp)", free="a folder name")
    out_dir: str = F("runs", "folder that holds the run folders", free="a folder path")
    resume: str = F("", "run folder or checkpoint to continue from", free="a run folder or checkpoint path")
    init_from: str = F("", "start from these weights (run folder, checkpoint or exported model.safetensors; strict shapes)", free="a run folder, checkpoint or .safetensors path")
    convert: list[str] = F([], "model converters applied before wrapping and when sample/eval/export load the run", registry="convert")


class LogConfig(Keys, section="log"):
    every: int = F(50, "steps between metric lines (the only host syncs in the loop)", ge=1)
    tensorboard: bool = F(True, "write TensorBoard event files")
    progress: bool = F(True, "console: a status line every log.every steps and eval/sampling progress (a tqdm bar only on a terminal); false keeps the start line, the slow-CPU warning with its step-1 line, and the summary")
    ckpt_every: int = F(500, "steps between checkpoints (0 = only at the end)", ge=0)
    keep_last: int = F(3, "checkpoints kept (0 = all)", ge=0)
    keep_best: bool = F(False, "also keep checkpoints/best.pt: the lowest validation metric seen")
    sample_every: int = F(0, "steps between sample previews (0 = only at the end)", ge=0)
    eval_every: int = F(0, "steps between evaluations (0 = only at the end)", ge=0)
    stall_after: float = F(0.25, "stall sentinel: after this share of the steps, a training or eval loss still within "
                                 "log.stall_margin of a predictor that ignores its input is reported (0 = off)", ge=0, le=1)
    stall_margin: float = F(0.05, "stall sentinel: relative margin around the trivial level (accuracy: absolute)", ge=0, lt=1)
    wandb: bool = F(False, 'also log to Weights & Biases (pip install "genlab[wandb]"; WANDB_MODE=offline works)')
    wandb_project: str = F("genlab", "W&B project of the run (the W&B run is named after the run folder)", free="a W&B project name")


class EvalConfig(Keys, section="eval"):
    num_samples: int = F(500, "samples for sample accuracy / feature distance / validation windows (0 = no eval)", ge=0)
    batch_size: int = F(250, "evaluation batch size", ge=1)


CORES: dict[str, type[Keys]] = {c.section: c for c in (DataConfig, ModelConfig, MethodConfig, OptimConfig, TrainConfig,
                                                       LogConfig, EvalConfig)}
SECTIONS = tuple(CORES)

# Keys that existed once and were removed: a saved run config that holds one at its old default still loads.
RETIRED: dict[str, object] = {}


def declared_keys() -> dict[str, tuple]:
    """dotted key -> (Key, owners): the core keys (owner "core") and every key a registered component declares in
    its spec's `keys`; computed once per registry state."""
    return _composed()["keys"]


def readers() -> dict[str, list[str]]:
    """dotted key -> the components that read it (empty for the core keys every run reads)."""
    out = {dotted: [o for o in owners if o != "core"] for dotted, (_, owners) in declared_keys().items()}
    for kind, reg in all_registries().items():
        for name, spec in reg.specs():
            for dotted in spec.reads:
                out[dotted].append(f"{kind} '{name}'")
    return out


_state: dict = {}


def _composed() -> dict:
    """The declared keys and the section classes, recomputed when the registry generation moves."""
    registry.load_entries()
    if _state.get("generation") != registry.generation:
        owners = _owners()
        _state.clear()
        _state.update(generation=registry.generation, keys=_collect_keys(owners),
                      classes={s: _compose(s, [c for c in owners if c.section == s]) for s in SECTIONS})
    return _state


def _owners() -> dict[type[Keys], list[str]]:
    """Every Keys class -> the entries that list it in `keys` (the core classes: "core"), in declaration order:
    the core classes, then each registry's entries by name."""
    out: dict[type[Keys], list[str]] = {c: ["core"] for c in CORES.values()}
    for kind, reg in all_registries().items():
        for name, spec in reg.specs():
            for c in key_classes(spec.keys):
                if c.section not in CORES:
                    raise RuntimeError(f"{kind} '{name}': {c.__name__} names section '{c.section}'; valid: {', '.join(SECTIONS)}")
                for b in lineage(c):
                    who = out.setdefault(b, [])
                    if b not in CORES.values() and f"{kind} '{name}'" not in who:
                        who.append(f"{kind} '{name}'")
    return out


def _collect_keys(owners: dict[type[Keys], list[str]]) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for c, who in owners.items():
        for k in c.declared():
            if k.dotted in out:
                raise RuntimeError(f"config key {k.dotted} declared twice ({c.__name__} of {', '.join(who)} and "
                                   f"{', '.join(out[k.dotted][1])}): declare it in one Keys class and list it in `reads`")
            out[k.dotted] = (k, who)
    for kind, reg in all_registries().items():
        for name, spec in reg.specs():
            for dotted in spec.reads:
                if dotted not in out:
                    raise RuntimeError(f"{kind} '{name}' reads {dotted}, which no component declares")
    return out


def _compose(sec: str, classes: list[type[Keys]]) -> type[Keys]:
    """One section's class: the core class and every registered Keys class of the section as bases, so a section
    object is an instance of each (`ShortcutKeys.of(cfg)` is `cfg.method`). Fields run in declaration order: a
    dataclass collects its bases' fields from the last base to the first, and a base class comes before its
    subclasses in `classes` (_owners)."""
    return type(f"{sec.capitalize()}Section", tuple(reversed(classes)), {"__module__": __name__})


def section_class(sec: str) -> type[Keys]:
    """The class of one config section, composed from the declarations (rebuilt when a component registers)."""
    return _composed()["classes"][sec]


def _section(sec):
    return field(default_factory=lambda: section_class(sec)())


@dataclass
class Config:
    data: DataConfig = _section("data")
    model: ModelConfig = _section("model")
    method: MethodConfig = _section("method")
    optim: OptimConfig = _section("optim")
    train: TrainConfig = _section("train")
    log: LogConfig = _section("log")
    eval: EvalConfig = _section("eval")
    preset: str = F("default", "name of the preset the config started from", free="a preset name")


def sections(cfg=None):
    """(section name, dataclass type or instance) for every table of the config."""
    cfg = cfg if cfg is not None else Config()
    return [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(Config) if dataclasses.is_dataclass(getattr(cfg, f.name))]
