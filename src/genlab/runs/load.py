"""Sampling and evaluation of a finished run or checkpoint: the one entry of each for `genlab sample`, `genlab eval`
(and the sweeps that run it), the quantization gap and the API (api.py); loading is families/build.py's load_run."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from genlab.config.check import read_keys
from genlab.data.datasets import check_data_on_disk
from genlab.core.errors import GenlabError
from genlab.core.registry import all_registries
from genlab.data import build_dataset
from genlab.eval.cost import cost_summary
from genlab.eval.nfe import nfe_grid, nfe_rows, parse_int_list, samplers_of, write_table
from genlab.families.build import _run_dir, check_eval_overrides, load_run, model_from_state  # noqa: F401 (the front ends' loader)
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
    for flag, v, lo in (("--n", n, 1), ("--steps", steps, 1), ("--length", length, 1), ("--cfg", cfg_scale, 0),
                        ("--temperature", temperature, 0), ("--top-k", top_k, 0)):
        if (v is None and flag == "--n") or (v is not None and v < lo):  # None: the run's own setting (--n has none)
            raise GenlabError(f"{flag} must be >= {lo}, got {v}")
    if sampler is not None:
        all_registries()["sampler"].get(sampler)


# `genlab sample`'s per-method options, by the keyword the command passes to the family's render.sample_to_file
SAMPLE_FLAGS = {"class_id": "--class", "cfg_scale": "--cfg", "sampler": "--sampler", "prompt": "--prompt",
                "temperature": "--temperature", "top_k": "--top-k", "length": "--length", "complete": "--complete",
                "attention": "--attention"}


def check_sample_options(cfg, method, given: dict) -> None:
    """An option the run's method does not take (a text prompt to an image run) is refused, not ignored: it takes
    its draw() options and its renderer's own (--complete); a sampler must fit the model (a step-size sampler on a
    plain flow run)."""
    import inspect
    if method.render is None:
        raise GenlabError(f"method {cfg.method.name} writes no samples (it has no render module)")
    takes = set(method.sample_options) | set(inspect.signature(method.render.sample_to_file).parameters)
    for k in given:
        if k not in takes:
            own = [f for p, f in SAMPLE_FLAGS.items() if p in takes]
            raise GenlabError(f"{SAMPLE_FLAGS.get(k, k)} does not apply to a run of method {cfg.method.name}; its sample "
                              f"options: {', '.join(own) or 'none'} (and --n, --steps, --seed, --out)")
    if given.get("sampler") is not None:
        check_sampler_conditions(cfg.method.name, [given["sampler"]])


def sample_to_file(run, n=64, steps=None, cfg_scale=None, class_id=None, out=None, seed=0, sampler=None,
                   device="auto", ema=True, overrides=(), **options):
    """`genlab sample`: n samples of the run's method written by its family's render module (a PNG grid, a text file,
    a video); returns the path. `overrides`: the run's sampling keys (e.g. method.cache_blocks=2,3), as `genlab eval`
    takes them."""
    check_sample_args(n, steps, cfg_scale, options.get("temperature"), options.get("top_k"), sampler, options.get("length"))
    for o in overrides:
        if o.strip().startswith("eval."):
            raise GenlabError(f"override '{o}': genlab sample reads no eval.* key (they set how genlab eval scores); "
                              "it takes the run's sampling keys, e.g. method.cache_blocks=auto, and --n, --steps, --cfg")
    cfg, model, method, dev, state = load_run(run, device, ema, overrides)
    if method.render is None:  # an encoder (mae_encoder): one line, not a traceback
        raise GenlabError(f"method {type(method).__name__} trains no generator: its runs have no samples to draw")
    if options.get("length") is not None and "length" not in method.sample_options:
        raise GenlabError(f"--length is for text runs (methods autoregressive, mdlm); this run's method is {cfg.method.name}")
    out = Path(out) if out else _run_dir(run) / "sample_grid.png"
    given = {k: v for k, v in (("class_id", class_id), ("cfg_scale", cfg_scale), ("sampler", sampler)) if v is not None}
    check_sample_options(cfg, method, {**given, **options})
    with sampling_precision(cfg, dev).autocast(dev):
        return method.render.sample_to_file(method, model, out, n=n, steps=steps, device=dev, **given, **options,
                                            generator=torch.Generator(device=dev).manual_seed(seed))


def draw(cfg, model, method, dev, n, seed=0, steps=None, **options):
    """The API's samples (Run.sample): method.draw as `genlab sample` draws, seeded and in the run's precision."""
    with sampling_precision(cfg, dev).autocast(dev):
        return method.draw(model, n, steps=steps, generator=torch.Generator(device=dev).manual_seed(seed), device=dev,
                           **options)


def evaluate_run(run, overrides=(), device="auto"):
    """`genlab eval` (the sweep harness runs it too): the run's evaluation, with eval.nfe_list its NFE table."""
    cfg, model, method, dev, state = load_run(run, device, True, overrides)
    nfe_table = _nfe_table_wanted(cfg, method)
    return evaluate_model(cfg, model, method, dev, eval_data(cfg, method), _run_dir(run), state, nfe_table,
                          report=report_name(overrides))


def report_name(overrides) -> str:
    """The tag of a report that a `genlab eval` writes into the run folder beside (never over) an earlier one, such as
    the training's own: `eval`, then each override's key leaf and value (`eval_sample_temperature-1`)."""
    parts = ["eval"] + [o.strip().split(".")[-1].replace("=", "-") for o in overrides if "=" in o]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in "_".join(parts))[:120]


def eval_data(cfg, method):
    """The data an evaluation scores against, once what needs no sampling is checked (eval.metrics' weights present,
    eval.val_path)."""
    method.check_eval(cfg)
    check_data_on_disk(cfg)
    return build_dataset(cfg.data)


def evaluate_model(cfg, model, method, dev, data, run_dir, state=None, nfe_table=False, report=None) -> dict:
    """A loaded model's evaluation in the run's training precision from a fresh fixed-seed context (`genlab eval`, the
    quantization gap); with nfe_table the same evaluation per (sampler, NFE), as a table (eval/nfe.py). `report` tags
    the report files the evaluation writes into run_dir, so they never replace the training's own."""
    ctx = eval_context(cfg, dev, run_dir, report=report)
    with sampling_precision(cfg, dev).autocast(dev):
        res = method.evaluate(model, data, ctx)
        if nfe_table:
            res["nfe_table"] = nfe_rows(lambda c: method.evaluate(model, data, c), ctx, cfg)
            res["cost"] = cost_summary(run_dir)
            res["nfe_grid"] = str(nfe_grid(lambda c: method.pixels(model, c), method.spec.get("num_classes", 0), ctx, cfg,
                                           run_dir / "eval_nfe.png"))
            print(write_table(res["nfe_table"], run_dir, cfg.eval.cfg_scale, res["cost"], state["step"]), file=sys.stderr)
    return res if state is None else {**res, "step": state["step"]}


def _nfe_table_wanted(cfg, method) -> bool:
    """eval.nfe_list set on a run whose components read it; its values are checked before any sampling."""
    if not cfg.eval.nfe_list or "eval.nfe_list" not in read_keys(cfg):
        return False
    parse_int_list(cfg.eval.nfe_list, "eval.nfe_list")
    samplers_of(cfg)
    return True
