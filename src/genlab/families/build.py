"""Building a model and its method from a config, and load_run: the one run loader (genlab sample/eval/play, the API,
and the families that read another run: a teacher, an autoencoder run, the model that scores generated text).
"""
from __future__ import annotations

import json

import torch
import torch.nn as nn

from genlab.config.check import check_section, sampling_keys_of
from genlab.config.tree import apply_overrides
from genlab.core.errors import GenlabError
from genlab.families.models import model_registry
from genlab.nn.convert import apply_converters, converters_of, prepare_converters
from genlab.nn.ptq import apply_record
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.checkpoint import run_dir_of
from genlab.runtime.parallel import resolve_device
from genlab.sampling.block_cache import format_cache_schedule
from genlab.families.base import method_registry


def build_model_and_method(cfg, spec: dict):
    """The backbone (with the method's extra conditions and the converters' own modules) and the method."""
    method_class = method_registry.get(cfg.method.name)
    if method_class.conditions:
        spec = {**spec, "conditions": dict(method_class.conditions)}
    return prepare_converters(model_registry.get(cfg.model.name)(cfg.model, spec), cfg), method_class(cfg, spec)


def check_model_shapes(model, state: dict, source: str, verb: str = "resume from", what: str = "the model"):
    own = model.state_dict()
    diffs = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    missing = [k for k in own if k not in state] + [k for k in state if k not in own]
    if diffs or missing:
        side = "only in this model" if missing and missing[0] in own else "only in the checkpoint"
        if missing and missing[0] in own:  # a module may say why a checkpoint lacks it (BitNet's input norm)
            hint = getattr(model.get_submodule(missing[0].rpartition(".")[0]), "missing_hint", None)
            side += f" ({hint})" if hint else ""
        detail = f"shape of {diffs[0]}: {tuple(state[diffs[0]].shape)} vs {tuple(own[diffs[0]].shape)}" if diffs else f"parameter {missing[0]}, {side}"
        raise GenlabError(f"cannot {verb} {source}: {what} differs from the checkpoint ({detail})")


def check_eval_overrides(cfg, overrides) -> None:
    """The weights fix the model, data and method: only evaluation and sampling settings may change."""
    allowed = sampling_keys_of(cfg.method.name)
    for o in overrides:
        key = o.strip().split("=", 1)[0]
        if not (key.startswith("eval.") or key in allowed):
            raise GenlabError(f"override '{o}' is not allowed here: only eval.* keys (e.g. eval.num_samples=1000) "
                              f"and the sampling keys of method {cfg.method.name}: {', '.join(allowed) or 'none'}")


def cache_blocks_from_analysis(overrides: list[str], where: str) -> list[str]:
    """method.cache_blocks=auto and method.cache_schedule=auto as what `genlab analyze RUN --what cache` found for
    this run (its analysis/analysis.json; docs/analyze.md)."""
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.strip()
        if key in ("method.cache_blocks", "method.cache_schedule") and value.strip() == "auto":
            f = _run_dir(where) / "analysis" / "analysis.json"
            try:
                cache = json.loads(f.read_text()).get("cache")
            except (OSError, ValueError, AttributeError):
                cache = None
            o = _blocks_auto(cache, f) if key == "method.cache_blocks" else _schedule_auto(cache, f)
        out.append(o)
    return out


def _blocks_auto(cache, f) -> str:
    blocks = cache.get("blocks") if isinstance(cache, dict) else None
    if cache and blocks == []:
        raise GenlabError(f"method.cache_blocks=auto: the analysis in {f} found no block that can be cached within "
                          f"its FD tolerance (--cache-fd-tol); give indices to cache anyway, e.g. method.cache_blocks=2,3")
    if not blocks:
        raise GenlabError(f"method.cache_blocks=auto reads the blocks `genlab analyze RUN --what cache` picked, and "
                          f"{f} has none: run that first, or give indices, e.g. method.cache_blocks=2,3")
    return f"method.cache_blocks={','.join(str(b) for b in blocks)}"


def _schedule_auto(cache, f) -> str:
    sc = cache.get("scheduled") if isinstance(cache, dict) else None
    if not sc or not sc.get("reuse"):
        raise GenlabError(f"method.cache_schedule=auto reads the step-aware schedule `genlab analyze RUN --what cache` "
                          f"measured, and {f} has none: run that first")
    plan = {int(k): v for k, v in sc["reuse"].items()}
    return f"method.cache_schedule={format_cache_schedule(int(sc['evaluations']), plan)}"


def load_run(run_or_ckpt, device="auto", ema=True, overrides=()):
    """(config, model on the device in eval mode and converted as it trained, method, device, checkpoint state)."""
    return model_from_state(ckpt.load_checkpoint(run_or_ckpt), str(run_or_ckpt), device, ema, overrides)


def model_from_state(state: dict, where: str, device="auto", ema=True, overrides=()):
    """load_run's work on a checkpoint state in memory (a quantized run's record re-applied to its float weights)."""
    if not isinstance(state.get("data_spec"), dict):
        raise GenlabError(f"'{where}' is not a genlab checkpoint (no data spec)")
    cfg = ckpt.config_of(state)
    check_eval_overrides(cfg, overrides)
    apply_overrides(cfg, cache_blocks_from_analysis(list(overrides), where))
    check_section(cfg, "eval")  # the rest was validated when the run was trained
    check_section(cfg, "method")
    dev = resolve_device(device, key="--device")
    model, method = build_model_and_method(cfg, state["data_spec"])
    weights = state["ema"] if ema and state.get("ema") is not None else state["model"]
    check_model_shapes(model, weights, where, verb="load")
    model.load_state_dict(weights)
    apply_converters(model.to(dev), converters_of(cfg), dev, cfg)  # a run trained converted samples converted
    if state.get("quant"):
        apply_record(model, state["quant"], dev)
    return cfg, model.eval(), method, dev, state


_run_dir = run_dir_of  # the run folder of a run or checkpoint path (the front ends import this name)


def build_teacher(state: dict, device="cpu") -> nn.Module:
    """The teacher's model with its EMA weights (raw where it kept no EMA), converted as it trained, frozen."""
    cfg = ckpt.config_of(state)
    model = prepare_converters(model_registry.get(cfg.model.name)(cfg.model, state["data_spec"]), cfg)
    model.load_state_dict(state["ema"] if state.get("ema") is not None else state["model"])
    apply_converters(model.to(device), converters_of(cfg), torch.device(device), cfg)
    return model.requires_grad_(False).eval()
