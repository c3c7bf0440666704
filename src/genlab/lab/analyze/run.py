"""`genlab analyze RUN`: layer similarity, layer skipping and a cached-block sampler on a trained image flow run.
Everything is written into RUN/analysis/ (or --out): one CKA heat map per noise level, the skip plot, analysis.md and
analysis.json."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from genlab.data.datasets import check_data_on_disk
from genlab.core.errors import GenlabError
from genlab.core.files import write_atomic
from genlab.core.tables import markdown_table
from genlab.data import build_dataset
from genlab.data.pixels import to_model
from genlab.eval.classifier import get_classifier
from genlab.eval.metrics import image_metrics
from genlab.families.image_flow.flow import FlowMatching
from genlab.lab.analyze.cka import layer_similarity
from genlab.runs.load import _run_dir, load_run, sampling_precision
from genlab.runtime.parallel import unwrap
from genlab.sampling.block_cache import block_change, cached_blocks, forward_timer, parse_block_list, pick_cacheable, search_cacheable, step_schedule
from genlab.sampling.images import eval_context, generate
from genlab.sampling.skip import skip_blocks, skip_plans

WHAT = ("cka", "skip", "cache")


def parse_what(text: str) -> list[str]:
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    bad = [n for n in names if n not in WHAT]
    if not names or bad:
        raise GenlabError(f"--what must be a comma-separated subset of {','.join(WHAT)}, got {text!r}")
    return list(dict.fromkeys(names))


def parse_ts(text: str) -> list[float]:
    try:
        ts = [float(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        ts = []
    if not ts or any(not 0 <= t <= 1 for t in ts):
        raise GenlabError(f"--t must be comma-separated noise levels in [0, 1] (0 noise, 1 data), got {text!r}")
    return list(dict.fromkeys(ts))


HALF = "half"  # --cache-blocks half: the half of the blocks that changes least, not searched


def check_args(what, batch, t, cache_blocks, cache_every, cache_tol=1.1):
    """The command line, before a checkpoint is opened. --cache-blocks: None (auto, searched), HALF, or indices."""
    if batch < 2:
        raise GenlabError(f"--batch must be >= 2 (CKA centres over the batch), got {batch}")
    if cache_every < 2:
        raise GenlabError(f"--cache-every must be >= 2 (1 would never reuse), got {cache_every}")
    if not cache_tol >= 1:
        raise GenlabError(f"--cache-fd-tol must be >= 1 (the cached FD's allowed multiple of the unskipped FD), "
                          f"got {cache_tol}")
    if str(cache_blocks).strip() == HALF:
        return parse_what(what), parse_ts(t), HALF
    try:
        blocks = parse_block_list(cache_blocks, "--cache-blocks")
    except GenlabError:
        raise GenlabError(f"--cache-blocks must be 'auto', 'half' or comma-separated block indices >= 0, "
                          f"got {cache_blocks!r}") from None
    return parse_what(what), parse_ts(t), blocks


def _real_batch(data, n, device, seed=0):
    """n real images and labels, a fixed draw (seed 0) so analyses of two runs of one dataset see the same batch."""
    import numpy as np
    idx = np.sort(np.random.default_rng(seed).permutation(len(data))[:n])
    images = to_model(torch.as_tensor(np.asarray(data.images[idx])).to(device))
    return images, torch.as_tensor(np.asarray(data.labels)[idx], dtype=torch.long, device=device)


class Sampler:
    """Evaluation samples of one run, every variant from the same noise (a fresh fixed-seed generator each time)."""

    def __init__(self, cfg, method, model, data, device, run_dir):
        self.cfg, self.method, self.model, self.data, self.device, self.run_dir = cfg, method, model, data, device, run_dir
        self.precision = sampling_precision(cfg, device)  # as the run's own evaluations sampled
        self.labels = torch.arange(cfg.eval.num_samples, device=device) % data.spec["num_classes"]
        self.classifier = None  # (net, held-out accuracy), trained or loaded once for every variant

    def draw(self, desc, labels=None):
        ctx = eval_context(self.cfg, self.device, self.run_dir, classifier=self.classifier)
        labels = self.labels if labels is None else labels
        with self.precision.autocast(self.device):
            return generate(self.method, self.model, labels, ctx, self.cfg.eval.batch_size, desc=desc), ctx

    def score(self, desc):
        if self.classifier is None:
            self.classifier = get_classifier(self.data, device=self.device, epochs=self.cfg.eval.classifier_epochs)
        samples, ctx = self.draw(desc)
        m = image_metrics(samples, self.labels, self.data, ctx)
        return samples, {"feature_fd": m["feature_fd"], "sample_accuracy": m["sample_accuracy"],
                         "feature_fd_floor": m["feature_fd_floor"]}


def _skip_rows(sampler, base, ref_samples, ref, rows, save):
    """Each skip plan's scores appended to `rows`, then save(): a cut analysis keeps the rows it finished."""
    for name, idx in skip_plans(len(base.blocks)):
        if idx:
            with skip_blocks(base, idx):
                samples, m = sampler.score(f"analyze: skip {name}")
        else:
            samples, m = ref_samples, ref
        diff = (samples.float() - ref_samples.float()).abs().mean().item()
        rows.append({"skipped": name, "blocks": list(idx), **m, "fd_ratio": m["feature_fd"] / ref["feature_fd"],
                     "pixel_diff": diff})
        save()


