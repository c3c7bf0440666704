"""Batched seeds and variants (`train.seeds`, `train.lrs`, `train.weight_decays`, `train.ema_decays`): N members of
one config, each a full single run in its own folder (NAME[-lr=<v>...]-s<seed>), trained in one process around one
stacked Step: the members' parameters are stacked along dim 0, each seed's random inputs are drawn from its own
generator and loader outside torch.vmap, the method's deterministic `loss_from` is vmapped and one elementwise optimizer
(Adam, AdamW, SGD) step serves all. Members differing in lr / weight decay step at lr 1 and are rescaled per member
(`_scaled_step`); the derivation and its limits are in docs/performance.md (Batched seeds, Batched variants).
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import sys
import warnings
from datetime import datetime
from pathlib import Path

import torch

from genlab.config.check import VARIANT_KEYS, batched_label, check_member_name, is_batched, member_name, parse_seeds, variant_lists
from genlab.config.tree import Config, apply_overrides, load_config, to_dict
from genlab.core.errors import GenlabError, one_line
from genlab.families.base import StepContext, method_registry
from genlab.nn.attention import attention_choices
from genlab.optim.build import build_optimizer
from genlab.optim.schedules import lr_at, lr_schedule_registry
from genlab.optim.state import state_bytes
from genlab.runtime.checkpoint import config_for_resume
from genlab.runtime.stop import StopSignals
from genlab.runtime.switches import _mode, set_lr
from genlab.training.step import ema_update, train_step_registry
from genlab.training.trainer import Trainer, stop_handlers, train_loop

# what the batched step of train.seeds / train.lrs|weight_decays|ema_decays (training/seeds.py) supports
SUPPORTED = ("method flow (registry methods with batched_seeds), optim adamw|adam|sgd without optim.caution, one process, "
             "train.compile=off|model, model.qkv_kernel=plain, precision fp32|tf32|bf16|auto, no converters, activation_checkpointing=none")


def check_seeds_config(cfg) -> None:
    """What the batched step supports, checked with the rest of the config (one line, exit 2)."""
    t = cfg.train
    if not is_batched(cfg):
        return
    if t.seeds:
        parse_seeds(t.seeds)
    label = batched_label(cfg)

    def refuse(what):
        raise GenlabError(f"{label} does not support {what}; supported: {SUPPORTED}")
    check_member_name(cfg)
    if not method_registry.get(cfg.method.name).batched_seeds:
        ok = [n for n, method in method_registry.items() if method.batched_seeds]
        refuse(f"method {cfg.method.name} (methods that do: {', '.join(ok)})")
    if cfg.optim.name not in ("adamw", "adam", "sgd") or cfg.optim.caution:
        refuse(f"optim.name={cfg.optim.name}{' with optim.caution' if cfg.optim.caution else ''} (the stacked step must be elementwise)")
    for key, bad in (("parallel", t.parallel not in ("auto", "none")), ("compile", t.compile not in ("off", "model")),
                     ("compile_optimizer", t.compile_optimizer), ("compiled_autograd", t.compiled_autograd),
                     ("skip_nonfinite", t.skip_nonfinite), ("activation_checkpointing", t.activation_checkpointing != "none"),
                     ("convert", bool(t.convert))):
        if bad:
            refuse(f"train.{key}={getattr(t, key)}")
    if t.precision == "fp16" or t.precision.startswith("float8"):
        refuse(f"train.precision={t.precision}")
    if cfg.model.qkv_kernel != "plain":  # custom ops without a vmap rule
        refuse(f"model.qkv_kernel={cfg.model.qkv_kernel}")
    if t.resume:
        refuse("train.resume (give each member's run: genlab train --resume NAME-s0 --resume NAME-s1 ...)")


def seed_configs(cfg: Config) -> list[Config]:
    """One single-run config per member (seed x batched-variant values; the seed varies fastest): train.seed and the
    variant's optim.lr / optim.weight_decay / train.ema_decay set, train.seeds and the lists cleared, train.name
    NAME[-lr=<v>...]-s<seed>."""
    name = cfg.train.name or f"{cfg.preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    lists = variant_lists(cfg)
    seeds = parse_seeds(cfg.train.seeds) if cfg.train.seeds else [cfg.train.seed]
    out = []
    for combo in itertools.product(*lists.values()):
        values = dict(zip(lists, combo))
        for s in seeds:
            c = copy.deepcopy(cfg)
            for n in ("seeds", *VARIANT_KEYS):
                setattr(c.train, n, "")
            apply_overrides(c, [f"{VARIANT_KEYS[n][0]}={v}" for n, v in values.items()])
            c.train.seed, c.train.name = s, f"{member_name(name, values) if values else name}-s{s}"  # the sweep's naming
            out.append(c)
    return out


def _rng_state(device):
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class SeedRun(Trainer):
    """One seed's run: everything a single run does, except the step (StackedStep does it for all seeds)."""

    engine = None  # the StackedStep
    index = 0      # this run's slot in the seed dimension (once train_loop ends it, its slot's draws stop)

    def _make_run_dir(self, resume_state):
        self._resume_state = resume_state  # made after every seed is built and the batched step probed

    def make_run_dir(self):
        Trainer._make_run_dir(self, self._resume_state)
        self._resume_state = None

    def run_dir_taken(self):
        if self._resume_state is not None:
            return None
        d = Path(self.cfg.train.out_dir) / self.cfg.train.name
        return d if d.exists() and any(d.iterdir()) else None

    @contextlib.contextmanager
    def own_rng(self):
        """This run's global RNG state while its own code runs (its checkpoints record it, its eval draws from it)."""
        _set_rng_state(self.rng, self.device)
        try:
            yield
        finally:
            self.rng = _rng_state(self.device)

    def _state(self, weights=True):
        return {**super()._state(weights=False), **self.engine.state_dict(self.index)}

    def _optim_state_mib(self) -> float:
        return state_bytes(self.engine.optimizer) / self.engine.n / 2**20

    def _say(self, line: str):
        super()._say(f"{self.run_dir.name}: {line}")  # the seeds share one console: name the run

    def close(self):
        self.summary["batched_seeds"] = self.engine.n if self.engine is not None else None
        super().close()


