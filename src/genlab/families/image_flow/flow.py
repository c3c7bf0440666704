"""Rectified flow / flow matching (Liu et al. 2022; Lipman et al. 2022; minRF): x_t = (1 - t) noise + t data, the model
predicts v = data - noise. `interpolate` is the only place x_t is built, so the clean image cannot reach the model.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.config.check import batched_label, is_batched
from genlab.core.errors import GenlabError
from genlab.eval.image_quality import evaluate_class_conditional
from genlab.eval.metrics import EvalImageKeys, check_metrics
from genlab.eval.nfe import parse_int_list, samplers_of
from genlab.families.base import Extra, Method, method_registry
from genlab.families.baselines import Baseline, mean_element_variance, training_images
from genlab.families.image_flow import render
from genlab.families.image_flow.dit import dit_size
from genlab.families.image_flow.loss_weighting import loss_weighting_registry
from genlab.families.image_flow.timesteps import (PROBE_SAMPLES, PROBE_TIMES, AdaptiveTimesteps, resolve_shift, shift_time,
                                                  timestep_sampler_registry)
from genlab.runtime.parallel import unwrap  # noqa: F401 (re-exported for the flow-based methods)
from genlab.sampling.block_cache import cached_blocks, parse_block_list
from genlab.sampling.images import SAMPLE_COMPILE_MODES, compiled_for_sampling, generate, sample_images
from genlab.sampling.samplers import call_sampler, nfe_per_step, sampler_registry, time_grid


def interpolate(noise: torch.Tensor, data: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    t = t.view(-1, *([1] * (data.ndim - 1))).to(data.dtype)
    return (1 - t) * noise + t * data


def parse_interval(text: str, key: str = "method.cfg_interval") -> tuple[float, float]:
    """"lo,hi" -> (lo, hi) with 0 <= lo < hi <= 1."""
    try:
        lo, hi = (float(v) for v in str(text).split(","))
    except ValueError:
        raise GenlabError(f"{key} must be two numbers 'lo,hi' in [0, 1] (e.g. 0.15,0.8), got {text!r}") from None
    if not 0 <= lo < hi <= 1:
        raise GenlabError(f"{key} must satisfy 0 <= lo < hi <= 1, got {text!r}")
    return lo, hi


def guidance_plan(sampler_fn, ts_host: torch.Tensor, interval: tuple[float, float]) -> list[bool] | None:
    """In call order, whether each network evaluation of `sampler_fn` over the host grid `ts_host` falls inside the
    guidance interval (None for the whole path). Every registered sampler evaluates at times set by the grid alone,
    not by x, so a replay on a one-element CPU tensor finds them without reading the device: cfg_velocity then
    chooses one forward or two per call with no host synchronisation."""
    if interval == (0.0, 1.0):
        return None
    lo, hi = interval
    plan = []

    def probe(x, t, **_):
        plan.append(lo <= float(t[0]) <= hi)
        return torch.zeros_like(x)
    call_sampler(sampler_fn, probe, torch.zeros(1, 1), ts_host, generator=torch.Generator(), noise=0.0)
    return plan


def cfg_velocity(model, y, null_class: int, scale: float, interval: tuple[float, float] = (0.0, 1.0),
                 plan: list[bool] | None = None):
    """Velocity field with classifier-free guidance, v_u + s (v_c - v_u) in one batch, only for t in `interval`
    (Kynkaanniemi et al. 2024; the conditional velocity alone elsewhere); extra conditions pass through. `plan`
    (guidance_plan) says per call whether its t is inside; without it each call reads t back from the device."""
    if y is None:
        return lambda x, t, **cond: model(x, t, torch.full((x.shape[0],), null_class, device=x.device, dtype=torch.long),
                                          **cond)
    if scale == 1.0:
        return lambda x, t, **cond: model(x, t, y, **cond)
    lo, hi = interval
    limited = (lo, hi) != (0.0, 1.0)
    planned = iter(plan or ())

    def velocity(x, t, **cond):
        inside = None
        if limited:
            guide = next(planned, None)  # the host's replay of this call's time (None: past the plan, or none given)
            if guide is None:
                inside = (t >= lo) & (t <= hi)
                guide = bool(inside.any())  # a host sync
            if not guide:
                return model(x, t, y, **cond)
        y_null = torch.full_like(y, null_class)
        twice = {k: torch.cat([c, c]) if torch.is_tensor(c) and c.ndim > 0 else c for k, c in cond.items()}  # scalars stay
        v = model(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, y_null]), **twice)
        v_c, v_u = v.chunk(2)
        guided = v_u + scale * (v_c - v_u)
        return guided if inside is None else torch.where(inside.view(-1, *([1] * (x.ndim - 1))), guided, v_c)
    return velocity


# the method keys that act only at sampling time: `genlab eval` / `genlab sample` may change them on a trained run
FLOW_SAMPLING = ("method.sampler", "method.step_schedule", "method.cfg_interval", "method.sample_steps", "method.cfg_scale",
                 "method.cache_blocks", "method.cache_every", "method.cache_schedule")
MEAN_VELOCITY = "velocity loss of predicting the mean velocity"
WEIGHT_DRAWS = 1 << 16  # training times the mean loss weight is estimated over


def check_flow_config(cfg):
    """Flow options that a field declaration cannot check alone, before any work."""
    keys = FlowEvalKeys.of(cfg.eval)
    m = cfg.method
    parse_interval(m.cfg_interval)
    cached_block_plan(cfg)
    cache_schedule_plan(cfg)
    samplers = [m.sampler]
    if keys.nfe_list:
        parse_int_list(keys.nfe_list, "eval.nfe_list")
        samplers += samplers_of(cfg)
    check_sampler_conditions(cfg.method.name, samplers)
    if is_batched(cfg) and m.timestep_sampler == "adaptive":
        raise GenlabError(f"{batched_label(cfg)} does not support method.timestep_sampler=adaptive (its sampler state is "
                          "a per-run extra module); pick another timestep sampler or train the runs one by one")
    if cfg.train.graph_step == "true" and m.timestep_sampler == "adaptive":
        raise GenlabError("train.graph_step=true does not support method.timestep_sampler=adaptive (it updates its "
                          "density from the host every few steps, which a captured step would freeze); pick another "
                          "timestep sampler or drop train.graph_step")
    if m.lq_threshold >= m.lq_linear_frac and ("linear_quadratic" in (m.timestep_sampler, m.step_schedule)):
        raise GenlabError(f"method.lq_threshold ({m.lq_threshold}) must be below method.lq_linear_frac "
                          f"({m.lq_linear_frac}): the quadratic part must rise from it to t=1")


class FlowMatching(Method):
    batch_keys = ("image", "label")
    render = render  # the family's pictures (image_flow/render.py)
    sample_options = ("class_id", "labels", "cfg_scale", "sampler")
    data_kinds = ("image", "latent")  # autoencoder latents too (data.name=latents): samples decoded in sampling/images.py
    model_families, sampling_keys, output = ("image",), FLOW_SAMPLING, "velocity"
    batched_seeds = final_loss = graph_step = True
    flow_metric = "loss"  # the logged value that is the velocity loss (methods that add a term log it apart)

    check_config = staticmethod(check_flow_config)

    def __init__(self, cfg, data_spec):
        self.cfg, self.spec = cfg, data_spec
        self.mcfg = m = cfg.method
        self.class_dropout = ClassDropoutKeys.of(cfg.model).class_dropout
        self.adaptive = None
        if m.timestep_sampler == "adaptive":
            self.adaptive = AdaptiveTimesteps(m.adaptive_bins, m.adaptive_lr, m.adaptive_every, m.adaptive_mix,
                                              m.adaptive_entropy, seed=cfg.train.seed)
        else:
            self.sample_t = timestep_sampler_registry.get(m.timestep_sampler)
        self.shift = resolve_shift(m.time_shift, data_spec["image_size"], m.shift_base)
        self.weight = loss_weighting_registry.get(m.loss_weighting)
        self.cfg_interval = parse_interval(m.cfg_interval)
        self.cache_blocks = cached_block_plan(cfg)  # sampling only: blocks reusing their last residual (sampling/block_cache.py)
        self.cache_schedule = cache_schedule_plan(cfg)  # sampling only: (period, {evaluation: blocks}) or None
        # model.final_kernel (dit only): the backbone computes the loss from the target (nn/fused_final.py)
        self.fused_final = cfg.model.final_kernel != "plain"
        self.sampling_nets = {}  # (id(model), eval.sample_compile) -> the network evaluation samples with (pixels)

    def extra_modules(self):
        # the adaptive sampler's state is a frozen extra: checkpointed and restored with the run
        return {"timesteps": Extra(self.adaptive, trainable=False)} if self.adaptive is not None else {}

    def draw_t(self, B, generator, device, step=None):
        """Training times: the configured sampler, then the resolution shift."""
        t = self.adaptive.draw(B, generator, device, step) if self.adaptive is not None else \
            self.sample_t(B, generator, device, self.mcfg)
        return shift_time(t, self.shift)

    def _probe(self, model, data, y, generator):
        """The adaptive sampler's look-ahead set: a few images of the batch at random times, fixed noise."""
        n = min(PROBE_SAMPLES, data.shape[0])
        x = data[:n].repeat(PROBE_TIMES, *([1] * (data.ndim - 1)))
        t = shift_time(torch.rand(x.shape[0], generator=generator, device=data.device), self.shift)
        noise = torch.randn(x.shape, generator=generator, device=data.device, dtype=data.dtype)
        return interpolate(noise, x, t), t, y[:n].repeat(PROBE_TIMES), (x - noise).float()

    def noised(self, model, data, y, generator, step):
        """(t, noise, x_t, labels with class dropout) for one batch, drawn in this order from `generator`."""
        t = self.draw_t(data.shape[0], generator, data.device, step)
        noise = torch.randn(data.shape, generator=generator, device=data.device, dtype=data.dtype)
        return t, noise, interpolate(noise, data, t), self.drop_labels(model, y, generator)

    def drop_labels(self, model, y, generator):
        """Labels dropped to the null class at model.class_dropout (what trains the unconditional velocity of CFG)."""
        if self.class_dropout <= 0:
            return y
        drop = torch.rand(len(y), generator=generator, device=y.device) < self.class_dropout
        return torch.where(drop, torch.full_like(y, unwrap(model).null_class), y)

    def loss(self, model, batch, ctx):
        generator = ctx.generator
        data, y = batch["image"], batch["label"]
        if self.adaptive is not None:
            def probe_loss(p):
                with torch.no_grad():
                    return F.mse_loss(model(p[0], p[1], p[2]).float(), p[3])
            self.adaptive.step_probe(ctx.step, probe_loss, lambda: self._probe(model, data, y, generator))
        return self.loss_from(model, self.loss_inputs(model, batch, ctx))

    def loss_inputs(self, model, batch, ctx) -> dict:
        """Every random draw of one loss (t, noise, dropped labels), in the generator order `noised` fixes."""
        data = batch["image"]
        t, noise, x_t, y = self.noised(model, data, batch["label"], ctx.generator, ctx.step)
        return {"x_t": x_t, "t": t, "y": y, "target": data - noise}

    def loss_from(self, model, inputs: dict):
        """The loss given the draws: deterministic, so train.seeds can run it under torch.vmap."""
        keys = FlowMethodKeys.of(self.mcfg)
        if self.fused_final and isinstance(model, torch.nn.Module):
            # the final layer + loss fused in the backbone (not under torch.vmap's functional closure: no rule there)
            weight = None if keys.loss_weighting == "none" else self.weight(inputs["t"].float(), self.mcfg)
            return model(inputs["x_t"], inputs["t"], inputs["y"], loss_target=inputs["target"], loss_weight=weight), {}
        v = model(inputs["x_t"], inputs["t"], inputs["y"])
        target = inputs["target"].float()
        if keys.loss_weighting == "none":
            return F.mse_loss(v.float(), target), {}
        per_sample = (v.float() - target).square().flatten(1).mean(1)
        return (self.weight(inputs["t"].float(), self.mcfg) * per_sample).mean(), {}

    def trivial_baselines(self, data, generator):
        return [Baseline(self.flow_metric, self.mean_velocity_loss(data, generator), MEAN_VELOCITY)]

    def mean_velocity_loss(self, data, generator, weighted: bool = True) -> float:
        """The velocity loss of the best constant prediction, E[w(t)] (Var(data) + 1), E[w] over WEIGHT_DRAWS times."""
        var = mean_element_variance(training_images(data, generator, self.cfg.data.hflip))
        w = 1.0
        if weighted and self.mcfg.loss_weighting != "none":
            w = float(self.weight(self.draw_t(WEIGHT_DRAWS, generator, "cpu").double(), self.mcfg).mean())
        return w * (var + 1.0)

    @torch.no_grad()
    def sample(self, model, labels: torch.Tensor | None, n: int | None = None, steps: int | None = None,
               cfg_scale: float | None = None, sampler: str | None = None, generator=None, device=None, callback=None,
               conditions: dict | None = None):
        """Draw samples in [-1, 1] of shape [n, C, H, W]; labels None = unconditional; `conditions`: the model's
        extra named inputs (default: `sample_conditions`). `callback(i, t, x, denoised)` runs after every step."""
        keys = FlowMethodKeys.of(self.mcfg)
        base = unwrap(model)
        device = device or next(base.parameters()).device
        n = len(labels) if labels is not None else n
        C, S = self.spec["channels"], self.spec["image_size"]
        x = torch.randn((n, C, S, S), generator=generator, device=device)
        sampler = sampler or keys.sampler
        steps = steps or keys.sample_steps
        plan = guidance_plan(sampler_registry.get(sampler), time_grid(steps, "cpu", keys.step_schedule, self.mcfg),
                             self.cfg_interval)
        velocity = cfg_velocity(model, labels, base.null_class, keys.cfg_scale if cfg_scale is None else cfg_scale,
                                self.cfg_interval, plan)
        ts = time_grid(steps, device=device, schedule=keys.step_schedule, cfg=self.mcfg)
        extra = self.sample_conditions(n, device) if conditions is None else conditions
        with self._block_cache(base, sampler, len(ts) - 1):
            return call_sampler(sampler_registry.get(sampler), velocity, x, ts, callback=callback,
                                extra_args=extra, generator=generator, noise=self.mcfg.sde_noise)

    def _block_cache(self, base, sampler: str, steps: int):
        """method.cache_blocks or method.cache_schedule around one sampling call (sampling/block_cache.py)."""
        if self.cache_schedule:
            self.check_cache_schedule(steps, sampler)
            return cached_blocks(base, [], schedule=self.cache_schedule[1], period=self.cache_schedule[0])
        if self.cache_blocks:
            return cached_blocks(base, self.cache_blocks, FlowMethodKeys.of(self.mcfg).cache_every)
        return contextlib.nullcontext()

    def check_cache_schedule(self, steps: int, sampler: str) -> None:
        """A cache plan is indexed by network evaluation: another count per sample is refused."""
        period, per_step = self.cache_schedule[0], nfe_per_step(sampler)
        nfe = steps * per_step
        if nfe != period:
            fit = (f"{sampler} at {period // per_step} steps (genlab sample --steps {period // per_step}, genlab eval "
                   f"eval.sample_steps={period // per_step})" if period % per_step == 0 else "another sampler")
            raise GenlabError(f"method.cache_schedule is a plan for {period} network evaluations per sample, and "
                              f"sampler {sampler} at {steps} steps makes {nfe}: sample with {fit}, or run `genlab "
                              f"analyze RUN --what cache` with these")

    def sample_conditions(self, n: int, device) -> dict:
        """The extra model inputs at sampling time (a subclass that adds a condition returns its value here)."""
        return {}

    def check_eval(self, cfg) -> None:
        """Before training or sampling: eval.metrics (and their weights), and a cache schedule that fits the eval."""
        if self.cache_schedule and cfg.eval.num_samples > 0:
            if str(cfg.eval.nfe_list).strip():
                raise GenlabError("eval.nfe_list samples at several NFEs and method.cache_schedule is a plan for one; "
                                  "drop one of them (method.cache_blocks works at any NFE)")
            self.check_cache_schedule(cfg.eval.sample_steps, cfg.method.sampler)
        if cfg.eval.num_samples > 0:
            check_metrics(cfg.eval)
        if cfg.eval.sample_compile != "off" and (self.cache_schedule or self.cache_blocks):
            raise GenlabError(f"eval.sample_compile={cfg.eval.sample_compile} compiles the whole network and the block "
                              "cache (method.cache_blocks / cache_schedule) hooks its blocks: use one of them")

    def evaluate(self, model, data, ctx) -> dict:
        return evaluate_class_conditional(self.pixels(model, ctx), data, ctx)

    def pixels(self, model, ctx):
        """generate(labels, desc) -> uint8 pixels on the CPU, drawn as ctx's evaluation says: what eval/ takes."""
        def draw(labels, desc="sampling"):
            key = (id(model), ctx["eval"].sample_compile)  # the entry holds the model, so its id stays its own
            if key not in self.sampling_nets:  # built at the first evaluation, reused by the later ones
                self.sampling_nets[key] = compiled_for_sampling(model, key[1])
            return generate(self, self.sampling_nets[key], labels, ctx, ctx["eval"].batch_size, desc)
        return draw

    def labels_for(self, n: int, class_id=None, labels=None, device=None) -> torch.Tensor:
        """The class of each of n samples: `labels`, or one class, or cycling over the classes."""
        k = self.spec.get("num_classes", 0)
        if labels is None:
            if class_id is not None and not 0 <= class_id < k:
                raise GenlabError(f"--class {class_id} (class_id) out of range; this model has classes 0..{k - 1}")
            labels = torch.full((n,), class_id) if class_id is not None else torch.arange(n) % max(k, 1)
        return torch.as_tensor(labels, dtype=torch.long, device=device)

    def draw(self, model, n, *, steps=None, generator=None, device=None, class_id=None, labels=None, cfg_scale=None,
             sampler=None):
        return sample_images(self, model, self.labels_for(n, class_id, labels, device), steps=steps, cfg_scale=cfg_scale,
                             sampler=sampler, generator=generator, device=device)