def _save(out: Path, res: dict) -> None:
    """analysis.json and analysis.md as they stand, each replaced whole (a write to a temporary file, then a rename),
    so an analysis stopped by a time limit keeps every finished part and never leaves a half-written file."""
    for name, text in (("analysis.json", json.dumps(res, indent=1)), ("analysis.md", markdown(res))):
        write_atomic(out / name, text)


def _warm_up_and_pick(sampler, base, blocks, output_probe=False):
    """The warm-up sampling pass before the timed baseline, measuring each block's change between evaluations; with
    --cache-blocks half it also picks the half that changes least (docs/analyze.md)."""
    depth = len(base.blocks)
    with block_change(base, output_probe) as ch:
        sampler.draw("analyze: warm-up", sampler.labels[:sampler.cfg.eval.batch_size])
    change = {i: ch.get(i, float("inf")) for i in range(depth)}
    return (pick_cacheable(change, max(1, depth // 2)) if blocks == HALF else blocks), change, ch


def _cached_scores(sampler, base, ref, ref_seconds, desc, **cache) -> dict:
    with cached_blocks(base, **cache) as counts, forward_timer(base, sampler.device) as tm:
        _, m = sampler.score(desc)
    evaluations = counts["call"] + 1  # network evaluations; each evaluates every block once, or reuses it
    return {**m, "fd_ratio": m["feature_fd"] / ref["feature_fd"], "forward_seconds": tm["seconds"],
            "speedup": ref_seconds / tm["seconds"] if tm["seconds"] > 0 else float("nan"),
            "block_evals_saved": counts["reused"] / max(1, evaluations * len(base.blocks))}


def _search(sampler, base, ref, ref_seconds, change, every, tol):
    """--cache-blocks auto: the blocks whose cache keeps FD within tol x the unskipped FD (cache.search_cacheable).
    Returns them, the trail, and the scores of the kept set (its last trial pass, the fixed cache's row)."""
    scored = {}

    def score(blocks):
        scored[tuple(blocks)] = _cached_scores(sampler, base, ref, ref_seconds,
                                               f"analyze: cache search, blocks {','.join(map(str, blocks))}",
                                               indices=blocks, every=every)
        return scored[tuple(blocks)]
    kept, trail = search_cacheable(change, tol, score)
    return kept, trail, scored.get(tuple(kept))


def _cache_result(sampler, base, ref, ref_seconds, blocks, change, measured, every, fixed=None):
    """The fixed cache (these blocks, every `every` evaluations; `fixed`: already scored), then the step-aware
    schedule that reuses the same share of block evaluations, picked per evaluation from the warm-up's changes."""
    fixed = fixed or _cached_scores(sampler, base, ref, ref_seconds, "analyze: cached sampler", indices=blocks,
                                    every=every)
    plan = step_schedule(measured, fixed["block_evals_saved"], len(base.blocks))
    stepped = _cached_scores(sampler, base, ref, ref_seconds, "analyze: step-aware cache", indices=[], schedule=plan,
                             period=measured.evaluations)
    return {"blocks": blocks, "every": every, "change": change, **fixed, "baseline_forward_seconds": ref_seconds,
            "scheduled": {**stepped, "evaluations": measured.evaluations,
                          "reuse": {str(k): sorted(v) for k, v in plan.items()}}}


def analyze_run(run, what="cka,skip,cache", batch=64, t="0.1,0.5,0.9", device="auto", out=None, overrides=(),
                cache_blocks="auto", cache_every=2, cache_tol=1.1) -> dict:
    what, ts, blocks = check_args(what, batch, t, cache_blocks, cache_every, cache_tol)
    cfg, model, method, dev, state = load_run(run, device, True, overrides)
    base = unwrap(model)
    if not isinstance(method, FlowMatching) or not hasattr(base, "blocks") or not hasattr(base, "num_tokens"):
        raise GenlabError(f"genlab analyze needs an image flow-matching run (x_t = (1 - t) noise + t data, a backbone "
                          f"with blocks); this run is method {cfg.method.name}, model {cfg.model.name}")
    if isinstance(blocks, list) and max(blocks) >= len(base.blocks):
        raise GenlabError(f"--cache-blocks {max(blocks)} out of range; this model has blocks 0..{len(base.blocks) - 1}")
    method.cache_blocks = []  # every variant against the plain sampler, whatever the run's method.cache_blocks
    sampling = [w for w in what if w != "cka"]
    if sampling:
        cfg.eval.metrics = "accuracy,fd"  # the two numbers of the tables
        if cfg.eval.num_samples < 2:
            raise GenlabError(f"--what {','.join(sampling)} samples and scores eval.num_samples images; it must be "
                              f">= 2 (FD needs a covariance), got {cfg.eval.num_samples}")
        check_data_on_disk(cfg)
    out = Path(out) if out else _run_dir(run) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    data = build_dataset(cfg.data)
    if hasattr(data, "reference"):  # teacher pairs (reflow): the real images they came from, as its evaluation uses
        data = data.reference()
    res = {"run": str(run), "step": state["step"], "model": cfg.model.name, "depth": len(base.blocks),
           "method": cfg.method.name, "eval_samples": cfg.eval.num_samples, "sample_steps": cfg.eval.sample_steps,
           "sampler": cfg.method.sampler, "cfg_scale": cfg.eval.cfg_scale, "device": str(dev), "complete": False}
    if "cka" in what:
        images, labels = _real_batch(data, min(batch, len(data)), dev)
        gen = torch.Generator(device=dev).manual_seed(cfg.train.seed + 12345)
        sims = layer_similarity(method, base, images, labels, ts, gen)
        res["cka"] = {"batch": len(images), "tokens": base.num_tokens,
                      "by_t": {f"{t:g}": m.tolist() for t, m in sims.items()},
                      "plots": [p.name for p in cka_heatmaps(sims, out)]}
        _save(out, res)
    if sampling:
        sampler = Sampler(cfg, method, model, data, dev, _run_dir(run))
        if "cache" in what:
            blocks, change, measured = _warm_up_and_pick(sampler, base, blocks)
        with forward_timer(base, dev) as tm:
            ref_samples, ref = sampler.score("analyze: unskipped")
        res["reference"] = ref
        _save(out, res)
        if "skip" in what:
            res["skip"] = []
            _skip_rows(sampler, base, ref_samples, ref, res["skip"], lambda: _save(out, res))
            res["skip_plot"] = skip_plot(res["skip"], out).name
        if "cache" in what:
            search = fixed = None
            if blocks is None:
                blocks, search, fixed = _search(sampler, base, ref, tm["seconds"], change, cache_every, cache_tol)
            res["cache"] = (_cache_result(sampler, base, ref, tm["seconds"], blocks, change, measured, cache_every, fixed)
                            if blocks else {"blocks": [], "every": cache_every, "change": change})
            if search is not None:
                res["cache"]["search"] = {"fd_tol": cache_tol, "trail": search}
    res["complete"] = True
    _save(out, res)
    return {"out": str(out), **{k: res[k] for k in ("step", "depth") if k in res}}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save_figure(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def cka_stats(m: torch.Tensor) -> dict:
    """Mean CKA of neighbouring blocks (i, i + 1; high = the residual stream changes little per block), mean CKA of
    all pairs, and CKA of the first and last block."""
    off = m[~torch.eye(len(m), dtype=torch.bool)]
    return {"adjacent": float(torch.diagonal(m, 1).mean()) if len(m) > 1 else float("nan"),
            "all_pairs": float(off.mean()) if len(off) else float("nan"), "first_last": float(m[0, -1])}


def heatmap(ax, m):
    """A CKA matrix on one colour scale (0..1), block indices on both axes (never 0.5 steps)."""
    from matplotlib.ticker import MaxNLocator
    im = ax.imshow(m.numpy(), vmin=0, vmax=1, cmap="magma", origin="lower")
    ax.set_xlabel("block")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    return im


def cka_heatmaps(sims: dict, out: Path) -> list[Path]:
    plt = _plt()
    paths = []
    for t, m in sims.items():
        fig, ax = plt.subplots(figsize=(4.8, 4.2))
        im = heatmap(ax, m)
        ax.set_ylabel("block")
        ax.set_title(f"linear CKA of block outputs, t = {t:g} (0 noise, 1 data)", fontsize=8)
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        paths.append(_save_figure(fig, out / f"cka_t{t:g}.png"))
    return paths


def skip_plot(rows: list[dict], out: Path) -> Path:
    """Feature FD (relative to the unskipped model) and sample accuracy per skipped block or run of blocks."""
    plt = _plt()
    names = [r["skipped"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 0.3 * len(rows) + 1.6), sharey=True)
    a.barh(names, [r["fd_ratio"] for r in rows], color="tab:blue")
    a.axvline(1.0, color="k", lw=0.8)
    a.set(xlabel="feature FD / FD of the unskipped model", xscale="log")
    b.barh(names, [100 * r["sample_accuracy"] for r in rows], color="tab:green")
    b.set_xlabel("sample accuracy %")
    a.invert_yaxis()
    fig.tight_layout()
    return _save_figure(fig, out / "skip.png")


def _table(head, rows) -> list[str]:
    return markdown_table(head, rows).splitlines()


def markdown(res: dict) -> str:
    lines = [f"# Layer analysis of {res['run']} (step {res['step']})", "",
             f"Model {res['model']} with {res['depth']} blocks, method {res['method']}, device {res['device']}. "
             "See docs/analyze.md for what each number means.", ""]
    if not res.get("complete", True):
        lines += ["**Partial:** the analysis is still running or was stopped; the sections below are the finished "
                  "parts.", ""]
    if "cka" in res:
        c = res["cka"]
        lines += ["## Layer similarity (linear CKA)", "",
                  f"One batch of {c['batch']} real images noised to each t, {c['tokens']} grid tokens per image; "
                  "rows = sample x token, centred.", ""]
        rows = []
        for t, m in c["by_t"].items():
            st = cka_stats(torch.tensor(m))
            rows.append([t, f"{st['adjacent']:.3f}", f"{st['all_pairs']:.3f}" if len(m) > 1 else "-",
                         f"{st['first_last']:.3f}", f"cka_t{t}.png"])
        lines += _table(["t", "mean CKA, adjacent blocks", "mean CKA, all pairs", "CKA first-last", "heat map"], rows)
        lines.append("")
    if "reference" in res:
        r = res["reference"]
        lines += [f"Sampling: {res['eval_samples']} samples, {res['sample_steps']} steps, CFG {res['cfg_scale']:g}; "
                  f"the unskipped model: feature FD {r['feature_fd']:.4g} (real-vs-real floor {r['feature_fd_floor']:.4g}), "
                  f"sample accuracy {100 * r['sample_accuracy']:.1f}%.", ""]
    if "skip" in res:
        lines += ["## Layer skipping (identity blocks at sampling time)", ""]
        lines += _table(["skipped", "feature FD", "FD / unskipped", "sample accuracy", "mean |Δ pixel| vs unskipped"],
                        [[r["skipped"], f"{r['feature_fd']:.4g}", f"{r['fd_ratio']:.3g}",
                          f"{100 * r['sample_accuracy']:.1f}%", f"{r['pixel_diff']:.2f}"] for r in res["skip"]])
        lines += ["", f"Plot: {res['skip_plot']}" if "skip_plot" in res else "", ""]
    if "cache" in res:
        lines += _cache_lines(res["cache"], res["reference"])
    return "\n".join(lines) + "\n"


def _cache_lines(c: dict, ref: dict) -> list[str]:
    """The cached-block sampler's section: the search (auto), the cached rows against the plain sampler, the hint."""
    lines = ["## Cached-block sampler", ""]
    if "search" in c:
        sr = c["search"]
        lines += [f"Blocks searched (`--cache-blocks auto`): in order of least change, each kept if caching it with the "
                  f"blocks kept so far keeps FD within {sr['fd_tol']:g}x the unskipped FD: "
                  + "; ".join(f"{t['block']}: {t['fd_ratio']:.3g} {'kept' if t['kept'] else 'left out'}"
                              for t in sr["trail"]) + ".", ""]
    if not c["blocks"]:
        lines += ["No block can be cached within the tolerance: there is no cached sampler to measure.", ""]
    else:
        lines += [f"Blocks {', '.join(map(str, c['blocks']))} recompute every {c['every']} network evaluations and reuse "
                  "their last residual contribution in between.", ""]
        rows = [["every block computed", f"{ref['feature_fd']:.4g}", "1", f"{100 * ref['sample_accuracy']:.1f}%",
                 f"{c['baseline_forward_seconds']:.3g}", "1"]]
        for name, r in (("cached", c), ("step-aware schedule, same share", c.get("scheduled"))):
            if r:
                rows.append([name, f"{r['feature_fd']:.4g}", f"{r['fd_ratio']:.3g}", f"{100 * r['sample_accuracy']:.1f}%",
                             f"{r['forward_seconds']:.3g}", f"{r['speedup']:.2f}x"])
        lines += _table(["sampler", "feature FD", "FD / unskipped", "sample accuracy", "network seconds", "speed-up"], rows)
        lines += ["", f"Block evaluations saved: {100 * c['block_evals_saved']:.0f}% (the ideal speed-up of the blocks' "
                  "share of the forward)."]
        if "scheduled" in c:
            sc = c["scheduled"]
            lines += ["", f"The step-aware schedule reuses {100 * sc['block_evals_saved']:.0f}% of the block evaluations "
                      f"too, but picks them per evaluation (of {sc['evaluations']} per pass), greedily by the drift each "
                      "reuse adds (a block's summed change in the warm-up pass since it last computed), as "
                      "Learning-to-Cache's router is per timestep (read off one measured pass here, not trained). "
                      "Reused blocks by evaluation: "
                      + ("; ".join(f"{k}: {','.join(map(str, v))}" for k, v in sc["reuse"].items()) or "none") + "."]
        lines += ["",
                  "Sample or evaluate with the fixed cache: `genlab sample RUN method.cache_blocks="
                  f"{','.join(str(b) for b in c['blocks'])} method.cache_every={c['every']}` (or `genlab eval`; "
                  "`method.cache_blocks=auto` reads the blocks from RUN/analysis/analysis.json); with the step-aware "
                  "schedule: `genlab sample RUN method.cache_schedule=auto` (the same sampler and steps as this "
                  "analysis)."]
    if c.get("change"):
        lines += ["", "Mean relative change of each block's contribution between consecutive evaluations: "
                  + ", ".join(f"{i}: {v:.3g}" for i, v in c["change"].items()), ""]
    return lines
