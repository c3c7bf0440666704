"""The config tree: dataclasses with defaults, TOML presets and dotted `key=value` overrides.

A config fully determines a run. Unknown keys and wrong types fail before any work is done.
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from genlab.errors import GenlabError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass
class DataConfig:
    name: str = "digits"          # registry `dataset`: digits | images | synthetic | ...
    path: str = ""                # folder written by `genlab data prepare` (for name=images/tokens)
    split: str = "train"
    on_device: str = "auto"       # auto | yes | no: keep the whole uint8 dataset resident on the device
    prefetch: int = 2             # batches gathered ahead by the host loader thread (when not on device)
    pin_memory: str = "auto"      # auto | yes | no
    image_size: int = 32          # synthetic data only
    channels: int = 4             # synthetic data only
    num_classes: int = 1000       # synthetic data only
    size: int = 4096              # synthetic data only: number of samples
    seq_len: int = 256            # token data: sequence length per sample
    vocab_size: int = 0           # synthetic token data only
    hflip: bool = False           # random horizontal flip, applied on the device


@dataclass
class ModelConfig:
    name: str = "dit"             # registry `model`
    size: str = "tiny"            # named size preset of the model (e.g. tiny, S, B, L, XL)
    dim: int = 0                  # 0 = take it from `size`
    depth: int = 0
    heads: int = 0
    patch_size: int = 2
    mlp_ratio: float = 4.0
    attention: str = "sdpa"       # registry `attention`
    class_dropout: float = 0.1    # label dropout that trains the null class for CFG
    qk_norm: bool = False
    adaln: str = "fused"          # registry `adaln`: LayerNorm + adaLN modulation (fused | unfused)
    residual: str = "fp32"        # registry `residual`: dtype of the DiT residual stream under autocast (fp32 | compute)
    dropout: float = 0.0
    # language models
    vocab_size: int = 0           # 0 = from the dataset
    pos_emb: str = "auto"         # registry `position`: auto (dit: sincos2d, gpt: learned) | learned | rope | sincos2d | rope2d
    norm: str = "layernorm"       # registry `norm`: layernorm | rmsnorm
    mlp: str = "gelu"             # registry `mlp`: gelu | swiglu
    tie_weights: bool = True
    causal: bool = True
    bias: bool = False
    ce_chunk: int = 0             # gpt: > 0 = fused linear + cross-entropy over chunks of this many tokens (no logits kept)


@dataclass
class MethodConfig:
    name: str = "flow"            # registry `method`
    timestep_sampler: str = "logit_normal"   # registry `timestep_sampler`
    logit_mean: float = 0.0
    logit_std: float = 1.0
    sampler: str = "heun"         # registry `sampler`
    sample_steps: int = 20
    cfg_scale: float = 2.0
    # masked diffusion LM
    noise_schedule: str = "loglinear"
    antithetic: bool = True
    eps: float = 1e-3
    temperature: float = 1.0      # language models: sampling temperature (0 = greedy)
    top_k: int = 0                # autoregressive sampling: keep the k most likely tokens (0 = all)
    sample_len: int = 0           # tokens per text sample (0 = data.seq_len)
    prompt: str = ""              # text prompt for previews; mdlm: "[[N]]" marks N tokens to infill
    block_len: int = 0            # mdlm sampling: semi-autoregressive blocks of this many tokens (0 = one block)
    teacher: str = ""             # run dir or checkpoint of a frozen teacher, built from that run's own saved config
    # REPA (method repa): flow loss + repa_weight * (-cosine) between projected DiT tokens and frozen encoder features
    repa_weight: float = 0.5      # lambda of the alignment term
    repa_block: int = 1           # DiT block whose output tokens are aligned (1-based; <= model depth)
    repa_encoder: str = "random"  # random (a frozen randomly initialised conv net) | classifier (the in-project feature CNN)
    repa_hidden: int = 256        # width of the trainable MLP projector
    repa_lr: float = 0.0          # projector learning rate (0 = optim.lr)


@dataclass
class OptimConfig:
    name: str = "adamw"           # registry `optimizer`
    lr: float = 1e-3
    betas: tuple = (0.9, 0.99)
    weight_decay: float = 0.0
    eps: float = 1e-8
    schedule: str = "cosine"      # registry `lr_schedule`
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0        # 0 = no clipping
    caution: bool = False         # cautious updates (heavyball optimizers)


@dataclass
class TrainConfig:
    steps: int = 2000
    batch_size: int = 128         # global batch (summed over micro-steps and ranks)
    grad_accum: int = 1
    device: str = "auto"          # auto | cpu | cuda | cuda:N
    precision: str = "auto"       # registry `precision`; auto = bf16 on CUDA, fp32 on CPU
    compile: str = "off"          # registry `compile`
    compile_mode: str = "default" # registry `compile_mode`: the torch.compile mode (default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs)
    activation_checkpointing: str = "none"   # registry `activation_checkpointing`
    ac_every: int = 2             # for activation_checkpointing=every_k
    parallel: str = "auto"        # registry `parallel`: auto | none | ddp | fsdp | hsdp
    replicate: int = 0            # HSDP replicate degree (0 = world / shard)
    shard: int = 0                # HSDP/FSDP shard degree (0 = all ranks)
    fsdp_prefetch: int = 1        # FSDP/HSDP: explicit forward/backward prefetch of this many blocks ahead (0 = implicit only)
    fsdp_keep_last: int = 1       # FSDP/HSDP: last blocks left unsharded after the forward (their backward follows at once)
    compiled_autograd: bool = False   # trace the backward with compiled autograd (use with compile=model|blocks)
    compile_optimizer: bool = False   # torch.compile the optimizer step (torch adamw/adam/sgd; LR kept in a tensor)
    seed: int = 0
    ema_decay: float = 0.999      # 0 = no EMA
    ema_warmup: bool = True       # decay min(ema_decay, (1+n)/(10+n)) so early EMA tracks the model
    skip_nonfinite: bool = False  # skip (and count) steps with a non-finite loss instead of stopping
    name: str = ""                # run name; default: preset name + timestamp
    out_dir: str = "runs"
    resume: str = ""              # run dir or checkpoint to continue from
    init_from: str = ""           # run dir, checkpoint or exported model.safetensors: start from its weights (strict shapes)
    convert: list = field(default_factory=list)  # registry `convert`: model converters applied before wrapping, e.g. ["float8"]


@dataclass
class LogConfig:
    every: int = 50               # steps between metric lines (the only host syncs in the loop)
    tensorboard: bool = True
    progress: bool = True
    ckpt_every: int = 500         # 0 = only at the end
    keep_last: int = 3
    keep_best: bool = False       # also keep checkpoints/best.pt: the lowest validation metric seen at eval_every and at the end
    sample_every: int = 0         # 0 = only at the end
    eval_every: int = 0           # 0 = only at the end


@dataclass
class EvalConfig:
    num_samples: int = 500        # samples for sample accuracy / feature distance
    sample_steps: int = 20
    cfg_scale: float = 2.0
    classifier_epochs: int = 30
    batch_size: int = 250
    grid_per_class: int = 10      # columns of the sample grid
    T_list: str = "8,32,128,512,1000"   # mdlm: step counts T of the bound-vs-T table (plus T=inf)
    nelbo_reps: int = 2           # mdlm: Monte Carlo draws per validation sequence for the NELBO
    gen_ppl_model: str = ""       # mdlm: autoregressive run dir that scores samples (generative perplexity)
    gen_samples: int = 16         # mdlm: samples scored for the generative perplexity


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    preset: str = "default"


def _coerce(value: Any, typ, where: str):
    """Check/convert a TOML or CLI value to the declared field type."""
    origin = get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif typ is list:  # a list of names: TOML array, JSON text or comma-separated text
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = [v.strip() for v in value.strip("()[]").split(",") if v.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
    elif typ is tuple or origin is tuple:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = [v for v in value.strip("()[]").split(",") if v.strip()]
        if isinstance(value, (list, tuple)):
            try:
                return tuple(float(v) for v in value)
            except (TypeError, ValueError):
                pass
    name = getattr(typ, "__name__", str(typ))
    raise GenlabError(f"config key '{where}' expects {name}, got {value!r}")


def _section_types(section_cls):
    return get_type_hints(section_cls)


def apply_dict(cfg: Config, data: dict, source: str = "config") -> Config:
    """Merge a nested dict (from TOML) into cfg, validating every key and type."""
    top = _section_types(Config)
    for key, val in data.items():
        if key not in top:
            raise GenlabError(f"unknown config section '{key}' in {source}; valid: {', '.join(top)}")
        if key == "preset":
            cfg.preset = _coerce(val, str, key)
            continue
        if not isinstance(val, dict):
            raise GenlabError(f"config section '{key}' in {source} must be a table")
        section = getattr(cfg, key)
        types = _section_types(type(section))
        for k, v in val.items():
            if k not in types:
                raise GenlabError(f"unknown config key '{key}.{k}' in {source}; valid keys of [{key}]: {', '.join(types)}")
            setattr(section, k, _coerce(v, types[k], f"{key}.{k}"))
    return cfg


def parse_override(text: str) -> tuple[str, str, Any]:
    if "=" not in text:
        raise GenlabError(f"override '{text}' must look like section.key=value (e.g. optim.lr=3e-4)")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) != 2:
        raise GenlabError(f"override key '{key}' must be section.key (e.g. model.depth=12)")
    return parts[0], parts[1], raw.strip()


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    for text in overrides:
        section, key, raw = parse_override(text)
        apply_dict(cfg, {section: {key: raw}}, source=f"override '{text}'")
    return cfg


def resolve_preset_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        return p
    for cand in (CONFIG_DIR / name_or_path, CONFIG_DIR / f"{name_or_path}.toml"):
        if cand.exists():
            return cand
    presets = sorted(x.stem for x in CONFIG_DIR.glob("*.toml"))
    raise GenlabError(f"config '{name_or_path}' not found; presets: {', '.join(presets)} (or a path to a .toml file)")


def load_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise GenlabError(f"{path}: invalid TOML: {e}") from None


def load_config(preset: str | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- preset TOML <- overrides. `preset` None means the default preset."""
    cfg = Config()
    path = resolve_preset_path(preset or "digits_flow")
    cfg.preset = path.stem
    apply_dict(cfg, load_toml(path), source=str(path))
    apply_overrides(cfg, list(overrides))
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Check every registry name before any work is done."""
    from genlab import registry as C
    C.model_registry.get(cfg.model.name)
    C.method_registry.get(cfg.method.name)
    C.dataset_registry.get(cfg.data.name)
    C.optimizer_registry.get(cfg.optim.name)
    C.lr_schedule_registry.get(cfg.optim.schedule)
    C.precision_registry.get(cfg.train.precision)
    C.compile_registry.get(cfg.train.compile)
    C.ac_registry.get(cfg.train.activation_checkpointing)
    C.parallel_registry.get(cfg.train.parallel)
    C.attention_registry.get(cfg.model.attention)
    C.adaln_registry.get(cfg.model.adaln)
    C.residual_registry.get(cfg.model.residual)
    C.mlp_registry.get(cfg.model.mlp)
    C.norm_registry.get(cfg.model.norm)
    if cfg.model.pos_emb != "auto":
        C.position_registry.get(cfg.model.pos_emb)
    for name in cfg.train.convert:
        C.convert_registry.get(name)
    if cfg.method.name == "flow":
        C.timestep_sampler_registry.get(cfg.method.timestep_sampler)
        C.sampler_registry.get(cfg.method.sampler)
    for key in ("steps", "batch_size", "grad_accum"):
        if getattr(cfg.train, key) < 1:
            raise GenlabError(f"train.{key} must be >= 1, got {getattr(cfg.train, key)}")
    if cfg.train.batch_size % cfg.train.grad_accum:
        raise GenlabError(f"train.batch_size ({cfg.train.batch_size}) must be divisible by train.grad_accum ({cfg.train.grad_accum})")
    C.compile_mode_registry.get(cfg.train.compile_mode)
    for key in ("on_device", "pin_memory"):
        if getattr(cfg.data, key) not in ("auto", "yes", "no"):
            raise GenlabError(f"data.{key} must be one of auto, yes, no; got {getattr(cfg.data, key)!r}")


def to_dict(cfg: Config) -> dict:
    d = dataclasses.asdict(cfg)
    for sec in d.values():
        if isinstance(sec, dict):
            for k, v in sec.items():
                if isinstance(v, tuple):
                    sec[k] = list(v)
    return d


def from_dict(d: dict) -> Config:
    cfg = Config()
    apply_dict(cfg, d, source="saved config")
    return cfg


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def dumps_toml(d: dict) -> str:
    """Write the two-level config dict as TOML (tomllib reads but cannot write)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    for sec, vals in d.items():
        if isinstance(vals, dict):
            lines.append(f"\n[{sec}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in vals.items())
    return "\n".join(lines) + "\n"
