"""Sampling and evaluation of a finished run or checkpoint (`genlab sample`, `genlab eval`)."""
from __future__ import annotations

from pathlib import Path

import torch

from genlab.config.check import check_data_on_disk, read_keys
from genlab.core.errors import GenlabError
from genlab.core.registry import all_registries
from genlab.data import build_dataset
from genlab.eval.cost import cost_summary
from genlab.eval.nfe import nfe_grid, nfe_rows, parse_int_list, samplers_of, write_table
from genlab.families.build import _run_dir, check_eval_overrides, load_run, model_from_state, sampling_keys  # noqa: F401 (the front ends' loader)
from genlab.families.image_flow.flow import check_sampler_conditions
from genlab.runtime.switches import build_precision
from genlab.sampling.images import eval_context


def sampling_precision(cfg, device):
    """The run's training precision (train.precision) for sampling and evaluating it: the trainer evaluates under
    that autocast, so `genlab eval` / `sample` / `analyze` of a bf16 run sample in bf16 as its training-time
    evaluations did (the same numbers, and tensor-core speed on a GPU instead of float32 matmuls)."""
    return build_precision(cfg.train.precision, torch.device(device))


def check_sample_args(n, steps=None, cfg_scale=None, temperature=None, top_k=None, sampler=None, length=None):
    """The sample command's numbers, before a checkpoint is opened or a file written."""
    for flag, v, ok, want in (("--n", n, n is not None and n >= 1, ">= 1"), ("--steps", steps, steps is None or steps >= 1, ">= 1"),
                              ("--length", length, length is None or length >= 1, ">= 1"),
                              ("--cfg", cfg_scale, cfg_scale is None or cfg_scale >= 0, ">= 0"),
                              ("--temperature", temperature, temperature is None or temperature >= 0, ">= 0"),
                              ("--top-k", top_k, top_k is None or top_k >= 0, ">= 0")):
        if not ok:
            raise GenlabError(f"{flag} must be {want}, got {v}")
    if sampler is not None:
        all_registries()["sampler"].get(sampler)


# `genlab sample`'s per-method options, by the keyword the command passes to Method.sample_to_file
SAMPLE_FLAGS = {"class_id": "--class", "cfg_scale": "--cfg", "sampler": "--sampler", "prompt": "--prompt",
                "temperature": "--temperature", "top_k": "--top-k", "length": "--length", "complete": "--complete",
                "attention": "--attention"}


def check_sample_options(cfg, method, given: dict) -> None:
    """An option the run's method does not take (a text prompt to an image run) is refused, not ignored; a sampler
    must fit the model (a step-size sampler on a plain flow run)."""
    import inspect
    takes = inspect.signature(method.sample_to_file).parameters
    for k in given:
        if k in SAMPLE_FLAGS and k not in takes:
            own = [f for p, f in SAMPLE_FLAGS.items() if p in takes]
            raise GenlabError(f"{SAMPLE_FLAGS[k]} does not apply to a run of method {cfg.method.name}; its sample "
                              f"options: {', '.join(own) or 'none'} (and --n, --steps, --seed, --out)")
    if given.get("sampler") is not None:
        check_sampler_conditions(cfg.method.name, [given["sampler"]])


def sample_to_file(run, n=64, steps=None, cfg_scale=None, class_id=None, out=None, seed=0, sampler=None,
                   device="auto", ema=True, overrides=(), **options):
    """`genlab sample`: the run's method writes n samples (a PNG grid, a text file, a video) and says where.
    `overrides`: the run's sampling keys (e.g. method.cache_blocks=2,3), as `genlab eval` takes them."""
    check_sample_args(n, steps, cfg_scale, options.get("temperature"), options.get("top_k"), sampler, options.get("length"))
    for o in overrides:
        if o.strip().startswith("eval."):
            raise GenlabError(f"override '{o}': genlab sample reads no eval.* key (they set how genlab eval scores); "
                              "it takes the run's sampling keys, e.g. method.cache_blocks=auto, and --n, --steps, --cfg")
    cfg, model, method, dev, state = load_run(run, device, ema, overrides)
    if options.get("length") is not None and "length" not in method.sample_options:
        raise GenlabError(f"--length is for text runs (methods autoregressive, mdlm); this run's method is {cfg.method.name}")
    gen = torch.Generator(device=dev).manual_seed(seed)
    out = Path(out) if out else _run_dir(run) / "sample_grid.png"
    given = {k: v for k, v in (("class_id", class_id), ("cfg_scale", cfg_scale), ("sampler", sampler)) if v is not None}
    check_sample_options(cfg, method, {**given, **options})
    with sampling_precision(cfg, dev).autocast(dev):
        return method.sample_to_file(model, out, n=n, steps=steps, generator=gen, device=dev, **given, **options)


def evaluate_run(run, overrides=(), device="auto"):
    cfg, model, method, dev, state = load_run(run, device, True, overrides)
    nfe_table = _nfe_table_wanted(cfg, method)
    method.check_eval(cfg)  # weights of eval.metrics present before sampling
    check_data_on_disk(cfg)  # eval.val_path, before sampling
    data = build_dataset(cfg.data)
    ctx = eval_context(cfg, dev, _run_dir(run))
    with sampling_precision(cfg, dev).autocast(dev):
        return _evaluate(cfg, model, method, data, ctx, state, nfe_table)


def _evaluate(cfg, model, method, data, ctx, state, nfe_table):
    res = method.evaluate(model, data, ctx)
    if nfe_table:  # eval.nfe_list: the same evaluation per (sampler, NFE), as a table (eval/nfe.py)
        import sys
        res["nfe_table"] = nfe_rows(method, model, data, ctx, cfg)
        res["cost"] = cost_summary(ctx["run_dir"])
        res["nfe_grid"] = str(nfe_grid(method, model, ctx, cfg, ctx["run_dir"] / "eval_nfe.png"))
        print(write_table(res["nfe_table"], ctx["run_dir"], cfg.eval.cfg_scale, res["cost"], state["step"]),
              file=sys.stderr)
    res["step"] = state["step"]
    return res


def _nfe_table_wanted(cfg, method) -> bool:
    """eval.nfe_list set on a run whose components read it; its values are checked before any sampling."""
    if not cfg.eval.nfe_list or "eval.nfe_list" not in read_keys(cfg):
        return False
    parse_int_list(cfg.eval.nfe_list, "eval.nfe_list")
    samplers_of(cfg)
    return True