def check_sampler_conditions(method_name: str, samplers) -> None:
    """A sampler that feeds the model a condition (a step size) needs a model built with it, and a model built
    with such a condition needs a sampler that feeds it."""
    have = method_registry.get(method_name).conditions or {}
    owned = {s.condition for _, s in sampler_registry.specs() if s.condition} & set(have)
    fits = [n for n, s in sampler_registry.specs() if (not s.condition or s.condition in have)
            and owned <= {s.condition}]
    for name in samplers:
        need = sampler_registry.spec(name).condition
        if need and need not in have:
            raise GenlabError(f"sampler '{name}' feeds the model a '{need}' input that method {method_name} does not "
                              f"train; samplers for it: {', '.join(fits)}")
        if owned - {need}:
            raise GenlabError(f"sampler '{name}' does not feed the model the '{sorted(owned - {need})[0]}' input that "
                              f"method {method_name} trains with; samplers for it: {', '.join(fits)}")


def cached_block_plan(cfg) -> list[int]:
    """method.cache_blocks as block indices ([] = off) within the model's depth (`auto` is resolved before)."""
    text = str(FlowMethodKeys.of(cfg.method).cache_blocks).strip()
    if not text:
        return []
    if text == "auto":
        raise GenlabError("method.cache_blocks=auto takes the blocks `genlab analyze RUN --what cache` picked, so it is "
                          "for genlab eval / genlab sample of an analysed run; give indices here, e.g. method.cache_blocks=2,3")
    idx = parse_block_list(text, "method.cache_blocks", auto=False)
    depth = dit_size(cfg.model)[1]
    if idx[-1] >= depth:
        raise GenlabError(f"method.cache_blocks={text}: block {idx[-1]} out of range; this model has blocks 0..{depth - 1}")
    return idx


