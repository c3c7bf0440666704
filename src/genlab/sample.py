"""Sampling and evaluation of a finished run or checkpoint (`genlab sample`, `genlab eval`)."""
from __future__ import annotations

from pathlib import Path

import torch

from genlab import progress
from genlab.config import apply_overrides
from genlab.data import build_dataset
from genlab.errors import GenlabError
from genlab.train import checkpoint as ckpt
from genlab.train.parallel import resolve_device
from genlab.train.convert import apply_converters, converters_of
from genlab.train.step import build_model_and_method


# method keys that act only at sampling time (they change no weights), so eval may vary them on a trained run
SAMPLING_KEYS = ("method.sampler", "method.step_schedule", "method.sample_shift", "method.sde_noise", "method.cfg_interval",
                 "method.sample_steps", "method.sample_temperature", "method.quantize_frames")


def check_eval_overrides(overrides) -> None:
    """The weights fix the model, data and method: only evaluation and sampling settings may change."""
    for o in overrides:
        key = o.strip().split("=", 1)[0]
        if not (key.startswith("eval.") or key in SAMPLING_KEYS):
            raise GenlabError(f"override '{o}' is not allowed here: only eval.* keys (e.g. eval.num_samples=1000) "
                              f"and the sampling keys {', '.join(SAMPLING_KEYS)}")


def load_run(run_or_ckpt, device="auto", ema=True, overrides=()):
    """(config, model on the device in eval mode and converted as it trained, method, device, checkpoint state)."""
    from genlab.config_check import check_section
    from genlab.train.step import check_model_shapes
    state = ckpt.load_checkpoint(run_or_ckpt)
    if not isinstance(state.get("data_spec"), dict):
        raise GenlabError(f"'{run_or_ckpt}' is not a genlab checkpoint (no data spec)")
    cfg = ckpt.config_of(state)
    check_eval_overrides(overrides)
    apply_overrides(cfg, list(overrides))
    check_section(cfg, "eval")  # the rest was validated when the run was trained
    check_section(cfg, "method")
    dev = resolve_device(device)
    model, method = build_model_and_method(cfg, state["data_spec"])
    weights = state["ema"] if ema and state.get("ema") is not None else state["model"]
    check_model_shapes(model, weights, str(run_or_ckpt), verb="load")
    model.load_state_dict(weights)
    apply_converters(model.to(dev), converters_of(cfg), dev)  # a run trained converted samples converted
    return cfg, model.eval(), method, dev, state


def check_sample_args(n, steps=None, cfg_scale=None, temperature=None, top_k=None, sampler=None):
    """The sample command's numbers, before a checkpoint is opened or a file written."""
    for flag, v, ok, want in (("--n", n, n is not None and n >= 1, ">= 1"), ("--steps", steps, steps is None or steps >= 1, ">= 1"),
                              ("--cfg", cfg_scale, cfg_scale is None or cfg_scale >= 0, ">= 0"),
                              ("--temperature", temperature, temperature is None or temperature >= 0, ">= 0"),
                              ("--top-k", top_k, top_k is None or top_k >= 0, ">= 0")):
        if not ok:
            raise GenlabError(f"{flag} must be {want}, got {v}")
    if sampler is not None:
        from genlab.registry import all_registries
        all_registries()["sampler"].get(sampler)


def _run_dir(run_or_ckpt) -> Path:
    p = Path(run_or_ckpt)
    return p if p.is_dir() else p.parent.parent


def sample_images(method, model, labels, steps=None, cfg_scale=None, sampler=None, generator=None, device=None,
                  batch=256):
    """Images in [-1, 1], [n, C, H, W], drawn in batches; progress per sampler step where the method's
    sample() takes a callback (flow's ODE samplers), else per batch."""
    import inspect
    per_step = "callback" in inspect.signature(method.sample).parameters
    steps = steps or getattr(method.mcfg, "sample_steps", 1)
    n_batches = -(-len(labels) // batch)
    out = []
    with progress.Task(f"sampling {len(labels)} images", total=steps * n_batches if per_step else n_batches,
                       unit="step" if per_step else "batch") as task:
        for i in range(0, len(labels), batch):
            kw = {"callback": lambda *_: task.update()} if per_step else {}
            out.append(method.sample(model, labels[i:i + batch], steps=steps, cfg_scale=cfg_scale, sampler=sampler,
                                     generator=generator, device=device, **kw))
            if not per_step:
                task.update()
    return torch.cat(out)


def sample_to_file(run, n=64, steps=None, cfg_scale=None, class_id=None, out=None, seed=0, sampler=None,
                   device="auto", ema=True, **text_kwargs):
    check_sample_args(n, steps, cfg_scale, text_kwargs.get("temperature"), text_kwargs.get("top_k"), sampler)
    cfg, model, method, dev, state = load_run(run, device, ema)
    gen = torch.Generator(device=dev).manual_seed(seed)
    out = Path(out) if out else _run_dir(run) / "sample_grid.png"
    if hasattr(method, "sample_to_file"):  # non-image families write their own output (text, video)
        return method.sample_to_file(model, out, n=n, steps=steps, generator=gen, device=dev, **text_kwargs)
    k = state["data_spec"]["num_classes"]
    if class_id is not None and not (0 <= class_id < k):
        raise GenlabError(f"--class {class_id} out of range; this model has classes 0..{k - 1}")
    labels = torch.full((n,), class_id, device=dev) if class_id is not None else torch.arange(n, device=dev) % k
    from genlab.data.pixels import to_pixels
    from genlab.eval.image_quality import save_grid
    imgs = to_pixels(sample_images(method, model, labels, steps=steps, cfg_scale=cfg_scale, sampler=sampler,
                                  generator=gen, device=dev))
    cols = k if class_id is None and n % k == 0 and k <= 16 else int(n ** 0.5 + 0.999)
    rows = (n + cols - 1) // cols
    return save_grid(imgs, rows, cols, out)


def evaluate_run(run, overrides=(), device="auto"):
    cfg, model, method, dev, state = load_run(run, device, True, overrides)
    nfe_table = _nfe_table_wanted(cfg, method)
    getattr(method, "check_eval", lambda cfg: None)(cfg)  # weights of eval.metrics present before sampling
    data = build_dataset(cfg.data)
    ctx = {"eval": cfg.eval, "device": dev, "cfg": cfg, "run_dir": _run_dir(run),
           "generator": torch.Generator(device=dev).manual_seed(cfg.train.seed + 12345)}
    res = method.evaluate(model, data, ctx)
    if nfe_table:  # eval.nfe_list: the same evaluation per (sampler, NFE), as a table (eval/nfe.py)
        import sys
        from genlab.eval.nfe import nfe_rows, write_table
        res["nfe_table"] = nfe_rows(method, model, data, ctx, cfg)
        print(write_table(res["nfe_table"], ctx["run_dir"], cfg.eval.cfg_scale), file=sys.stderr)
    res["step"] = state["step"]
    return res


def _nfe_table_wanted(cfg, method) -> bool:
    """eval.nfe_list set on a flow run; its values are checked before any sampling."""
    from genlab.methods.flow import FlowMatching
    if not cfg.eval.nfe_list or not isinstance(method, FlowMatching):
        return False
    from genlab.eval.nfe import parse_int_list, samplers_of
    parse_int_list(cfg.eval.nfe_list, "eval.nfe_list")
    samplers_of(cfg)
    return True
