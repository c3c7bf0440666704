"""`train.graph_step`: the whole training step (forward, backward, clip, optimizer, EMA) captured once as one CUDA graph
and replayed, so a launch-bound small model costs one launch per step. torch.compile's reduce-overhead graphs cannot
take the optimizer + EMA (pytorch/pytorch#160281), so this capture sits outside torch.compile, after a few eager steps
(PyTorch's "whole network capture" recipe). Only the batch (copied into static tensors), the LR and the EMA weight
(0-d device tensors) change per replay; everything else is frozen at capture, hence the opt-in Method.graph_step: a
loss that is the same computation every step (no step-dependent Python, host randomness or reads back to the host).
"""
from __future__ import annotations

import copy
import dataclasses

import torch

from genlab.config import check as config_check
from genlab.config.check import is_batched
from genlab.core.errors import GenlabError
from genlab.families.base import as_loss_dict, method_registry
from genlab.runtime.parallel import clip_grads
from genlab.runtime.switches import ema_update_device_weight, set_lr

WARMUP_STEPS = 3  # eager steps before the capture: compile, autograd's and the optimizer's lazy state, cuBLAS handles

GRAPH_STEP_OPTIMIZERS = ("adamw", "adam")  # torch Adam(W): capturable, device step counts, tensor LR in the fused kernel
GRAPH_STEP_SUPPORTED = ("one CUDA device, a method whose registry spec says graph_step (flow or repa, without "
                        f"the adaptive sampler), optim.name={'|'.join(GRAPH_STEP_OPTIMIZERS)} without optim.caution, "
                        "train.compile=off|model|blocks with train.compile_mode=default|max-autotune-no-cudagraphs, "
                        "grad_accum=1, precision fp32|tf32|bf16|auto, no train.compile_optimizer, skip_nonfinite, "
                        "activation checkpointing, converters or batched seeds")


def check_graph_step_config(cfg) -> None:
    """What a captured step supports, checked with the rest of the config (one line, exit 2, before any work)."""
    t = cfg.train
    if t.graph_step != "true":
        return

    def refuse(what):
        raise GenlabError(f"train.graph_step=true does not support {what}; supported: {GRAPH_STEP_SUPPORTED}")
    if config_check._trains_on_cpu(t.device):  # looked up at call time: tests pretend to be on CUDA
        refuse(f"training on the CPU (train.device={t.device}): CUDA graphs need a CUDA device")
    if not method_registry.get(cfg.method.name).graph_step:
        ok = [n for n, method in method_registry.items() if method.graph_step]
        refuse(f"method {cfg.method.name} (methods that do: {', '.join(ok)})")
    if cfg.optim.name not in GRAPH_STEP_OPTIMIZERS or cfg.optim.caution:
        refuse(f"optim.name={cfg.optim.name}{' with optim.caution' if cfg.optim.caution else ''}")
    if t.compile_mode not in ("default", "max-autotune-no-cudagraphs"):
        refuse(f"train.compile_mode={t.compile_mode} (its own CUDA graphs cannot be captured inside this one)")
    for key, bad in (("parallel", t.parallel not in ("auto", "none")), ("compile_optimizer", t.compile_optimizer),
                     ("skip_nonfinite", t.skip_nonfinite),
                     ("compiled_autograd", t.compiled_autograd), ("grad_accum", t.grad_accum != 1),
                     ("activation_checkpointing", t.activation_checkpointing != "none"), ("convert", bool(t.convert))):
        if bad:
            refuse(f"train.{key}={getattr(t, key)}")
    if t.precision == "fp16":
        refuse("train.precision=fp16 (its loss scaler reads found-inf on the host)")
    if t.precision.startswith("float8"):
        refuse(f"train.precision={t.precision} (a model converter)")
    if is_batched(cfg):
        refuse("batched seeds or variants (train.seeds / train.lrs / ...)")


def decide(cfg, world: int) -> tuple[bool, str | None]:
    """Whether this run captures its step, and the one-line note that says so. train.graph_step=auto is decided
    here, each time a run starts (a resume on another machine decides again; the config keeps "auto"): on wherever
    the captured step supports the config on one CUDA device, else off with the reason (no note on the CPU, where
    CUDA graphs do not exist). An explicit true was checked with the config; false is the plain step."""
    t = cfg.train
    if t.graph_step != "auto":
        return t.graph_step == "true", None
    if config_check._trains_on_cpu(t.device):
        return False, None
    if world > 1:
        return False, f"train.graph_step=auto: the plain step ({world} processes; the captured step runs on one device)"
    trial = copy.copy(cfg)  # the checks of an explicit true, on a copy: the run's config keeps auto
    trial.train = dataclasses.replace(t, graph_step="true")
    try:  # the step's own checks and the method's (e.g. flow's adaptive timestep sampler)
        check_graph_step_config(trial)
        method_registry.get(cfg.method.name).check_config(trial)
    except GenlabError as e:
        why = str(e).split("; supported:")[0].removeprefix("train.graph_step=true ")
        return False, f"train.graph_step=auto: the plain step ({why})"
    return True, "train.graph_step=auto: the whole step runs as one CUDA graph (train.graph_step=false for the plain step)"