def cache_schedule_plan(cfg) -> tuple[int, dict[int, frozenset[int]]] | None:
    """method.cache_schedule 'P/k:b,b;k:b' as (P, {k: blocks}) (None = off; docs/analyze.md); `auto` is resolved
    from the run's analysis before a model is built."""
    keys = FlowMethodKeys.of(cfg.method)
    text = str(keys.cache_schedule).strip()
    if not text:
        return None
    key = "method.cache_schedule"
    if text == "auto":
        raise GenlabError(f"{key}=auto takes the step-aware schedule `genlab analyze RUN --what cache` measured, so it "
                          "is for genlab eval / genlab sample of an analysed run; give a plan here, e.g. "
                          f"{key}=20/2:0,1;4:0")
    if str(keys.cache_blocks).strip():
        raise GenlabError(f"method.cache_blocks and {key} are two ways to cache blocks; set one of them")
    depth = dit_size(cfg.model)[1]
    bad = GenlabError(f"{key} must be 'P/k:b,b;k:b' (P network evaluations per sample; at evaluation k, 1 <= k < P, "
                      f"blocks b reuse their last residual), got {text!r}")
    period, _, pairs = text.partition("/")
    try:
        period = int(period)
        plan = {}
        for part in filter(None, (x.strip() for x in pairs.split(";"))):
            k, _, blocks = part.partition(":")
            plan[int(k)] = frozenset(int(b) for b in blocks.split(",") if b.strip())
    except ValueError:
        raise bad from None
    if period < 2 or not plan or any(not 1 <= k < period or not b for k, b in plan.items()):
        raise bad
    top = max(max(b) for b in plan.values())
    if min(min(b) for b in plan.values()) < 0 or top >= depth:
        raise GenlabError(f"{key}={text}: block {top} out of range; this model has blocks 0..{depth - 1}")
    return period, dict(sorted(plan.items()))


