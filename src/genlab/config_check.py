"""Config validation: declared ranges, unused options, and the constraints model, data and method put
on each other. Everything here runs before any file is written or any model is built, and every
failure is one GenlabError line that names the offending key."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import get_type_hints

from genlab.config_fields import check_value, meta_of
from genlab.errors import GenlabError

# what each known component consumes; names other branches add are simply not cross-checked here
METHOD_DATA = {"flow": "image", "repa": "image", "autoregressive": "token", "mdlm": "token", "image_ar": "image"}
IMAGE_BACKBONES = ("dit", "dit_incontext", "mmdit")  # the class-conditional image backbones (config.IMAGE_BACKBONES)
METHOD_MODEL = {"flow": IMAGE_BACKBONES, "repa": ("dit",), "autoregressive": ("gpt", "sparse_transformer"), "mdlm": ("gpt",),
                "image_ar": ("sparse_transformer",)}
METHOD_CAUSAL = {"autoregressive": True, "mdlm": False}
SELECTOR_KIND = {"data.name": "dataset", "model.name": "model", "method.name": "method", "optim.name": "optimizer",
                 "optim.schedule": "lr schedule"}


def data_kind(name: str) -> str | None:
    from genlab.config import IMAGE_SETS, TOKEN_SETS
    return "image" if name in IMAGE_SETS else "token" if name in TOKEN_SETS else None


def check_section(cfg, sec: str) -> None:
    """Every field of one section against its declared range, choices or registry."""
    obj = getattr(cfg, sec)
    hints = get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        check_value(sec, f, hints[f.name], getattr(obj, f.name))
    if sec == "eval":  # a list of registry names: each must exist (weights are checked where eval will run)
        from genlab.eval.metrics import parse_metrics
        parse_metrics(obj.metrics)


def check_config(cfg) -> None:
    from genlab.config import sections
    secs = sections(cfg)
    for sec, _ in secs:
        check_section(cfg, sec)
    _check_train(cfg)
    _check_components(cfg)  # an incompatible method/model/data pair first: it explains the unused options
    _check_shapes(cfg)
    for msg in unused_options(cfg, WARN_SECTIONS, invert=True):
        raise GenlabError(msg)


# An unused sampling/eval option changes no weights (and shared override lists set them for several
# methods), so it is a warning printed before training and recorded in the run's config.toml; an unused
# data/model/optim/train option means the run is not what the user believes it is, so it is an error.
WARN_SECTIONS = ("method", "eval")


def config_warnings(cfg) -> list[str]:
    return unused_options(cfg, WARN_SECTIONS)


def _lookup(cfg, dotted: str):
    sec, key = dotted.split(".")
    return getattr(getattr(cfg, sec), key)


def unused_options(cfg, only: tuple, invert: bool = False) -> list[str]:
    """One message per option set away from its default that the selected component does not read
    (sections in `only`, or all but those with invert=True)."""
    from genlab.config import sections
    out = []
    for sec, obj in sections(cfg):
        if (sec in only) == invert:
            continue
        for f in dataclasses.fields(obj):
            if getattr(obj, f.name) == f.default:
                continue
            for selector, values in meta_of(f).get("unused", {}).items():
                chosen = _lookup(cfg, selector)
                if chosen in values:
                    kind = SELECTOR_KIND.get(selector, selector)
                    out.append(f"{sec}.{f.name} is not read by {kind} '{chosen}' ({selector}={chosen}); "
                               f"remove it or choose another {selector}")
    return out


def _check_train(cfg):
    t = cfg.train
    if t.batch_size % t.grad_accum:
        raise GenlabError(f"train.batch_size ({t.batch_size}) must be divisible by train.grad_accum ({t.grad_accum})")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", t.device):
        raise GenlabError(f"unknown train.device '{t.device}'; valid: auto, cpu, cuda, cuda:N")
    if len(cfg.optim.betas) != 2:
        raise GenlabError(f"optim.betas must hold two numbers, got {list(cfg.optim.betas)}")
    if t.activation_checkpointing not in ("every_k", "segments") and t.ac_every != 2:
        raise GenlabError(f"train.ac_every is read only by train.activation_checkpointing=every_k|segments "
                          f"(got activation_checkpointing={t.activation_checkpointing})")
    # a method checks its own options through its registry entry (no import of the methods from here)
    from genlab.registry import method_registry, optimizer_registry
    if t.parallel in ("fsdp", "hsdp") and not getattr(optimizer_registry.get(cfg.optim.name), "fsdp", True):
        raise GenlabError(f"optim.name={cfg.optim.name} does not work with train.parallel={t.parallel} (its library cannot "
                          f"update DTensor shards); use another optimizer (see README: Optimizers) or train.parallel=ddp")
    getattr(method_registry.get(cfg.method.name), "check_config", lambda cfg: None)(cfg)


def _check_components(cfg):
    d, m, meth = cfg.data, cfg.model, cfg.method.name
    if d.name in ("images", "tokens"):
        if not d.path:
            raise GenlabError(f"data.name={d.name} needs data.path (a folder made by `genlab data prepare`)")
    if d.name == "synthetic_tokens" and d.vocab_size < 2:
        raise GenlabError("data.vocab_size must be >= 2 for data.name=synthetic_tokens")
    want, have = METHOD_DATA.get(meth), data_kind(d.name)
    if want and have and want != have:
        raise GenlabError(f"method.name={meth} trains on {want} data but data.name={d.name} provides {have} data; "
                          f"choose a matching method.name or data.name")
    want = METHOD_MODEL.get(meth)
    if want and m.name in {n for names in METHOD_MODEL.values() for n in names} and m.name not in want:
        raise GenlabError(f"method.name={meth} needs model.name={'|'.join(want)}, got model.name={m.name}")
    if m.name == "sparse_transformer" and have == "token" and m.sparse_embed == "data":
        raise GenlabError("model.sparse_embed=data needs image data (row, column, channel); on text use attention or auto")
    if meth in METHOD_CAUSAL and m.name == "gpt" and m.causal != METHOD_CAUSAL[meth]:
        raise GenlabError(f"method.name={meth} needs model.causal={str(METHOD_CAUSAL[meth]).lower()}")


def _size_table(name):
    if name in IMAGE_BACKBONES:
        from genlab.models.dit import DIT_SIZES
        return DIT_SIZES
    if name == "gpt":
        from genlab.models.gpt import GPT_SIZES
        return GPT_SIZES
    if name == "sparse_transformer":
        from genlab.models.sparse_transformer import SPARSE_SIZES
        return SPARSE_SIZES
    return None


def image_size_of(d) -> int | None:
    """The image side a dataset will deliver, when it is known without loading the data."""
    if d.name == "digits":
        return 8
    if d.name == "synthetic":
        return d.image_size
    if d.name == "images":
        try:
            import numpy as np
            return int(np.load(Path(d.path) / "images.npy", mmap_mode="r").shape[1])
        except Exception:  # noqa: BLE001  (a missing/corrupt folder is reported by the dataset reader)
            return None
    return None


def _check_shapes(cfg):
    m = cfg.model
    table = _size_table(m.name)
    if table is None:
        return
    if m.size not in table:
        from genlab.config_fields import did_you_mean
        raise GenlabError(f"unknown model.size '{m.size}' for model {m.name}{did_you_mean(m.size, table)}; valid: {', '.join(table)}")
    dim0, _, heads0 = table[m.size]
    dim, heads = m.dim or dim0, m.heads or heads0
    if dim % heads:
        raise GenlabError(f"model.heads ({heads}) must divide model.dim ({dim})")
    if m.pos_emb != "auto":  # through the registries (no import of the models): the entry must fit the token grid
        from genlab.registry import model_registry, position_registry
        rank = getattr(model_registry.get(m.name), "grid_rank", None)
        fits = [n for n, fn in position_registry.items() if rank in getattr(fn, "axes", ())]
        position_registry.get(m.pos_emb)
        if rank is not None and m.pos_emb not in fits:
            raise GenlabError(f"model.pos_emb={m.pos_emb} does not fit model {m.name}; valid choices: auto, {', '.join(fits)}")
    if m.name == "gpt" and m.pos_emb == "rope" and (dim // heads) % 2:
        raise GenlabError(f"model.pos_emb=rope needs an even head width; model.dim/model.heads = {dim // heads}")
    _check_layers(m, dim, heads, m.depth or table[m.size][1])
    from genlab.registry import attention_registry
    if cfg.train.device == "cpu" and not getattr(attention_registry.get(m.attention), "cpu_backward", True):
        raise GenlabError(f"model.attention={m.attention} has no backward pass on the CPU (train.device=cpu); "
                          f"train with sdpa or math there (sampling and eval run the forward anywhere)")
    if m.name in IMAGE_BACKBONES:
        side = image_size_of(cfg.data)
        if side is not None and side % m.patch_size:
            raise GenlabError(f"model.patch_size ({m.patch_size}) must divide the image size ({side}) of data.name={cfg.data.name}")



def _check_layers(m, dim: int, heads: int, depth: int):
    """Layer choices that cannot work with this model's shape or token layout, through the registries (no import
    of the models): Mix-FFN needs a patch grid, differential attention an even head width, 2-D positions
    widths divisible by 4, the MMDiT hybrid at most model.depth dual blocks."""
    from genlab.registry import attention_registry, mlp_registry, model_registry
    hd = dim // heads
    rank = getattr(model_registry.get(m.name), "grid_rank", None)
    if "mlp" in getattr(model_registry.get(m.name), "layer_keys", ()) and getattr(mlp_registry.get(m.mlp), "needs_grid", False) and rank != 2:
        raise GenlabError(f"model.mlp={m.mlp} convolves over the patch grid; model {m.name} has no grid: "
                          f"choose model.mlp=gelu|swiglu or model.name={'|'.join(IMAGE_BACKBONES)}")
    if m.attention == "differential" and hd % 2:
        raise GenlabError(f"model.attention=differential splits each head in halves; head width model.dim/model.heads = {hd} is odd")
    if rank == 2 and m.pos_emb == "rope2d" and hd % 4:
        raise GenlabError(f"model.pos_emb=rope2d needs a head width divisible by 4; model.dim/model.heads = {hd}")
    if rank == 2 and m.pos_emb in ("auto", "sincos2d") and dim % 4:
        raise GenlabError(f"model.pos_emb=sincos2d needs model.dim divisible by 4, got {dim}")
    if m.name == "mmdit" and m.dual_blocks > depth:
        raise GenlabError(f"model.dual_blocks ({m.dual_blocks}) must be at most model.depth ({depth}); 0 = all blocks dual-stream")
    attention_registry.get(m.attention)