@train_step_registry.register("stacked", "N members' step as one vmapped step on stacked tensors (train.seeds, "
                               "train.lrs, ...)", check=check_seeds_config)
class StackedStep:
    """The N runs' parameters, EMA and optimizer state stacked along dim 0, and one optimizer step for all of them."""

    def __init__(self, runs: list[SeedRun]):
        r0 = runs[0]
        self.runs, self.n, self.cfg = runs, len(runs), r0.cfg
        self.device, self.precision, self.method, self.model = r0.device, r0.precision, r0.method, r0.base
        self.stacked = copy.deepcopy(r0.base)  # same modules and names: the optimizer builds the same param groups
        with torch.no_grad():
            for name, p in self.stacked.named_parameters():
                p.data = torch.stack([r.base.get_parameter(name).detach() for r in runs])
                for i, r in enumerate(runs):  # each run's parameter becomes its slice: no copy, always current
                    r.base.get_parameter(name).data = p.data[i]
            self.buffers = {name: torch.stack([r.base.get_buffer(name) for r in runs]) for name, _ in r0.base.named_buffers()}
            self.ema = None
            if r0.ema is not None:
                self.ema = [torch.stack([e.detach() for e in es]) for es in zip(*(r.ema.parameters() for r in runs))]
                for j, ps in enumerate(zip(*(r.ema.parameters() for r in runs))):
                    for i, p in enumerate(ps):
                        p.data = self.ema[j][i]
        self.params = dict(self.stacked.named_parameters())
        self.optimizer = build_optimizer(self.stacked, self.cfg.optim)
        if type(self.optimizer) not in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):  # elementwise updates only
            raise GenlabError(f"{batched_label(self.cfg)} needs an elementwise optimizer; optim.name={self.cfg.optim.name} "
                              f"built {type(self.optimizer).__name__}; supported: {SUPPORTED}")
        self.load_state_dict([r.optimizer.state_dict() for r in runs])
        self._member_hyperparameters()
        self.last = [None] * self.n
        if self.device.type == "cpu":  # CPU SDPA has no vmap batching rule: a loop over the seeds, correct and expected
            warnings.filterwarnings("ignore", message=".*batching rule for aten::_scaled_dot_product_flash_attention_for_cpu")
        self._probe()

    # -- batched variants: each member's lr, weight decay and EMA decay ------------------------------------------
    def _member_hyperparameters(self):
        """Where the members differ in optim.lr / optim.weight_decay, the stacked optimizer steps at lr 1 without
        weight decay and `_scaled_step` applies each member's (docs/performance.md); else (seeds) it steps as one run."""
        ocfgs = [r.cfg.optim for r in self.runs]
        self.scaled = any((o.lr, o.weight_decay) != (ocfgs[0].lr, ocfgs[0].weight_decay) for o in ocfgs)
        emas = [r.cfg.train.ema_decay for r in self.runs]
        self.ema_decays = None
        if self.ema is not None and len(set(emas)) > 1:
            self.ema_decays = torch.tensor(emas, dtype=torch.float32, device=self.device)
        if not self.scaled:
            return
        groups = self.optimizer.param_groups
        self.decoupled = bool(groups[0].get("decoupled_weight_decay", isinstance(self.optimizer, torch.optim.AdamW)))
        # per group: each member's peak lr and weight decay, as its own single run's optimizer holds them
        self.peak = [torch.tensor([o.lr * g.get("lr_scale", 1.0) for o in ocfgs], dtype=torch.float32, device=self.device)
                     for g in groups]
        self.wd = [torch.tensor([r.optimizer.param_groups[j]["weight_decay"] for r in self.runs], dtype=torch.float32,
                                device=self.device) for j in range(len(groups))]
        self.old = {p: torch.empty_like(p) for g in groups for p in g["params"]}
        for g in groups:
            g["lr"], g["weight_decay"] = 1.0, 0.0

    @torch.no_grad()
    def _scaled_step(self, multiplier: float):
        """One optimizer step of members with their own lr and weight decay; `multiplier` = the schedule's factor
        of this step (optim/schedules.py: lr(t) = optim.lr * multiplier(t), the same for every member)."""
        params, olds, scales, keeps, l2 = [], [], [], [], []
        for j, g in enumerate(self.optimizer.param_groups):
            lr = self.peak[j] * multiplier  # [N] on the device: no host transfer
            keep = 1 - lr * self.wd[j] if self.decoupled else None
            for p in g["params"]:
                if p.grad is None:  # a single run's optimizer leaves it alone (no step, no decay)
                    continue
                shape = (self.n,) + (1,) * (p.ndim - 1)
                params.append(p)
                olds.append(self.old[p])
                scales.append(lr.view(shape))
                if self.decoupled:
                    keeps.append(keep.view(shape))
                else:
                    l2.append(self.wd[j].view(shape))
        if l2:  # torch Adam/SGD: grad = grad + weight_decay * param, before the moments
            torch._foreach_addcmul_([p.grad for p in params], params, l2)
        torch._foreach_copy_(olds, params)
        self.optimizer.step()
        torch._foreach_sub_(params, olds)   # the update at lr 1
        torch._foreach_mul_(params, scales)
        if keeps:  # torch AdamW: param * (1 - lr * weight_decay), then the update
            torch._foreach_addcmul_(params, olds, keeps)
        else:
            torch._foreach_add_(params, olds)

    # -- optimizer state: N single-run state dicts <-> one stacked one ------------------------------------------
    def load_state_dict(self, sds: list) -> None:
        """The members' optimizer states (their single runs' resumed ones), stacked."""
        if not sds[0]["state"]:
            return
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        state = {idx: {k: v if k == "step" else torch.stack([sd["state"][idx][k] for sd in sds])
                       for k, v in s0.items()} for idx, s0 in sds[0]["state"].items()}
        if len(state) != len(params):
            raise GenlabError("cannot resume the seeds batched: a checkpoint's optimizer state does not match the model")
        self.optimizer.load_state_dict({"state": state, "param_groups": sds[0]["param_groups"]})
        for r in self.runs:
            r.optimizer.state.clear()  # the stacked optimizer holds it now

    def state_dict(self, member: int = 0) -> dict:
        """Member i's weights, EMA and optimizer state, exactly as its single run's step would give them."""
        r = self.runs[member]
        clone = lambda sd: {k: v.clone() for k, v in sd.items()}  # noqa: E731 (views: torch.save would write the stack)
        state = {idx: {k: v.clone() if k == "step" and torch.is_tensor(v) else v if k == "step" else v[member].clone()
                       for k, v in s.items()} for idx, s in self.optimizer.state_dict()["state"].items()}
        # the groups' lr and weight decay as the member's own optimizer holds them (the stacked one may step at lr 1)
        optimizer = {"state": state, "param_groups": copy.deepcopy(r.optimizer.state_dict()["param_groups"])}
        return {"model": clone(r.base.state_dict()), "ema": clone(r.ema.state_dict()) if r.ema is not None else None,
                "optimizer": optimizer}

    def _losses(self, inputs: dict, compiled: bool = True):
        model, method = self.model, self.method

        def one(params, buffers, inp):
            from torch.func import functional_call
            return method.loss_from(lambda *args: functional_call(model, (params, buffers), args), inp)
        vmapped = torch.vmap(one)
        if compiled and self.cfg.train.compile == "model":  # the vmapped forward as one graph, its backward another
            if getattr(self, "_compiled", None) is None:
                self._compiled = torch.compile(vmapped, mode=_mode(self.cfg.train), dynamic=False)  # vmap: static shapes
            vmapped = self._compiled
        with self.attention_kernels(model):
            return vmapped(self.params, self.buffers, inputs)

    def _draws(self, step: int) -> dict:
        """Each seed's batch and random draws, from its own loader and generator, as a single run draws them."""
        per = []
        for i, r in enumerate(self.runs):
            if r.alive or self.last[i] is None:
                self.last[i] = r.method.loss_inputs(r.base, r.loader.next(), r.steps.context(step))
            per.append(self.last[i])
        return {k: torch.stack([p[k] for p in per]) for k in per[0]}

    def _clip(self) -> torch.Tensor:
        """Per-seed global gradient norm [N] and per-seed clipping (torch.nn.utils.clip_grad_norm_'s rule)."""
        grads = [p.grad for p in self.stacked.parameters() if p.grad is not None]
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(self.n, -1), dim=1) for g in grads])
        gnorm = torch.linalg.vector_norm(norms, dim=0)
        max_norm = self.cfg.optim.grad_clip
        if max_norm > 0:
            coef = torch.clamp(max_norm / (gnorm + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.view(-1, *([1] * (g.ndim - 1))).to(g.dtype))
        return gnorm

    def __call__(self, step: int, next_batch=None, mark=None) -> list:
        """One optimizer step of every seed; their (loss, grad norm, non-finite flag, metrics) in seed order."""
        tcfg = self.cfg.train
        for r in self.runs:  # the runs' own log their LR (and hold each member's)
            set_lr(r.optimizer, lr_at(step, tcfg.steps, r.cfg.optim))
        if not self.scaled:
            set_lr(self.optimizer, lr_at(step, tcfg.steps, self.cfg.optim))
        loss_sum = torch.zeros(self.n, device=self.device)
        metrics = {}
        for _ in range(tcfg.grad_accum):
            inputs = self._draws(step)
            with self.precision.autocast(self.device):
                losses, metrics = self._losses(inputs)
                if tcfg.grad_accum > 1:
                    losses = losses / tcfg.grad_accum
            losses.sum().backward()  # d(sum)/d(loss_i) = 1: each seed's slice gets exactly its own gradient
            loss_sum += losses.detach().float()
        gnorm = self._clip()
        bad = ~(torch.isfinite(loss_sum) & torch.isfinite(gnorm))
        if self.scaled:
            self._scaled_step(lr_schedule_registry.get(self.cfg.optim.schedule)(step, tcfg.steps, self.cfg.optim))
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None and self.ema_decays is None:
            decay = min(tcfg.ema_decay, (1 + step) / (10 + step)) if tcfg.ema_warmup else tcfg.ema_decay
            ema_update(self.ema, list(self.stacked.parameters()), decay)
        elif self.ema is not None:  # each member's own decay (batched variants of train.ema_decay)
            decay = self.ema_decays.clamp(max=(1 + step) / (10 + step)) if tcfg.ema_warmup else self.ema_decays
            with torch.no_grad():
                torch._foreach_lerp_(self.ema, list(self.stacked.parameters()),
                                     [(1 - decay).view((self.n,) + (1,) * (e.ndim - 1)) for e in self.ema])
        return [(loss_sum[i], gnorm[i], bad[i], {k: v[i] for k, v in metrics.items()}) for i in range(self.n)]

    def _probe(self):
        """One vmapped forward + backward on a synthetic batch before any run folder exists: a layer without a vmap
        rule (a custom kernel, a random op inside the model) fails here, in one line. On CUDA the attention kernels
        are tried in order (`attention_choices`) and the first that runs under vmap is kept for every step."""
        errors = []
        for name, kernels in attention_choices(self.device):
            gen = torch.Generator(device=self.device).manual_seed(0)
            rng = _rng_state(self.device)
            self.attention_kernels = kernels
            try:
                batch = self.method.synthetic_batch(2, self.device, gen)
                ctx = StepContext(step=0, total_steps=self.cfg.train.steps, generator=gen, device=self.device,
                                  precision=self.precision.name, ema=None)
                one = self.method.loss_inputs(self.model, batch, ctx)
                with self.precision.autocast(self.device):
                    losses, _ = self._losses({k: torch.stack([v] * self.n) for k, v in one.items()}, compiled=False)
                losses.sum().backward()
                if errors:
                    print(f"genlab: train.seeds: attention under vmap uses the {name} kernel "
                          f"({'; '.join(errors)})", file=sys.stderr)
                return
            except GenlabError:
                raise
            except Exception as e:  # noqa: BLE001
                errors.append(f"{name}: {one_line(e)}")
            finally:
                self.optimizer.zero_grad(set_to_none=True)
                _set_rng_state(rng, self.device)
        raise GenlabError(f"{batched_label(self.cfg)}: the model does not run under torch.vmap ({'; '.join(errors)}); "
                          f"supported: {SUPPORTED}")


class SeedsTrainer:
    """N seeds of one config in one process (train.seeds), or N seed runs resumed together (`resume=[runs]`)."""

    def __init__(self, cfg: Config | None = None, resume: list[str] | None = None, overrides: list[str] = ()):
        if resume:
            cfgs = [config_for_resume(p, list(overrides)) for p in resume]
            _check_same_config(cfgs, resume)
            self.runs = [SeedRun(c, resume=p) for c, p in zip(cfgs, resume)]
        else:
            self.runs = [SeedRun(c) for c in seed_configs(cfg)]
        self.stop_requested = False
        self.signals = StopSignals()

    def setup(self):
        for r in self.runs:
            r.setup()  # each seeds, builds and restores as its single run would
            r.rng = _rng_state(r.device)
        r0 = self.runs[0]
        if r0.dist.world > 1:
            raise GenlabError(f"{batched_label(r0.cfg)} runs in one process, not under torchrun; supported: {SUPPORTED}")
        for what, bad in (("loss scaling (fp16)", r0.scaler.is_enabled()), ("model converters", bool(r0.steps.converters)),
                          (f"method {r0.cfg.method.name}'s extra modules ({', '.join(r0.steps.extras)})", bool(r0.steps.extras))):
            if bad:
                raise GenlabError(f"{batched_label(r0.cfg)} does not support {what}; supported: {SUPPORTED}")
        steps = {r.step for r in self.runs}
        if len(steps) > 1:
            raise GenlabError(f"cannot resume the seeds batched: their checkpoints are at different steps ({sorted(steps)}); "
                              f"resume them one by one")
        taken = [d for d in (r.run_dir_taken() for r in self.runs) if d is not None]
        if taken:
            raise GenlabError(f"run folder '{taken[0]}' already exists; resume the seeds with --resume, or pick another train.name")
        self.engine = StackedStep(self.runs)
        for i, r in enumerate(self.runs):
            r.engine, r.index = self.engine, i
            r.make_run_dir()

    def _on_signal(self, signum, frame):
        Trainer._on_signal(self, signum, frame)  # a second Ctrl-C (not an echo of the first) raises
        for r in self.runs:
            r.stop_requested = True

    def fit(self) -> list[dict]:
        """Every member through trainer.train_loop around the stacked step; their summaries in member order."""
        self.setup()
        with stop_handlers(self._on_signal):
            return train_loop(self.runs, self._step)

    def _step(self) -> list:
        live = [r for r in self.runs if r.alive]
        outs = self.engine(live[0].step)
        return [outs[r.index] for r in live]


# what the members of one batched process may differ in (besides train.name)
MEMBER_KEYS = ("train.seed", *(key for key, _, _ in VARIANT_KEYS.values()))


def _check_same_config(cfgs: list, paths: list) -> None:
    """Runs resumed together must be members of one config: equal in every key but train.name, train.seed,
    optim.lr, optim.weight_decay and train.ema_decay (all with an EMA or all without), no two alike."""
    lists = {"train.seeds", *(f"train.{n}" for n in VARIANT_KEYS)}

    def flat(c):
        return {f"{sec}.{k}": v for sec, vals in to_dict(c).items() if isinstance(vals, dict) for k, v in vals.items()
                if f"{sec}.{k}" not in ("train.name", *MEMBER_KEYS, *lists)}
    ref = flat(cfgs[0])
    for c, p in zip(cfgs[1:], paths[1:]):
        diff = [k for k, v in flat(c).items() if ref.get(k) != v]
        if diff:
            raise GenlabError(f"cannot resume '{paths[0]}' and '{p}' batched: their configs differ in {diff[0]} "
                              f"(only {', '.join(MEMBER_KEYS)} may)")
    if len({c.train.ema_decay == 0 for c in cfgs}) > 1:
        raise GenlabError(f"cannot resume runs with and without an EMA (train.ema_decay=0) batched ({', '.join(map(str, paths))})")
    members = [tuple(getattr(getattr(c, k.split(".")[0]), k.split(".")[1]) for k in MEMBER_KEYS) for c in cfgs]
    if len(set(members)) != len(members):
        raise GenlabError(f"cannot resume runs with the same {', '.join(MEMBER_KEYS)} batched ({', '.join(map(str, paths))})")


def train(cfg: Config | str | None = None, resume: str | None = None):
    """`genlab.train(cfg)`: train one run (a Config, or a preset name; None = the default preset) and return its
    summary (run_dir, status, step, loss, samples_per_s, wall_time, the evaluation metrics); `resume` continues a run
    folder or checkpoint. With train.seeds (or train.lrs, ...) set: every member's summary, in member order."""
    if cfg is None or isinstance(cfg, str):
        cfg = load_config(cfg)
    if not isinstance(cfg, Config):
        raise GenlabError(f"genlab.train takes a Config (genlab.load_config(...)) or a preset name, got {type(cfg).__name__}")
    if is_batched(cfg):
        if resume:
            raise GenlabError(f"{batched_label(cfg)} with resume: resume each member's run, SeedsTrainer(resume=[run, ...])")
        return SeedsTrainer(cfg).fit()
    return Trainer(cfg, resume=resume).fit()