class FlowMethodKeys(cf.Keys, section="method"):
    timestep_sampler: str = cf.F("logit_normal", "flow: distribution of training times t (t=0 noise, t=1 data)", registry="timestep_sampler")
    time_shift: float = cf.F(1.0, "flow: SD3 resolution shift of training times, t/(s(1-t)+t) (1 = none, > 1 toward noise; "
                                        "0 = sqrt(pixels / method.shift_base^2))", ge=0)
    shift_base: int = cf.F(32, "flow, time_shift=0: side of the base image n of SD3's shift sqrt(m/n)", ge=1)
    loss_weighting: str = cf.F("none", "flow: per-sample weight w(t) of the velocity loss", registry="loss_weighting")
    sampler: str = cf.F("heun", "flow: ODE/SDE sampler", registry="sampler")
    step_schedule: str = cf.F("uniform", "flow: grid of sampler times from noise (0) to data (1)", registry="step_schedule")
    cfg_interval: str = cf.F("0,1", "flow: guidance only for t in [lo, hi], conditional velocity elsewhere (Kynkaanniemi et al. "
                                        "2024; their EDM sigma interval (0.28, 5.42] is t = 1/(1+sigma) in [0.16, 0.78))", free="two numbers 'lo,hi' with 0 <= lo < hi <= 1")
    sample_steps: int = cf.F(20, "flow, mdlm: sampler steps for previews", ge=1)
    cfg_scale: float = cf.F(2.0, "flow: classifier-free guidance scale for previews (1 = none)", ge=0)
    cache_blocks: str = cf.F("", "flow, sampling: blocks that reuse their residual contribution between network evaluations "
                                 "(Learning-to-Cache style, docs/analyze.md; empty = off; genlab eval/sample: auto = the blocks "
                                 "`genlab analyze RUN --what cache` picked)", free="empty, auto, or comma-separated block indices")
    cache_every: int = cf.F(2, "flow, with method.cache_blocks: the cached blocks recompute every N network evaluations", ge=2)
    cache_schedule: str = cf.F("", "flow, sampling: a step-aware cache plan, 'P/k:b,b;k:b' = at network evaluation k of the "
                                   "P per sample, blocks b reuse their last residual (docs/analyze.md; empty = off; genlab "
                                   "eval/sample: auto = the schedule `genlab analyze RUN --what cache` measured)",
                               free="empty, auto, or 'P/k:b,b;k:b'")