def make_capturable(optimizer, device) -> None:
    """The optimizer's per-step values on the device: each group's LR a 0-d tensor (filled in place by `set_lr`, so
    a schedule reaches the graph), `capturable` on (Adam's step count stays on the device). Run right before the
    capture, after any resume has loaded a state dict (which brings back float LRs and host step counts)."""
    for g in optimizer.param_groups:
        if not torch.is_tensor(g["lr"]):
            g["lr"] = torch.tensor(float(g["lr"]), device=device)
        g["capturable"] = True  # also with fused=True: step() refuses a capture unless every group says so
    for st in optimizer.state.values():
        if torch.is_tensor(st.get("step")) and st["step"].device != torch.device(device):
            st["step"] = st["step"].to(device=device, dtype=torch.float32)


class GraphedStep:
    """Runs TrainStep's step as: WARMUP_STEPS eager steps, then one capture, then a replay per step."""

    def __init__(self, train_step):
        ts = train_step
        if ts.dist.world > 1:
            raise GenlabError("train.graph_step=true runs on one device; this run has "
                              f"{ts.dist.world} processes (use train.parallel=none or drop train.graph_step)")
        if list(ts.optimizers) != ["model"]:
            raise GenlabError(f"train.graph_step=true needs one optimizer; method {ts.cfg.method.name} "
                              f"has {', '.join(ts.optimizers)}")
        self.ts, self.opt, self.params = ts, ts.optimizers["model"], ts.params["model"]
        self.ema = None if ts.ema is None else list(ts.ema.parameters())
        self.ema_src = None if ts.ema is None else list(ts.model.parameters())
        self.ema_weight = torch.zeros((), device=ts.device)
        self.graph = self.static_batch = self.static_out = None
        self.eager_steps = 0
        self._side = None  # the warm-up's side stream (CUDA)

    def _body(self, batch, ctx):
        """One step with nothing read back to the host: the region the graph records."""
        ts, cfg = self.ts, self.ts.cfg
        with ts.precision.autocast(ts.device, cache=False):
            loss, metrics = ts.method.loss(ts.wrapped, batch, ctx)
            losses = as_loss_dict(loss)
            ts._check_loss_keys(losses)
        losses["model"].backward()
        loss = losses["model"].detach().float()
        gnorm = clip_grads(self.params, cfg.optim.grad_clip, self.opt)
        bad = ~(torch.isfinite(loss) & torch.isfinite(gnorm))
        self.opt.step()
        if self.ema is not None:
            ema_update_device_weight(self.ema, self.ema_src, self.ema_weight)
        return loss, gnorm, bad, metrics

    def _eager(self, batch, ctx):
        """A warm-up step, run as the capture will run it: on a side stream on CUDA (PyTorch's recipe: the lazy
        allocations of the first steps then come from that stream), in place on the CPU (where the tests run it)."""
        dev = self.ts.device
        if dev.type != "cuda":
            out = self._body(batch, ctx)
            self.opt.zero_grad(set_to_none=True)
            return out
        side = self._side = self._side or torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            out = self._body(batch, ctx)
            self.opt.zero_grad(set_to_none=True)
        torch.cuda.current_stream(dev).wait_stream(side)
        return out

    def _copy_in(self, batch: dict):
        for k, v in batch.items():
            s = self.static_batch.get(k)
            if s is None or not torch.is_tensor(v) or s.shape != v.shape or s.dtype != v.dtype:
                got = tuple(v.shape) if torch.is_tensor(v) else type(v).__name__
                raise GenlabError(f"train.graph_step=true replays a fixed batch layout; batch key '{k}' changed to "
                                  f"{got} (every batch must have the captured keys, shapes and dtypes)")
            s.copy_(v, non_blocking=True)

    def _capture(self, batch, ctx):
        ts = self.ts
        make_capturable(self.opt, ts.device)
        self.static_batch = {k: v.clone() for k, v in batch.items()}
        self.opt.zero_grad(set_to_none=True)  # the captured backward allocates the gradients from the graph's pool
        torch.cuda.synchronize(ts.device)
        g = torch.cuda.CUDAGraph()
        if ts.gen.device.type == "cuda":  # the step's own generator: replays advance its offset like eager steps
            g.register_generator_state(ts.gen)
        # thread_local: a data loader's worker thread copying the next batch meanwhile must not break the capture
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            self.static_out = self._body(self.static_batch, ctx)
        self.graph = g

    def run(self, step: int, next_batch, mark, lr: float, decay: float | None):
        set_lr(self.opt, lr)
        if self.ema is not None:
            self.ema_weight.fill_(1.0 - decay)
        ctx = self.ts.context(step)
        batch = next_batch()
        if self.graph is None and self.eager_steps < WARMUP_STEPS:
            out = self._eager(batch, ctx)
            self.eager_steps += 1
            for phase in ("fwd", "bwd", "opt"):  # one call: the phases are not timed apart
                mark(phase)
            return out
        if self.graph is None:
            self._capture(batch, ctx)
        else:
            self._copy_in(batch)
        mark("fwd")  # one launch: the phases are not separable
        mark("bwd")
        self.graph.replay()
        mark("opt")
        loss, gnorm, bad, metrics = self.static_out  # the graph's outputs: copies, the next replay overwrites them
        return loss.clone(), gnorm.clone(), bad.clone(), {k: v.clone() if torch.is_tensor(v) else v
                                                          for k, v in metrics.items()}
