"""The training step: the `Step` protocol and its eager/compiled strategy `TrainStep` (model, extras, optimizers, loss
scaler, EMA; a call is one optimizer step), built one way for the trainer and `genlab bench`, so bench times exactly what
trains. The graphed (graph_step.py) and stacked (seeds.py) strategies are the other train_step_registry entries."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Callable, Protocol

import torch

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry, Spec
from genlab.families.base import StepContext, as_loss_dict, check_batch_keys, check_extras
from genlab.families.build import build_model_and_method, check_model_shapes  # noqa: F401 (re-exported)
from genlab.nn.convert import after_step_hooks, apply_converters, check_converters, converters_of
from genlab.optim.build import build_optimizer
from genlab.optim.schedules import lr_at
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.dcp import load_dcp_optimizer
from genlab.runtime.parallel import clip_grads, is_sharded, local, no_sync, par_ddp, shard_like, wrap_parallel
from genlab.runtime.stop import start_compile_workers
from genlab.runtime.switches import (
    CompiledUpdate,
    allow_retained_backward,
    apply_switches,
    backward_context,
    compile_extra,
    compile_model_by_name,
    compile_optimizer_step,
    set_lr,
)
from genlab.training.graph_step import GraphedStep, check_graph_step_config, decide as decide_graph_step


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepSpec(Spec):
    check: Callable | None = None  # check(cfg): what the strategy supports, one line before any work (config validation)


train_step_registry = Registry("train_step", StepSpec)  # config/check.py runs every entry's check by name


def init_weights_from(model, source: str) -> None:
    """train.init_from: the weights (not the EMA, optimizer or step) of a checkpoint or exported model.safetensors."""
    weights = ckpt.load_checkpoint(source)["model"]
    check_model_shapes(model, weights, source, verb="initialise from")
    model.load_state_dict(weights)


@torch.no_grad()
def ema_update(ema_params, params, decay: float):
    # under FSDP both lists are DTensors sharded alike: the EMA of the local shards is the EMA's shard
    torch._foreach_lerp_([local(p) for p in ema_params], [local(p) for p in params], 1.0 - decay)


class Step(Protocol):
    """One optimizer step at `step` (micro-batches from next_batch, or the members' own loaders); returns (loss, grad
    norm, non-finite flag, metrics, skipped), a list of them for a stacked step. A checkpoint keeps state_dict()."""
    def __call__(self, step: int, next_batch=None, mark=None): ...

    def state_dict(self, member: int = 0) -> dict: ...

    def load_state_dict(self, state) -> None: ...


class TrainStep:
    def __init__(self, cfg, spec: dict, dist, device, precision, resume_state: dict | None = None,
                 resume_from: str = "the checkpoint"):
        tcfg = cfg.train
        self.cfg, self.spec, self.dist, self.device, self.precision = cfg, spec, dist, device, precision
        self._resume_from = resume_from
        if tcfg.compile != "off" or tcfg.compile_optimizer:  # a run that compiles nothing needs no worker pool
            start_compile_workers(device)  # before anything compiles: out of reach of a stop signalled to the group
        self.converters = converters_of(cfg, precision)
        self.after_step = after_step_hooks(self.converters)
        check_converters(self.converters, device)  # e.g. float8 refuses a CPU before anything is built
        self.model, self.method = build_model_and_method(cfg, spec)
        check_batch_keys(self.method, spec, cfg.method.name)
        if resume_state is not None:
            check_model_shapes(self.model, resume_state["model"], resume_from)
            self.model.load_state_dict(resume_state["model"])
        elif tcfg.init_from:
            init_weights_from(self.model, tcfg.init_from)
        else:
            self.method.init_weights(self.model)  # e.g. a student from its teacher's weights
        self.model.to(device)
        self.flops_per_sample = self.method.train_flops_per_sample(self.model, tcfg.steps)
        self.ema = copy.deepcopy(self.model).requires_grad_(False).eval() if tcfg.ema_decay > 0 else None
        if resume_state is not None and self.ema is not None and resume_state.get("ema") is not None:
            self.ema.load_state_dict(resume_state["ema"])
        self.model.train()
        apply_converters(self.model, self.converters, device, cfg)
        if self.ema is not None:  # the EMA samples, so it runs converted too
            apply_converters(self.ema, self.converters, device, cfg)
        apply_switches(self.model, tcfg)
        self.wrapped = compile_model_by_name(wrap_parallel(self.model, dist, tcfg, device), tcfg)
        self.ema = shard_like(self.ema, self.model)
        # methods that call the EMA in their loss (few-step targets) get it compiled like the model: eager, its
        # forwards cost as much as the compiled training step itself
        self.ema_for_loss = compile_extra(self.ema, tcfg) if self.ema is not None else None
        self._build_extras(resume_state)
        self._build_optimizers()
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision.loss_scaling)
        self.compiled_update = None  # the optimizer steps + EMA as one compiled function (a CUDA graph on a GPU)
        if tcfg.compile_optimizer and not self.scaler.is_enabled() and not self.after_step:
            self.compiled_update = CompiledUpdate(self.optimizers.values(),
                                                  None if self.ema is None else list(self.ema.parameters()),
                                                  list(self.model.parameters()), tcfg, device)
        self.gen = torch.Generator(device=device).manual_seed(tcfg.seed * 1000 + dist.rank)
        self._checked_keys = False
        graphed, self.graph_note = decide_graph_step(self.cfg, dist.world)  # train.graph_step=auto decided here
        self.graphed = GraphedStep(self) if graphed else None  # the whole step as one CUDA graph

    def _build_extras(self, resume_state):
        tcfg = self.cfg.train
        self.extras = self.method.extra_modules()
        check_extras(self.extras, self.cfg.method.name)
        saved = (resume_state or {}).get("extras") or {}
        self.extra_modules, self.extras_wrapped = {}, {}
        for name, e in self.extras.items():
            m = e.module
            if name in saved:  # e.g. a discriminator saved before its heads gained a time embedding: one line
                check_model_shapes(m, saved[name], self._resume_from, what=f"the method's '{name}' module")
                m.load_state_dict(saved[name])
            m.to(self.device)
            if e.trainable:
                m.train()
            else:
                m.requires_grad_(False).eval()
            self.extra_modules[name] = m
            # a trainable extra: DDP whenever several processes run, also under FSDP (extras are small)
            w = par_ddp(m, self.dist, None, self.device) if e.trainable else m
            self.extras_wrapped[name] = compile_extra(w, tcfg)
        # extras that count their FLOPs: trainable ones forward + backward (3x), frozen ones forward only
        self.flops_per_sample += sum((3 if e.trainable else 1) * e.module.flops_per_sample() for e in self.extras.values()
                                     if hasattr(e.module, "flops_per_sample"))

    def _build_optimizers(self):
        ocfg, tcfg = self.cfg.optim, self.cfg.train
        self.optimizers = {"model": build_optimizer(self.model, ocfg)}
        self.params = {"model": [p for p in self.model.parameters() if p.requires_grad]}
        for name, e in self.extras.items():
            if not e.trainable:
                continue
            ps = [p for p in self.extra_modules[name].parameters() if p.requires_grad]
            scale = (e.lr if e.lr is not None else ocfg.lr) / ocfg.lr  # the LR schedule scales every group alike
            if e.optimizer is None:
                if self.sharded:
                    raise GenlabError(f"extra '{name}': under FSDP/HSDP a trainable extra needs its own optimizer "
                                      "(Extra(optimizer='name')), not a group of the sharded model's")
                self.optimizers["model"].add_param_group({"params": ps, "lr": ocfg.lr * scale, "lr_scale": scale})
                self.params["model"] += ps
            else:
                betas = tuple(e.betas) if e.betas is not None else tuple(ocfg.betas)
                if e.optimizer in self.optimizers:
                    opt = self.optimizers[e.optimizer]
                    opt.add_param_group({"params": ps, "lr": ocfg.lr * scale, "lr_scale": scale, "betas": betas})
                else:
                    opt = build_optimizer(self.extra_modules[name], dataclasses.replace(ocfg, lr=ocfg.lr * scale,
                                                                                        betas=betas))
                    for g in opt.param_groups:
                        g["lr_scale"] = scale
                    self.optimizers[e.optimizer] = opt
                    self.params[e.optimizer] = []
                self.params[e.optimizer] += ps
        if len(self.optimizers) > 1 and tcfg.compile != "off":
            allow_retained_backward()  # before the first compiled forward
        if tcfg.compile_optimizer:
            self.optimizers = {k: compile_optimizer_step(o, self.device) for k, o in self.optimizers.items()}

    @property
    def sharded(self) -> bool:
        return is_sharded(self.model)

    @property
    def optimizer(self):
        return self.optimizers["model"]

    def context(self, step: int) -> StepContext:
        return StepContext(step=step, total_steps=self.cfg.train.steps, generator=self.gen, device=self.device,
                           precision=self.precision.name, ema=self.ema_for_loss, extras=self.extras_wrapped)

    def state_dict(self, member: int = 0, weights: bool = True) -> dict:
        """A checkpoint's part of the step: weights, EMA, optimizers, the method's modules, the loss scale."""
        big = {"model": self.model.state_dict(), "ema": self.ema.state_dict() if self.ema is not None else None,
               "optimizer": self.optimizer.state_dict()} if weights else {}
        return {**big, "extras": {k: m.state_dict() for k, m in self.extra_modules.items()},
                "extra_optimizers": {k: o.state_dict() for k, o in self.optimizers.items() if k != "model"},
                "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None}

    def load_state_dict(self, state: dict) -> None:
        """A resume: the optimizers' and the loss scaler's state (the weights were loaded when built)."""
        if state.get("dcp_path"):
            load_dcp_optimizer(state["dcp_path"], self.model, self.optimizer)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        saved = state.get("extra_optimizers") or {}
        for k in [k for k in self.optimizers if k != "model"]:
            if k not in saved:
                raise GenlabError(f"the checkpoint has no state for optimizer '{k}' of method {self.cfg.method.name}")
            self.optimizers[k].load_state_dict(saved[k])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def _no_sync(self, sync: bool):
        """no_sync over the model and every trainable extra (micro-steps before the last skip the all-reduce)."""
        stack = contextlib.ExitStack()
        for m in [self.wrapped, *(self.extras_wrapped[k] for k, e in self.extras.items() if e.trainable)]:
            stack.enter_context(no_sync(m, sync))
        return stack

    def _backward(self, losses: dict):
        if len(self.optimizers) == 1 and len(losses) == 1:  # the common case: one plain backward
            self.scaler.scale(losses["model"]).backward()
            return
        names = list(losses)
        for i, name in enumerate(names):
            # each loss reaches only its own optimizer's parameters; shared graph parts stay for later losses
            torch.autograd.backward(self.scaler.scale(losses[name]), inputs=self.params[name],
                                    retain_graph=i < len(names) - 1)

    def _check_loss_keys(self, losses: dict):
        if self._checked_keys:
            return
        unknown = [k for k in losses if k not in self.optimizers]
        if unknown:
            raise GenlabError(f"method {self.cfg.method.name} returned a loss for '{unknown[0]}'; "
                              f"optimizers: {', '.join(self.optimizers)}")
        self._checked_keys = True

    def _ema_decay(self, step: int) -> float | None:
        tcfg = self.cfg.train
        if self.ema is None or not tcfg.ema_warmup:
            return None if self.ema is None else tcfg.ema_decay
        return min(tcfg.ema_decay, (1 + step) / (10 + step))

    def __call__(self, step: int, next_batch, mark=None):
        """One optimizer step. next_batch() gives each micro-batch; mark(name) times phases (bench).
        Returns (model loss summed over micro-steps, model grad norm, non-finite flag, metrics, skipped)."""
        tcfg, mark = self.cfg.train, mark or (lambda name: None)
        mark("start")
        lr = lr_at(step, tcfg.steps, self.cfg.optim)
        if self.graphed is not None:
            loss, gnorm, bad, metrics = self.graphed.run(step, next_batch, mark, lr, self._ema_decay(step))
            return loss, gnorm, bad, metrics, False
        for opt in self.optimizers.values():
            set_lr(opt, lr)
        ctx = self.context(step)
        loss_sum = {k: torch.zeros((), device=self.device) for k in self.optimizers}
        for micro in range(tcfg.grad_accum):
            batch = next_batch()
            with self._no_sync(micro == tcfg.grad_accum - 1):
                with self.precision.autocast(self.device):
                    loss, metrics = self.method.loss(self.wrapped, batch, ctx)
                    losses = as_loss_dict(loss)
                    self._check_loss_keys(losses)
                    if tcfg.grad_accum > 1:  # a Python-int divide in the graph breaks compiled autograd on CUDA
                        losses = {k: v / tcfg.grad_accum for k, v in losses.items()}
                mark("fwd")
                with backward_context(tcfg):
                    self._backward(losses)
                mark("bwd")
            for k, v in losses.items():
                loss_sum[k] += v.detach().float()
        for opt in self.optimizers.values():
            self.scaler.unscale_(opt)
        # a plain tensor, also under FSDP; without a GradScaler the clip factor rides in the fused AdamW kernel
        gnorms = {k: clip_grads(self.params[k], self.cfg.optim.grad_clip, None if self.scaler.is_enabled() else opt)
                  for k, opt in self.optimizers.items()}
        finite_loss = torch.isfinite(torch.stack(list(loss_sum.values()))).all()
        finite_grads = torch.isfinite(torch.stack(list(gnorms.values()))).all()
        # with loss scaling an overflowing gradient is routine: scaler.step skips that update and lowers the scale, so
        # only a non-finite loss is divergence (counting the overflow as one would end every fp16 run early)
        bad = ~finite_loss if self.scaler.is_enabled() else ~(finite_loss & finite_grads)
        if len(self.optimizers) > 1:
            metrics = {**metrics, **{f"loss/{k}": v for k, v in loss_sum.items()}, **{f"grad_norm/{k}": v for k, v in gnorms.items()}}
        skipped = bool(tcfg.skip_nonfinite and bad.item())  # one host sync per step, only with this option
        eager = not skipped and self.compiled_update is None
        if skipped:
            self.scaler.update()
        elif self.compiled_update is not None:  # optimizer steps + EMA in one compiled function (a CUDA graph)
            self.compiled_update(self._ema_decay(step))
        else:
            for opt in self.optimizers.values():
                self.scaler.step(opt)
            self.scaler.update()
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        for hook in self.after_step if eager else ():
            hook(self.model, self.cfg)
        if eager and self.ema is not None:
            ema_update(list(self.ema.parameters()), list(self.model.parameters()), self._ema_decay(step))
        if not skipped:
            mark("opt")
        return loss_sum["model"], gnorms["model"], bad, metrics, skipped


# TrainStep runs three: compiled is eager with torch.compile on the model or blocks, graphed is its capture
train_step_registry.register("eager", "forward, backward, clip, optimizer and EMA in PyTorch's eager mode")(TrainStep)
train_step_registry.register("compiled", "the eager step with torch.compile on the model or its blocks (train.compile; "
                             "the optimizer + EMA too with train.compile_optimizer)")(TrainStep)
train_step_registry.register("graphed", "the whole step captured once as a CUDA graph and replayed (train.graph_step)",
                             check=check_graph_step_config)(GraphedStep)