class FlowEvalKeys(cf.Keys, section="eval"):
    sample_steps: int = cf.F(20, "flow: sampler steps in evaluation", ge=1)
    cfg_scale: float = cf.F(2.0, "flow: guidance scale in evaluation", ge=0)
    sample_compile: str = cf.F("off", "flow: torch.compile the network for evaluation sampling (reduce-overhead: also a "
                                      "CUDA graph per batch shape; docs/performance.md: Sampling at FID scale)",
                               choices=SAMPLE_COMPILE_MODES)
    grid_per_class: int = cf.F(10, "flow: columns of the sample grid", ge=1)
    metrics: str = cf.F("accuracy,fd,pr", "flow: image metrics of each evaluation (fid, sfid, inception_score, pr_inception and lpips need downloaded weights; README: Evaluation metrics, docs/fid.md)", free="comma-separated names of registry `eval_metric`: accuracy, fd, fid, inception_score, lpips, pr, pr_inception, sfid", lists="eval_metric")
    nfe_list: str = cf.F("", "flow, genlab eval: also a table of sample accuracy / feature FD at these NFEs (velocity "
                                 "evaluations per sample; empty = off)", free="comma-separated integers >= 1")
    samplers: str = cf.F("", "flow, genlab eval with eval.nfe_list: samplers of the table (empty = method.sampler)", free="comma-separated names of registry `sampler`", lists="sampler")


class ClassDropoutKeys(cf.Keys, section="model"):
    class_dropout: float = cf.F(0.1, "flow: label dropout that trains the null class for CFG", ge=0, le=1)


FLOW_KEYS = (FlowMethodKeys, FlowEvalKeys, EvalImageKeys, ClassDropoutKeys)
method_registry.register("flow", "rectified flow (x_t=(1-t)noise+t*data, v=data-noise), ODE/SDE samplers, CFG",
                         keys=FLOW_KEYS)(FlowMatching)
