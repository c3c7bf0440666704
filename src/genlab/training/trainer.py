"""The training loop: `train_loop` calls one Step (step.py: eager, compiled, graphed or stacked) and each run's hooks
(log, preview, eval, checkpoint, stop) at their intervals. A `Trainer` is one run around it: devices, precision, the
run folder, checkpoints, metrics and summary. It never special-cases a family: the method gives the loss and samples.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

from genlab.config.check import batched_label, config_warnings, is_batched
from genlab.config.tree import Config, dumps_toml, run_config_dict, to_dict
from genlab.core import files as folder_lock
from genlab.core import progress
from genlab.core.errors import GenlabError, RunFailed, debug, machine_failure, one_line
from genlab.core.files import write_atomic
from genlab.core.progress import TrainStatus
from genlab.data import build_dataset, build_loader
from genlab.data.datasets import check_data_on_disk
from genlab.nn.convert import apply_converters
from genlab.nn.float8 import plan_summary
from genlab.optim.state import state_bytes
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.checkpoint import config_for_resume  # noqa: F401 (re-exported: the CLI, seeds.py)
from genlab.runtime.dcp import export_safetensors, save_dcp
from genlab.runtime.metrics import MetricsLog, peak_flops, peak_memory_gib
from genlab.runtime.parallel import all_reduce_mean, full_state_dict, init_distributed, leave_distributed
from genlab.runtime.stop import STOP_SIGNALS, StopSignals
from genlab.runtime.switches import build_precision, compile_counts, lr_value
from genlab.sampling.images import eval_context
from genlab.training.stall import StallWatcher
from genlab.training.step import TrainStep, build_model_and_method, check_model_shapes, ema_update  # noqa: F401 (re-exported)


class NonFiniteLoss(RuntimeError):
    pass


RUN_BUSY = ("run folder '{run}' is being trained by another genlab process (pid {{pid}}); wait for it to end (a "
            "resume then continues from its last checkpoint)")


class Trainer:
    notes = ()  # one-line notes on how `genlab train` fitted the config (its fit_warmup): printed, kept in config.toml
    alive = True  # False once train_loop ended this run

    def __init__(self, cfg: Config, resume: str | None = None):
        if is_batched(cfg):
            raise GenlabError(f"{batched_label(cfg)} trains several runs in one process: use genlab.train(cfg) or "
                              "`genlab train`, or genlab.training.seeds.SeedsTrainer")
        self.cfg = cfg
        self.t_created = time.perf_counter()  # first_step_s counts from here: data, model, compile and the first step
        self.resume_from = resume or cfg.train.resume or None
        self.stop_requested = False
        self.signals = StopSignals()
        self._run_lock = None  # the run folder's lock while this process trains it (folder_lock)
        self.prior_wall = 0.0  # a resumed run's seconds before this process: summary.json reports the whole run

    def _setup(self):
        cfg, tcfg = self.cfg, self.cfg.train
        if self.resume_from:  # before anything is built or written: a finished run is only ever extended
            prior = ckpt.read_summary(ckpt.run_dir_of(self.resume_from))
            ckpt.check_extends(self.resume_from, tcfg.steps, prior)
            self.prior_wall = prior.get("wall_time") or 0.0
        self.dist, self.device = init_distributed(tcfg.device)
        self.precision = build_precision(tcfg.precision, self.device)
        # the same seed on every rank while the model is built: FSDP2 keeps each rank's own shard of its
        # local init (DDP would broadcast rank 0's), so differing seeds would stitch several inits together
        torch.manual_seed(tcfg.seed)
        check_data_on_disk(cfg)
        self.data = build_dataset(cfg.data)
        self.spec = self.data.spec
        resume_state = ckpt.load_checkpoint(self.resume_from) if self.resume_from else None
        if resume_state is not None and resume_state.get("optimizer") is None and not resume_state.get("dcp_path"):
            raise GenlabError(f"cannot resume from '{self.resume_from}': it is an export (weights only, no optimizer or "
                              f"data position); resume its run folder, or start from it with train.init_from=...")
        # model, method, extras, converters, EMA, wrapping, compile, optimizers: built as `genlab bench` builds them
        self.steps = TrainStep(cfg, self.spec, self.dist, self.device, self.precision, resume_state, str(self.resume_from))
        st = self.steps
        if st.graph_note:  # train.graph_step=auto's decision: printed and kept in config.toml with the other notes
            self.notes = [*self.notes, st.graph_note]
        self.model = self.base = st.model
        self.method, self.wrapped, self.ema, self.gen = st.method, st.wrapped, st.ema, st.gen
        self.method.check_eval(cfg)  # e.g. FID weights missing: fail before step 1
        # the stall sentinel's levels (training/stall.py), from the run's data with a generator of their own: the
        # training's random streams are untouched
        self.baselines = self.method.trivial_baselines(self.data, torch.Generator().manual_seed(tcfg.seed)) \
            if cfg.log.stall_after > 0 else []
        self.optimizer, self.scaler, self.flops_per_sample = st.optimizer, st.scaler, st.flops_per_sample
        self.sharded = st.sharded  # FSDP/HSDP: DCP checkpoints, gathered weights for sampling
        torch.manual_seed(tcfg.seed + self.dist.rank)  # per-rank randomness from here on (dropout, augmentation)
        self.best = None  # log.keep_best: {"metric", "value", "step"} of checkpoints/best.pt
        if cfg.log.keep_best and (self.sharded or not self.method.best_metric):
            raise GenlabError("log.keep_best needs an unsharded model and a method with a validation metric "
                              f"(method {cfg.method.name} under train.parallel={tcfg.parallel})")
        self.micro_batch = tcfg.batch_size // (tcfg.grad_accum * self.dist.world)
        if self.micro_batch < 1 or tcfg.batch_size % (tcfg.grad_accum * self.dist.world):
            raise GenlabError(f"train.batch_size {tcfg.batch_size} must be divisible by grad_accum x world size "
                              f"({tcfg.grad_accum} x {self.dist.world})")
        self.loader = build_loader(self.data, cfg.data, self.micro_batch, self.device, tcfg.seed,
                                   rank=self.dist.rank, world=self.dist.world)
        self.step = self.nonfinite_skipped = 0
        if resume_state is not None:
            self._restore(resume_state)
        self._make_run_dir(resume_state)

    def _restore(self, state):
        self.steps.load_state_dict(state)
        gens = state.get("gens") or [state["gen"]]  # a DCP checkpoint keeps every rank's generator
        if state.get("dcp_path") and self.dist.world == state.get("world", 1) and self.dist.rank < len(gens):
            state = {**state, "gen": gens[self.dist.rank]}
        self.step = state["step"]
        self.loader.load_state_dict(state["loader"])
        self.gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("device_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["device_rng"], self.device)
        self.nonfinite_skipped = state.get("nonfinite_skipped", 0)
        self.best = state.get("best")

    def _make_run_dir(self, resume_state):
        cfg = self.cfg
        if resume_state is not None:
            self.run_dir = ckpt.run_dir_of(self.resume_from)  # a step_N.dcp checkpoint is a folder too
            if self.dist.is_main:  # before anything is written: two resumes of one run would interleave it
                self._run_lock = folder_lock.acquire(self.run_dir, RUN_BUSY.format(run=self.run_dir))
        else:
            name = cfg.train.name or f"{cfg.preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
            self.run_dir = Path(cfg.train.out_dir) / name
            if self.dist.is_main and self.run_dir.exists() and any(self.run_dir.iterdir()):
                raise GenlabError(f"run folder '{self.run_dir}' already exists; resume it with --resume {self.run_dir} or pick another train.name")
        made = self.dist.is_main and resume_state is None and not self.run_dir.exists()
        try:
            if self.dist.is_main:
                # printed before training and kept with the run's config
                said = [("warning", w) for w in config_warnings(cfg)] + [("note", n) for n in self.notes]
                for kind, line in said:
                    print(f"genlab: {kind}: {line}", file=sys.stderr)
                # rendered before the folder exists (tomli_w missing once left an empty run that blocked the next)
                text = "".join(f"# {kind}: {line}\n" for kind, line in said) + dumps_toml(run_config_dict(cfg))
                self.run_dir.mkdir(parents=True, exist_ok=True)
                (self.run_dir / "samples").mkdir(exist_ok=True)
                try:  # "x": exactly one of two `genlab train` started with one name at once gets the folder
                    with open(self.run_dir / "config.toml", "x" if resume_state is None else "w") as f:
                        f.write(text)
                except FileExistsError:
                    made = False  # the other process's folder: leave it
                    raise GenlabError(f"run folder '{self.run_dir}' was just created by another genlab train; "
                                      f"pick another train.name") from None
                if self._run_lock is None:  # a new run, now ours: a resume started meanwhile must wait for it
                    self._run_lock = folder_lock.acquire(self.run_dir, RUN_BUSY.format(run=self.run_dir))
            self.log = MetricsLog(self.run_dir, tensorboard=cfg.log.tensorboard, enabled=self.dist.is_main,
                                  wandb_project=cfg.log.wandb_project if cfg.log.wandb else None, config=to_dict(cfg))
        except BaseException:
            if made:  # a new run that could not start leaves nothing behind
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    def _state(self, weights=True):
        return {
            **self.steps.state_dict(weights=weights), "step": self.step, "loader": self.loader.state_dict(),
            "gen": self.gen.get_state(), "torch_rng": torch.get_rng_state(),  # + CUDA's: heavyball's rounding draws from it
            "device_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "nonfinite_skipped": self.nonfinite_skipped, "best": self.best, "config": to_dict(self.cfg), "data_spec": self.spec,
        }

    def save(self):
        self._check_finite()  # never write a checkpoint of a diverged model
        if self.sharded:  # every rank writes its shards (torch.distributed.checkpoint)
            path = save_dcp(ckpt.ckpt_dir(self.run_dir), self.step, self.base, self.optimizer, self.ema,
                            self._state(weights=False), self.dist)
            if self.dist.is_main and self.cfg.log.keep_last > 0:
                for old in ckpt.list_checkpoints(self.run_dir)[:-self.cfg.log.keep_last]:
                    ckpt.prune(old)
            return path
        if self.dist.is_main:
            return ckpt.save_checkpoint(self.run_dir, self.step, self._state(), self.cfg.log.keep_last)

    def keep_best(self, ev: dict):
        """log.keep_best: write checkpoints/best.pt when the method's validation metric (lower is better)
        beats every earlier evaluation of this run."""
        if not self.cfg.log.keep_best or not self.dist.is_main:
            return
        key = self.method.best_metric
        v = ev.get(key)
        if v is None or not math.isfinite(v) or (self.best is not None and v >= self.best["value"]):
            return
        self._check_finite()
        self.best = {"metric": key, "value": v, "step": self.step}
        ckpt.save_best(self.run_dir, self._state())
        self.log.write({"step": self.step, f"best/{key}": v})

    def _train_step(self):
        self._full = None  # the previous step's gathered weights (_gathered) are stale: free their memory
        loss, gnorm, bad, extra, skipped = self.steps(self.step, self.loader.next)
        self.nonfinite_skipped += skipped
        return loss, gnorm, bad, extra

    def _compile_stats(self) -> dict:  # recompiles: graphs added after the first step (guard failures)
        t = self.cfg.train
        if t.compile == "off" and not (t.compile_optimizer or t.compiled_autograd):
            return {}
        g = compile_counts()["graphs"]
        return {"compiled_graphs": g, "recompiles": g - self._graphs_first}

    def _optim_state_mib(self) -> float:  # every optimizer's state on this rank (metadata only: no sync)
        return sum(state_bytes(o) for o in self.steps.optimizers.values()) / 2**20

    def _check_finite(self):
        if getattr(self, "_bad_acc", None) is not None and self._bad_acc.item() and not self.cfg.train.skip_nonfinite:
            raise NonFiniteLoss(f"non-finite loss or gradient before step {self.step}; stopped without saving "
                                f"(last good checkpoint kept). Try a lower optim.lr, optim.grad_clip, or train.skip_nonfinite=true")

    def eval_ctx(self):
        return eval_context(self.cfg, self.device, self.run_dir)

    def sample_model(self):
        """EMA (or live) weights for sampling; under FSDP a collective gather into a plain model on rank 0."""
        model = self.ema if self.ema is not None else self.base
        if not self.sharded:
            return model
        full = self._gathered()  # every rank takes part in the all-gather
        if not self.dist.is_main:
            return None
        with torch.device(self.device):  # random init on the GPU, not the CPU: minutes for a model of billions
            plain, _ = build_model_and_method(self.cfg, self.spec)
        plain.load_state_dict(full)
        return apply_converters(plain.to(self.device), self.steps.converters, self.device, self.cfg)

    def _gathered(self) -> dict:
        """The sampling weights of a sharded run, unsharded on the CPU; gathered once per step, since the export and
        the final samples both need them (a 4B model's gather takes tens of seconds)."""
        if getattr(self, "_full", None) is None or self._full[0] != self.step:
            self._full = (self.step, full_state_dict(self.ema if self.ema is not None else self.base))
        return self._full[1]

    def export_weights(self):
        """Consolidated safetensors of the sampling weights next to a sharded run (what sample/eval load)."""
        weights = self._gathered()  # collective
        if self.dist.is_main:
            return export_safetensors({"model": weights, "config": to_dict(self.cfg), "data_spec": self.spec,
                                       "step": self.step}, self.run_dir / "model.safetensors")

    @contextlib.contextmanager
    def _sampling(self):
        """The sampling model in eval mode (None on the other ranks, which only join a sharded gather)."""
        model = self.sample_model()
        if not self.dist.is_main:
            yield None
            return
        was = model.training
        try:
            with progress.enabled(self.cfg.log.progress):
                yield model.eval()
        finally:
            model.train(was)

    def preview(self, final=False):
        path = self.run_dir / ("samples.png" if final else f"samples/step_{self.step:08d}.png")
        with self._sampling() as model:
            return None if model is None else self.method.preview(model, path, self.eval_ctx())

    def evaluate(self):
        with self._sampling() as model, self.precision.autocast(self.device):
            return {} if model is None else self.method.evaluate(model, self.data, self.eval_ctx())

    # -- the loop: this run's part of it (train_loop below drives one run or a runner's members) ---------------
    def _on_signal(self, signum, frame):
        if self.signals.is_second():  # a second Ctrl-C, not an echo of the first: give up at once
            raise KeyboardInterrupt
        self.stop_requested = True

    def setup(self):
        """Everything before the first step; an unexpected exception is one line (GENLAB_DEBUG=1: the traceback) and
        leaves nothing behind (the run folder is made last) nor holds its lock."""
        try:
            self._setup()
        except (GenlabError, KeyboardInterrupt):
            folder_lock.release(self._run_lock)
            raise
        except Exception as e:  # noqa: BLE001
            folder_lock.release(self._run_lock)
            if debug():
                raise
            if machine_failure(e):  # e.g. a full disk: exit 1, not the bad-input code
                raise RunFailed(f"setup failed: {one_line(e)}") from e
            raise GenlabError(f"setup failed: {one_line(e)} (GENLAB_DEBUG=1 shows the traceback)") from e

    def fit(self) -> dict:
        """Set up, then train_loop over this one run: each step one call of its Step (TrainStep)."""
        self.setup()
        with stop_handlers(self._on_signal):
            summary = train_loop([self], lambda: [self._train_step()])[0]
        leave_distributed(self.dist)  # only after a finished or checkpointed run: every rank reaches this line
        return summary

    def own_rng(self):
        return contextlib.nullcontext()  # one run: the process's RNG is its own (a runner's members swap theirs)

    def begin(self):
        """The loop's state: the start line, the progress bar, the log interval's accumulators."""
        self.flops_step = self.flops_per_sample * self.cfg.train.batch_size / self.dist.world  # per device
        self.early = self._announce(self.flops_step)  # on a slow CPU run a warning, then a status line at once
        self.first_step, self.peak = self.step + 1, peak_flops(self.device)
        # a status line every log.every steps; a tqdm bar as well when stderr is a terminal
        self.bar = TrainStatus(total=self.cfg.train.steps, initial=self.step, desc=self.run_dir.name) \
            if self.cfg.log.progress and self.dist.is_main else None
        self.acc = {"loss": torch.zeros((), device=self.device), "gnorm": torch.zeros((), device=self.device)}
        self._bad_acc = torch.zeros((), dtype=torch.bool, device=self.device)
        self.n_acc, self.t_last = 0, time.perf_counter()
        self.wall0, self.loader.wait_time = self.t_last, 0.0
        self.summary, self.last_record = {"status": "running"}, {}
        lcfg = self.cfg.log
        self.stall = StallWatcher(self.baselines, self.cfg.train.steps, lcfg.stall_after, lcfg.stall_margin, self._say)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def more(self) -> bool:
        return self.step < self.cfg.train.steps and not self.stop_requested

    def after_step(self, out):
        """Count the step, then the hooks at their intervals: log, preview, eval, checkpoint, stop."""
        loss, gnorm, bad, extra = out
        self.step += 1
        if getattr(self, "_graphs_first", None) is None:  # the first step compiles everything
            self._graphs_first = compile_counts()["graphs"]
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.summary["first_step_s"] = time.perf_counter() - self.t_created  # the cold start a user waits through
        self.acc["loss"] += loss
        self.acc["gnorm"] += gnorm.float()
        self._bad_acc |= bad
        self.n_acc += 1
        self.log_hook(extra)
        lcfg = self.cfg.log
        if self._due(lcfg.sample_every):
            self.preview()
        if self._due(lcfg.eval_every):
            self.eval_hook()
        if self._due(lcfg.ckpt_every):
            self.save()

    def _due(self, every: int) -> bool:
        """A periodic hook's turn; the last step has the end-of-run ones instead."""
        return bool(every) and self.step % every == 0 and self.step < self.cfg.train.steps

    def log_hook(self, extra: dict):
        """Every log.every steps (and the last, and after step 1 of a slow CPU run): the interval's means, speed,
        memory; one metrics.jsonl record and the status line."""
        tcfg, lcfg = self.cfg.train, self.cfg.log
        early = self.early and self.step == self.first_step
        if self.step % lcfg.every == 0 or self.step == tcfg.steps or early:
            self._check_finite()
            rec = self._record(extra)
            self.log.write(rec)
            self.stall.check(self.step, rec)
            self.last_record = rec
            if self.bar is not None:
                self.bar.log(rec)
            elif early and self.dist.is_main:  # log.progress=false: this line only
                print(progress.status_line(rec, tcfg.steps, rec["step_time"] * (tcfg.steps - self.step)), flush=True)
            self.acc["loss"].zero_()
            self.acc["gnorm"].zero_()
            self.n_acc, self.loader.wait_time = 0, 0.0
            self.t_last = time.perf_counter()
        if self.bar is not None:
            self.bar.update(1)

    def _record(self, extra: dict) -> dict:
        tcfg, n = self.cfg.train, self.n_acc
        now = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            now = time.perf_counter()
        dt = (now - self.t_last) / n
        seq = self.spec.get("seq_len")
        rec = {"step": self.step, "loss": all_reduce_mean(self.acc["loss"] / n, self.dist).item(),
               "grad_norm": (self.acc["gnorm"] / n).item(), "lr": lr_value(self.optimizer), "step_time": dt,
               "samples_per_s": tcfg.batch_size / dt, "tokens_per_s": tcfg.batch_size * seq / dt if seq else None,
               "flops_per_step": self.flops_step * self.dist.world,
               "mfu": (self.flops_step / dt / self.peak) if self.peak else None,
               "peak_mem_gib": peak_memory_gib(self.device),
               "data_wait_frac": min(1.0, self.loader.wait_time / max(now - self.t_last, 1e-9)),
               "epoch": self.loader.epoch, "wall_time": now - self.wall0, "nonfinite_skipped": self.nonfinite_skipped,
               "optim_state_mib": self._optim_state_mib(), **self._compile_stats()}
        rec.update({k: v.item() if torch.is_tensor(v) else v for k, v in extra.items()})
        return rec

    def eval_hook(self):
        t_eval = time.perf_counter()
        ev = self.evaluate()
        eval_s = time.perf_counter() - t_eval
        self.t_last += eval_s  # the next interval's step_time is training only; eval_s lets reports subtract it
        self.log.write({"step": self.step, "eval_s": eval_s, **{f"eval/{k}": v for k, v in ev.items()}})
        self.stall.check(self.step, ev, "eval")
        self.keep_best(ev)

    def finish(self):
        """The end of the steps: the last checkpoint; a finished (not stopped) run's final preview and evaluation."""
        interrupted = self.stop_requested
        self._check_weights_finite()
        path = self.save()
        if self.sharded:
            self.export_weights()
        self.summary.update({"status": "interrupted" if interrupted else "finished", "step": self.step,
                             "checkpoint": str(path) if path else None})
        if interrupted:
            return
        grid = self.preview(final=True)
        ev = self.evaluate()
        if self.dist.is_main and ev:
            self.log.write({"step": self.step, **{f"eval/{k}": v for k, v in ev.items()}})
        self.stall.check(self.step, ev, "eval")
        self.summary.update(ev)
        self.summary["samples"] = str(grid) if grid else None
        self.keep_best(ev)
        if self.best is not None:  # the best-validation model is the one to report
            key = self.best["metric"]
            self.summary.update({f"{key}_best": self.best["value"], "best_step": self.best["step"],
                                 "best_checkpoint": str(ckpt.ckpt_dir(self.run_dir) / ckpt.BEST_NAME)})

    def fail(self, e: BaseException) -> BaseException:
        """The summary of a run that ended on `e`; returns what to raise (an unexpected error as one line)."""
        if isinstance(e, NonFiniteLoss):
            self.summary.update(status="diverged", error=str(e), step=self.step)
        elif isinstance(e, KeyboardInterrupt):  # a second Ctrl-C: stopped at once, without a final checkpoint
            self.summary.update(status="interrupted", error="stopped by a second Ctrl-C without saving", step=self.step)
        elif isinstance(e, Exception):  # a method, the data or the device failed mid-run
            kept = ckpt.list_checkpoints(self.run_dir)
            self.summary.update(status="failed", error=one_line(e), step=self.step,
                                last_checkpoint=str(kept[-1]) if kept else None)
            if not debug():
                err = RunFailed(f"run {self.run_dir} failed at step {self.step}: {one_line(e)}")
                err.__cause__ = e
                return err
        return e

    def close(self):
        """The run's last writes, however it ended: summary.json; then its folder is free for a resume."""
        if self.bar is not None:
            self.bar.close()
        self.loader.close() if hasattr(self.loader, "close") else None
        s = self.summary
        s.update({k: self.last_record.get(k) for k in ("loss", "samples_per_s", "tokens_per_s", "mfu", "peak_mem_gib",
                                                        "step_time", "data_wait_frac", "optim_state_mib")})
        s["wall_time"] = self.prior_wall + time.perf_counter() - self.wall0  # a resume adds to the run's time
        # what the time was spent on: a run's cost in device-seconds is wall_time x world (eval/cost.py)
        s["device"] = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.device.type
        s["world"], s["run_dir"] = self.dist.world, str(self.run_dir) if hasattr(self, "run_dir") else None
        s.update(self.stall.summary())  # stalled: the run's last values are still at a trivial level
        if self.dist.is_main and hasattr(self, "run_dir"):
            write_atomic(self.run_dir / "summary.json", json.dumps(s, indent=2, default=str))
            self.log.close()
        folder_lock.release(self._run_lock)  # the run's last write is done: a resume may start

    def _check_weights_finite(self):
        """After the last update, before any checkpoint: non-finite weights (e.g. optim.lr far too large) end the run
        as diverged, not finished (one host sync per run)."""
        bad = [n for n, p in self.base.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise NonFiniteLoss(f"non-finite weights after step {self.step} ({bad[0]}{' and more' if len(bad) > 1 else ''}); "
                                f"stopped without saving (last good checkpoint kept). Try a lower optim.lr or optim.grad_clip")

    def _say(self, line: str):  # the stall sentinel's line: through the status bar where there is one, main rank only
        if self.dist.is_main:
            (self.bar.note if self.bar is not None else print)(f"genlab: {line}")

    def _announce(self, flops_step: float) -> bool:
        """Print the start line (log.progress=false too); on the CPU, warn when the run's FLOPs mean a long wait.
        True when that warning fired: the first status line then comes after step 1, not after log.every steps."""
        if not self.dist.is_main:
            return False
        dev = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.device.type
        print(f"run: {self.run_dir}  steps: {self.step} -> {self.cfg.train.steps}  batch: {self.cfg.train.batch_size}  "
              f"device: {dev}", flush=True)
        plan = getattr(self.base, "float8_plan", None)
        if plan is not None:  # the float8 size filter's decision per linear: one line here, every layer in the run folder
            print(f"genlab: {plan_summary(plan)}", flush=True)
            rows = [{"name": n, "in": i, "out": o, "float8": not why, "skipped": why} for n, i, o, why in plan]
            (self.run_dir / "float8_layers.json").write_text(json.dumps(rows, indent=1))
        if self.device.type != "cpu":
            return False
        warning = progress.cpu_slow_warning(flops_step, self.cfg.train.steps - self.step, torch.get_num_threads())
        if warning:
            print(f"genlab: warning: {warning}", file=sys.stderr, flush=True)
        return warning is not None


@contextlib.contextmanager
def stop_handlers(on_signal):
    """Ctrl-C / SIGTERM stop the runs at the next step boundary (on_signal); the old handlers come back after."""
    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def train_loop(runs: list, step) -> list[dict]:
    """The loop. While a run has steps left: one call of `step` (the Step of every live run; their (loss, grad norm,
    non-finite flag, metrics)), then each run's hooks (Trainer.after_step). A run that fails ends alone, its summary
    saying why, and the first error is raised once every run has ended. Returns the summaries in run order."""
    errors = []

    def end(r, e=None):  # its summary says why; its last writes
        errors.extend([] if e is None else [r.fail(e)])
        r.alive = False
        r.close()

    def hook(r, fn, *args):  # under the run's own RNG; a run that raises ends, the others go on
        try:
            with r.own_rng():
                fn(*args)
        except Exception as e:  # noqa: BLE001
            end(r, e)
    for r in runs:
        with r.own_rng():
            r.begin()
    try:
        while any(r.alive for r in runs):
            for r in [r for r in runs if r.alive and not r.more()]:
                hook(r, r.finish)
                if r.alive:
                    end(r)
            live = [r for r in runs if r.alive]
            try:
                outs = step() if live else []
            except Exception as e:  # noqa: BLE001 - the step itself failed: every live run ends on it
                outs = [end(r, e) for r in live]
            for r, out in zip(live, outs):
                if r.alive:
                    hook(r, r.after_step, out)
    except BaseException as e:  # a second Ctrl-C: every run stops at once, without a final checkpoint
        for r in [r for r in runs if r.alive]:
            with contextlib.suppress(BaseException):
                end(r, e)
        raise
    if errors:
        raise errors[0]
    return [r.summary for r in runs]
