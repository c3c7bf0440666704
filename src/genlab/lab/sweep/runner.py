"""Run every variant of a sweep as its own `genlab train` process; record what happened to each in
sweeps/<name>/status.json (rewritten atomically after every run). Run states and resuming: docs/sweeps.md.
"""
from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from genlab.config.check import VARIANT_KEYS
from genlab.core.errors import GenlabError
from genlab.core.files import held, write_atomic
from genlab.core.progress import TrainStatus
from genlab.data.datasets import check_data_on_disk
from genlab.lab.sweep.report import load_status, write_report
from genlab.lab.sweep.spec import Sweep, Variant
from genlab.lab.sweep.stages import Stage, resolve, stage_output
from genlab.nn.convert import check_converters, converters_of
from genlab.runtime.checkpoint import read_summary
from genlab.runtime.switches import precision_registry

REPO_SRC = Path(__file__).resolve().parents[3]
_ACTIVE: set = set()  # running child processes (per_gpu runs several at once)


def sweep_dir(sw: Sweep, root="sweeps") -> Path:
    return Path(root) / sw.name


def sweep_lock(d: Path):
    """One `genlab sweep` process per sweep folder (folder_lock): each writes status.json whole, so two at once (say,
    two --only slices on different GPUs) would lose each other's records and could resume the same run twice."""
    return held(d, f"sweep folder '{d}' is in use by another genlab sweep (pid {{pid}}); wait for it to end, or run "
                   "this one with another --root")


def save_status(d: Path, status: dict):
    write_atomic(d / "status.json", json.dumps(status, indent=2))


def visible_gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA is simply zero GPUs
        return 0


def choose_gpus(spec: str, launcher: str, visible: int) -> list[int]:
    """`--gpus N` (the first N visible GPUs) or `--gpus 0,2,3` (these; a lone index as `2,`), numbered as
    CUDA_VISIBLE_DEVICES numbers them here: the GPUs a sweep may use, checked before anything runs."""
    if launcher == "cpu":
        raise GenlabError(f'--gpus needs launcher gpu, per_gpu or torchrun; this sweep has launcher "{launcher}"')
    if visible == 0:
        raise GenlabError(f"--gpus {spec}: no CUDA device is visible")
    parts = [x.strip() for x in spec.split(",") if x.strip() or "," not in spec]
    if not parts or not all(re.fullmatch(r"-?\d+", x) for x in parts):
        raise GenlabError(f"--gpus takes N (the first N GPUs) or indices such as 0,2,3; got '{spec}'")
    if "," not in spec:
        n = int(parts[0])
        if not 1 <= n <= visible:
            raise GenlabError(f"--gpus {n}: choose 1 to {visible} GPUs ({visible} visible)")
        return list(range(n))
    ids = [int(x) for x in parts]
    bad = [i for i in ids if not 0 <= i < visible]
    if bad:
        raise GenlabError(f"--gpus {spec}: GPU {bad[0]} is not visible; visible: {', '.join(map(str, range(visible))) or 'none'}")
    twice = [i for i in ids if ids.count(i) > 1]
    if twice:
        raise GenlabError(f"--gpus {spec}: GPU {twice[0]} is listed twice")
    return ids


def check_runs(sw: Sweep, root="sweeps") -> None:
    """What each run's `genlab train` would refuse before starting, refused before the sweep starts (--dry-run too):
    a GPU launcher or train.device=cuda without a GPU, a data folder that is not there, a sweep folder of runs made
    with other command-line overrides."""
    gpus = visible_gpus()
    if sw.launcher in ("gpu", "per_gpu") and gpus == 0:
        raise GenlabError(f"sweep '{sw.name}' has launcher = \"{sw.launcher}\" but no CUDA device is visible; "
                          "use launcher = \"cpu\" to run it here (genlab sweep NAME launcher=cpu)")
    names = [s.name for s in sw.stages if s.is_run] + list(dict.fromkeys(v.name for v in sw.variants))
    for name in names:
        cfg, reads_stage = sw.configs[name]
        device = cfg.train.device
        try:
            if device.startswith("cuda") and sw.launcher == "cpu":
                raise GenlabError(f"train.device={device} does not go with launcher = \"cpu\" (every run on the CPU); "
                                  "give launcher=gpu, or leave train.device at auto")
            if device.startswith("cuda") and gpus == 0:
                raise GenlabError(f"train.device={device} but no CUDA device is visible; valid here: auto, cpu")
            _check_build(cfg, sw.launcher, gpus)
            if not reads_stage:  # a stage's output is made by the sweep itself
                check_data_on_disk(cfg)
        except GenlabError as e:
            raise GenlabError(f"{sw.path}: {'stage' if name in sw.stage_map else 'variant'} '{name}': {e}") from None
    _check_same_overrides(sw, sweep_dir(sw, root))


def _check_build(cfg, launcher: str, gpus: int) -> None:
    """The trainer's device checks before it builds a model (float8 precision needs an H100-class GPU)."""
    import torch
    device = torch.device("cuda:0" if launcher != "cpu" and gpus > 0 and cfg.train.device != "cpu" else "cpu")
    precision_registry.get(cfg.train.precision)(device)
    check_converters(converters_of(cfg), device)


def _check_same_overrides(sw: Sweep, d: Path) -> None:
    """One sweep folder, one set of command-line overrides: its finished runs are skipped, not redone."""
    if not (d / "status.json").exists():
        return
    had = json.loads((d / "overrides.json").read_text()) if (d / "overrides.json").exists() else []
    if had != sw.cli:
        raise GenlabError(f"sweep folder '{d}' has runs made with the overrides [{' '.join(had) or 'none'}], not "
                          f"[{' '.join(sw.cli) or 'none'}]; give those, or another --root")


def failure_reason(log: Path, rc: int | None, run: Path | None = None, timeout: float = 0) -> str:
    """One line: why a run failed, from its exit code (None: it ran past `timeout`), summary and log."""
    if rc is None:
        return f"timeout after {timeout:.0f} s"
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if "out of memory" in text.lower():
        return "oom: " + next((x for x in reversed(lines) if "out of memory" in x.lower()), "")[:200]
    if rc == 3 or "genlab: diverged" in text or (run is not None and read_summary(run).get("status") == "diverged"):
        return "diverged: " + next((x for x in reversed(lines) if "diverged" in x or "non-finite" in x), "non-finite loss")[:200]
    if rc == 2:
        return "bad config: " + (lines[-1] if lines else "")[:200]
    err = next((x for x in reversed(lines) if re.search(r"(Error|Exception|^genlab:|error:)", x)), lines[-1] if lines else "no output")
    return f"crashed (exit {rc}): {err[:200]}"


def _genlab_argv(args: list[str], nproc: int = 1, torchrun: bool = False) -> list[str]:
    """`genlab ARGS` in this interpreter, under torchrun with nproc > 1 (or when asked)."""
    run = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 or torchrun else []
    return [sys.executable, *run, "-m", "genlab", *args]


def _train_args(sw: Sweep, preset: str | None, ovs: list[str], runs: Path, name: str) -> list[str]:
    """`genlab train` of a fresh run (or batched runs) named `name` under `runs`."""
    return ["train", preset or sw.preset, *ovs, f"train.out_dir={runs}", f"train.name={name}",
            "log.progress=false"] + (["train.device=cpu"] if sw.launcher == "cpu" else [])


def _command(sw: Sweep, v: Variant, runs: Path, resume: bool) -> list[str]:
    args = ["train", "--resume", str(runs / v.run_name)] if resume else _train_args(
        sw, v.preset, [resolve(o, runs.parent, sw.stage_map) for o in v.overrides], runs, v.run_name)
    return _genlab_argv(args, v.nproc, sw.launcher == "torchrun")


def _stop(proc: subprocess.Popen, sig, grace: float):
    """Signal the run's whole process group (torchrun has children), then kill it if it lingers."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def needs_gpus(sw: Sweep, v: Variant, gpus: int, of: str = "visible") -> str | None:
    """Why a run cannot start here, or None; `of` says what the count `gpus` is (visible, or chosen with --gpus).
    torchrun on a machine without GPUs runs on the CPU (gloo)."""
    if sw.launcher in ("gpu", "per_gpu") or (sw.launcher == "torchrun" and gpus > 0):
        if v.nproc > max(gpus, 1 if sw.launcher == "torchrun" else gpus):
            return f"needs {v.nproc} GPUs, {gpus} {of}"
    return None


def _env(sw: Sweep, gpus: list[int] | None = None) -> dict:
    """The run's environment; `gpus` (numbered as this process sees them) become its CUDA_VISIBLE_DEVICES,
    through ours when we have one, so that `--gpus 1` under CUDA_VISIBLE_DEVICES=4,5 is device 5."""
    env = {**os.environ, **sw.env}
    env["PYTHONPATH"] = str(REPO_SRC) + os.pathsep + env.get("PYTHONPATH", "")
    if sw.launcher == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif gpus:
        ours = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ours[i] if ours else str(i) for i in gpus)
    return env


def _interruptible(cmd: list[str], log: Path, env: dict, timeout: float) -> tuple[int | None, bool]:
    """A training process: (exit code or None, whether the sweep was stopped); Ctrl-C is passed on to the run, whose
    trainer saves a checkpoint and exits as "interrupted"."""
    try:
        return _genlab(cmd, log, env, timeout)[0], False
    except KeyboardInterrupt:
        return None, True


def _genlab(cmd: list[str], log: Path, env: dict, timeout: float, out: Path | None = None) -> tuple[int | None, float]:
    """One process, its output appended to log (its stdout to `out` when given: a stage's printed result):
    (exit code or None after a timeout, seconds)."""
    t0 = time.time()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, open(out or os.devnull, "w") as o:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        # own session: Ctrl-C of the sweep reaches the process only through us, so a run can checkpoint cleanly
        proc = subprocess.Popen(cmd, stdout=o if out else f, stderr=f, env=env, start_new_session=True)
        _ACTIVE.add(proc)
        try:
            return proc.wait(timeout=timeout), time.time() - t0
        except subprocess.TimeoutExpired:
            _stop(proc, signal.SIGTERM, 30)
            return None, time.time() - t0
        except KeyboardInterrupt:
            _stop(proc, signal.SIGINT, 120)
            raise
        finally:
            _ACTIVE.discard(proc)


def stage_argv(st: Stage, words: list[str], log: Path) -> list[str]:
    """A command stage's process: genlab (under torchrun with nproc > 1; `genlab bench` writes its JSON row beside its
    log), this interpreter for python, bash as it is."""
    head, args = words[0], words[1:]
    if head == "bash":
        return words
    if head == "python":
        return [sys.executable, *args]
    if args[:1] == ["bench"] and "--json" not in args:
        args = args + ["--json", str(log.with_suffix(".json"))]
    return _genlab_argv(args, st.nproc)


def run_command_stage(sw: Sweep, st: Stage, d: Path, gpus: list[int] | None = None, timeout: float | None = None,
                      left: float | None = None) -> dict:
    """A [[stage]] command with its placeholders filled; finished when it exits 0 and made {out} if it names it."""
    out, log = stage_output(d, st), d / "logs" / f"{st.name}.log"
    makes = any("{out}" in w for w in st.command)
    if out.exists() and makes:  # a half-written output of an earlier attempt
        shutil.rmtree(out)
    # `--out {out}`: the command makes it; `--json {out}/r.json`: it writes into it
    (out if makes and "{out}" not in st.command else out.parent).mkdir(parents=True, exist_ok=True)
    cmd = stage_argv(st, [resolve(a, d, sw.stage_map, out, left) for a in st.command], log)
    timeout, t0 = timeout or st.timeout or sw.timeout, time.time()
    rec = {"log": str(log), "run_dir": str(out), "stage": "command"}
    try:
        rc, secs = _genlab(cmd, log, {**_env(sw, gpus), **st.env}, timeout, log.with_suffix(".out"))
    except KeyboardInterrupt:  # the sweep was stopped: this stage runs again next time
        return {**rec, "seconds": time.time() - t0, "status": "interrupted", "reason": "stopped", "_stop": True}
    rec["seconds"] = secs
    if rc == 0 and (out.exists() or not makes):
        return {**rec, "status": "finished", "reason": ""}
    why = f"exited 0 but wrote no {out}" if rc == 0 else failure_reason(log, rc, timeout=timeout)
    return {**rec, "status": "failed", "reason": why, "returncode": rc}


def run_eval(sw: Sweep, v: Variant, d: Path, gpus: list[int] | None = None) -> dict:
    """`genlab eval RUN <v.eval>` after a run finished: its eval_nfe.* files land in the run folder."""
    log, ovs = d / "logs" / f"{v.run_name}.log", [resolve(o, d, sw.stage_map) for o in v.eval]
    cmd = _genlab_argv(["eval", str(d / "runs" / v.run_name), *ovs] + (["--device", "cpu"] if sw.launcher == "cpu" else []))
    rc, secs = _genlab(cmd, log, _env(sw, gpus), sw.timeout)
    return {"eval": "finished" if rc == 0 else "failed: " + failure_reason(log, rc, timeout=sw.timeout),
            "eval_seconds": secs}


def run_variant(sw: Sweep, v: Variant, d: Path, gpus: list[int] | None = None, timeout: float | None = None,
                env: dict | None = None) -> dict:
    """One run as its own process, on `gpus` (None: all visible); the caller checked that it fits (needs_gpus).
    A run stage brings its own timeout and environment."""
    runs = d / "runs"
    run = runs / v.run_name
    log = d / "logs" / f"{v.run_name}.log"
    ckpts = run / "checkpoints"
    resume = ckpts.exists() and any(ckpts.glob("step_*"))
    if run.exists() and not resume:  # started but never checkpointed: start over, keep the old log
        if log.exists():
            log.rename(log.with_suffix(".log.prev"))
        shutil.rmtree(run)
    t0, timeout = time.time(), timeout or sw.timeout
    rc, interrupted = _interruptible(_command(sw, v, runs, resume), log, {**_env(sw, gpus), **(env or {})}, timeout)
    return {**_outcome(run, log, rc, interrupted, t0, timeout, resume), **({"gpus": list(gpus)} if gpus else {})}


def _outcome(run: Path, log: Path, rc: int | None, interrupted: bool, t0: float, timeout: float, resume: bool,
             batched: bool = False) -> dict:
    """One run's record from its process's exit code and its own summary.json."""
    rec = {"log": str(log), "run_dir": str(run), "seconds": time.time() - t0, "resumed": resume}
    st = read_summary(run).get("status")
    if interrupted or (rc == 0 and st == "interrupted"):
        rec.update(status="interrupted", reason="interrupted; re-run the sweep to resume")
    elif rc is None and st == "finished" and (run / "summary.json").stat().st_mtime >= t0:
        # killed while exiting, after this process wrote its summary: keep the result
        rec.update(status="finished", reason=f"finished; stopped at the {timeout:.0f} s timeout while exiting")
    elif rc is None:
        rec.update(status="failed", reason=f"timeout after {timeout:.0f} s")
    elif st == "finished" and (rc == 0 or (batched and (run / "summary.json").stat().st_mtime >= t0)):
        # a batched process exits non-zero when any of its seeds failed; this seed's own summary says it finished
        rec.update(status="finished", reason="")
    else:
        rec.update(status="failed", reason=failure_reason(log, rc, run), returncode=rc)
    if interrupted:
        rec["_stop"] = True
    return rec


def _members(vs: list[Variant]) -> dict | None:
    """batched_variants: the train.* lists whose cross product with the seeds is exactly the runs `vs` (in order of
    first appearance), or None when they are not such a product (e.g. some of a grid's runs already finished)."""
    keys = list(vs[0].batch["values"])
    lists = {k: list(dict.fromkeys(v.batch["values"][k] for v in vs)) for k in keys}
    seeds = list(dict.fromkeys(v.seed for v in vs))
    wanted = {(tuple(v.batch["values"][k] for k in keys), v.seed) for v in vs}
    product = {(c, s) for c in itertools.product(*lists.values()) for s in seeds}
    return lists if len(vs) == len(wanted) and wanted == product else None


def run_seed_group(sw: Sweep, vs: list[Variant], d: Path, gpus: list[int] | None = None) -> list[dict] | None:
    """A variant's seeds (`vs`, all still to do) as one batched `genlab train ... train.seeds=...` process, or with
    batched_variants the runs of several variants that differ only in batchable grid axes (docs/sweeps.md); None when
    they cannot run batched (folders at different points, not a grid): the caller runs them one by one."""
    runs = d / "runs"
    lists = _members(vs) if vs[0].batch is not None else {}
    if lists is None:
        return None
    variants = len({v.name for v in vs})
    log = d / "logs" / (f"{vs[0].name}-seeds.log" if variants == 1 and not lists else f"{vs[0].name}-batch{variants}.log")
    last = [max((p.name for p in (runs / v.run_name / "checkpoints").glob("step_*")), default=None) for v in vs]
    resume = all(last) and len(set(last)) == 1
    if any(last) and not resume:
        return None
    if resume:
        cmd = _genlab_argv(["train", *(a for v in vs for a in ("--resume", str(runs / v.run_name)))])
    else:
        for v in vs:  # started but never checkpointed: start over
            if (runs / v.run_name).exists():
                shutil.rmtree(runs / v.run_name)
        batched_keys = {VARIANT_KEYS[n][0] for n in lists}
        ovs = [resolve(o, d, sw.stage_map) for o in vs[0].overrides
               if not o.startswith("train.seed=") and o.split("=", 1)[0].strip() not in batched_keys]
        ovs += ["train.seeds=" + ",".join(map(str, dict.fromkeys(v.seed for v in vs))),
                *(f"train.{n}={','.join(values)}" for n, values in lists.items())]
        cmd = _genlab_argv(_train_args(sw, vs[0].preset, ovs, runs, vs[0].batch["template"] if lists else vs[0].name))
    t0, timeout = time.time(), sw.timeout * len(vs)  # the work of len(vs) runs, in one process
    rc, interrupted = _interruptible(cmd, log, _env(sw, gpus), timeout)
    return [{**_outcome(runs / v.run_name, log, rc, interrupted, t0, timeout, resume, batched=True), "batched_seeds": len(vs),
             **({"gpus": list(gpus)} if gpus else {})} for v in vs]


def _stage_done(st: Stage, d: Path, status: dict) -> bool:
    """Finished, and what it made is still there (a command that names no {out} leaves only its record)."""
    if status.get(st.name, {}).get("status") != "finished":
        return False
    if not st.is_run:
        return stage_output(d, st).exists() or not any("{out}" in w for w in st.command)
    return stage_output(d, st).exists() and read_summary(stage_output(d, st)).get("status") == "finished"


def evaluate_finished(sw: Sweep, d: Path, status: dict, deadline, prog, runs=None, gpus: list[int] | None = None) -> None:
    """`genlab eval` of every finished run (or of `runs`) that has eval overrides and no finished evaluation yet."""
    for v in runs if runs is not None else [sw.as_run(s) for s in sw.stages if s.is_run] + sw.variants:
        rec = status.get(v.run_name, {})
        if not v.eval or rec.get("status") != "finished" or rec.get("eval") == "finished":
            continue
        if deadline is not None and time.time() > deadline:
            return
        prog.say(f"evaluating {v.run_name} ...")
        rec.update(run_eval(sw, v, d, gpus))
        save_status(d, status)
        prog.say(f"{v.run_name}: eval {rec['eval']} in {rec['eval_seconds']:.0f} s")


class _Progress:
    """Overall progress on the training console (core.progress: a tqdm bar on a terminal, else one line per event)."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.total, self.done, self.t0, self.ran = total, done, time.time(), 0
        self.console = TrainStatus(total, done, "sweep") if enabled else None

    def say(self, msg: str):
        if self.console is not None:
            self.console.note(msg)

    def finished(self, v: Variant, rec: dict):
        self.done += 1
        self.ran += 1
        extra = f" ({rec['reason']})" if rec.get("reason") else ""
        left = self.total - self.done
        eta = (time.time() - self.t0) / self.ran * left
        self.say(f"[{self.done}/{self.total}] {v.run_name}: {rec['status']}{extra} in {rec.get('seconds', 0):.0f} s"
                 + (f"; {left} left, about {eta / 60:.1f} min" if left else ""))
        if self.console is not None:
            self.console.update()


def _pass_interrupt(wait, stop: threading.Event):
    """wait(); Ctrl-C reaches only us (the runs have their own sessions): pass it on, so that they checkpoint."""
    try:
        wait()
    except KeyboardInterrupt:
        stop.set()
        for p in list(_ACTIVE):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)


def _tags(v: Variant) -> dict:
    """The variant a run's status record belongs to."""
    return {"variant": v.name, "seed": v.seed, "overrides": v.overrides, **({"reference": v.reference} if v.reference else {})}


def header() -> str:
    """Where and with what a sweep ran: date, commit, device, torch (and triton) versions."""
    def cmd(args):
        try:
            r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=REPO_SRC.parent)
            return r.stdout.strip() if r.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            return ""
    import torch
    gpu = cmd(["nvidia-smi", "--query-gpu=name,clocks.max.sm,memory.total", "--format=csv,noheader"])
    device = gpu.replace("\n", "; ") if gpu else f"CPU only ({os.cpu_count()} cores)"
    try:
        versions = f"torch {torch.__version__}, triton {importlib.metadata.version('triton')}"
    except importlib.metadata.PackageNotFoundError:
        versions = f"torch {torch.__version__}"
    dirty = " (with uncommitted changes)" if cmd(["git", "status", "--porcelain", "--untracked-files=no"]) else ""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return f"{date}, commit {cmd(['git', 'rev-parse', '--short', 'HEAD']) or 'unknown'}{dirty}, {device}, {versions}"


def todo_runs(sw: Sweep, d: Path, status: dict, retry_failed: bool) -> list[Variant]:
    """The runs still to do. A run whose summary says finished counts as finished even if status.json
    missed it (e.g. the sweep was killed between the run's end and the status write)."""
    todo = []
    for v in sw.variants:
        st = status.get(v.run_name, {}).get("status")
        run = d / "runs" / v.run_name
        if st != "finished" and read_summary(run).get("status") == "finished" and (run / "metrics.jsonl").exists():
            status[v.run_name] = {"status": "finished", "reason": "", "run_dir": str(run), "recovered": True,
                                  "log": str(d / "logs" / f"{v.run_name}.log"), "variant": v.name, "seed": v.seed,
                                  "overrides": v.overrides}
        elif not (st == "finished" or (st in ("failed", "skipped") and not retry_failed)):
            todo.append(v)
    return todo


def run_sweep(sw: Sweep, root="sweeps", retry_failed: bool = False, progress: bool = True,
              max_time: float | None = None, jobs_per_gpu: int = 1, gpus: list[int] | None = None) -> Path:
    """Run what is left of a sweep, then write its report. `max_time` (s): start no run after this long (the rest are
    not_run); `jobs_per_gpu` > 1 packs single-process runs onto each GPU; `gpus` (choose_gpus; None: all visible) are
    the GPUs it may use. How runs are placed and retried: docs/sweeps.md."""
    d = sweep_dir(sw, root)
    d.mkdir(parents=True, exist_ok=True)
    with sweep_lock(d):
        return _run_sweep(sw, d, retry_failed, progress, max_time, jobs_per_gpu, gpus)


def _run_sweep(sw: Sweep, d: Path, retry_failed: bool, progress: bool, max_time: float | None, jobs_per_gpu: int,
               gpus: list[int] | None) -> Path:
    shutil.copyfile(sw.path, d / "sweep.toml")
    (d / "env.txt").write_text(header() + "\n")  # the report's first line
    (d / "overrides.json").write_text(json.dumps(sw.cli))  # what its runs were made with (check_runs)
    status = load_status(d)
    order = sw.order or [v.run_name for v in sw.variants]  # sweep-file order, also under --only
    todo = todo_runs(sw, d, status, retry_failed)
    save_status(d, status)
    of = "visible" if gpus is None else "chosen"
    chosen = [] if sw.launcher == "cpu" else list(range(visible_gpus())) if gpus is None else list(gpus)
    first = chosen[:1]  # stages, evaluations, batched seeds, runs one after another
    stages_todo = [st for st in sw.stages if not _stage_done(st, d, status)]
    total = len(sw.variants) + len(sw.stages)
    prog = _Progress(total, total - len(todo) - len(stages_todo), progress)
    prog.say(f"sweep {sw.name}: {total} runs, {total - len(todo) - len(stages_todo)} already done, "
             f"{len(todo) + len(stages_todo)} to run -> {d}")
    deadline = None if max_time is None else time.time() + max_time
    lock = threading.Lock()
    stop = threading.Event()

    def finish(v: Variant, rec: dict):
        halt = rec.pop("_stop", False)
        with lock:
            old = status.get(v.run_name, {})
            kept = {k: old[k] for k in ("eval", "eval_seconds") if k in old and rec.get("status") == old.get("status") == "finished"}
            status[v.run_name] = {**kept, **rec, **_tags(v)}
            ordered = {**{k: status[k] for k in order if k in status}, **status}  # sweep-file order, the rest after
            status.clear()
            status.update(ordered)
            save_status(d, status)
            prog.finished(v, rec)
        if halt:
            stop.set()

    def started(v: Variant):
        """Recorded before a run starts, so a sweep killed outright (SIGKILL, a lost machine) leaves the run listed:
        the next call runs or resumes it, and `sweep report --partial` counts what it logged."""
        with lock:
            status[v.run_name] = {"status": "running", "reason": "started; no exit recorded (running, or the sweep was killed)",
                                  "log": str(d / "logs" / f"{v.run_name}.log"), "run_dir": str(d / "runs" / v.run_name),
                                  "started": time.time(), **_tags(v), **({"stage": "run"} if v.stage else {})}
            save_status(d, status)

    def over() -> bool:
        return stop.is_set() or (deadline is not None and time.time() > deadline)

    def attempt(v: Variant, on: list[int], st: Stage | None = None) -> dict:
        late = over()
        why = None if late else needs_gpus(sw, v, len(chosen), of)
        if late or why:
            return {"status": "skipped" if why else "not_run",
                    "reason": why or ("sweep interrupted" if stop.is_set() else "sweep time budget used up"),
                    "log": "", "run_dir": str(d / "runs" / v.run_name)}
        prog.say(f"[{prog.done + 1}/{prog.total}] running {v.run_name} ...")
        left = None if deadline is None else deadline - time.time()
        limit = None if st is None else min((st.timeout or sw.timeout), left or float("inf"))  # no stage outlives it
        if st is not None and not st.is_run:
            return run_command_stage(sw, st, d, on, limit, left)
        started(v)
        return run_variant(sw, v, d, on) if st is None else run_variant(sw, v, d, on, limit, st.env)

    def blocked(v: Variant) -> dict:
        """A run whose stage did not finish: failed with it, or left for the next call when it was not run."""
        name = sorted(sw.needs(v) & failed)[0]
        later = status.get(name, {}).get("status") in ("not_run", "interrupted")
        return {"status": "not_run" if later else "failed", "reason": f"stage '{name}' did not finish", "log": ""}

    def one_stage(st: Stage):
        as_run = sw.as_run(st)
        tag = {"stage": "run" if st.is_run else "command", **({"table": st.table} if st.table else {})}
        if sw.needs(as_run) & failed:
            finish(as_run, {**blocked(as_run), "run_dir": str(stage_output(d, st)), **tag})
        elif st.creates and Path(resolve(st.creates, d, sw.stage_map)).exists():
            finish(as_run, {"status": "finished", "reason": f"{st.creates} is there already", "log": "", **tag})
        elif st in stages_todo and not (status.get(st.name, {}).get("status") in ("failed", "skipped") and not retry_failed):
            # not_run once the time budget is used up; a command sees every GPU, a run its first nproc
            finish(as_run, {**attempt(as_run, chosen[:st.nproc] if st.is_run else chosen, st), **tag})
            if st.is_run:
                evaluate_finished(sw, d, status, None, prog, runs=[as_run], gpus=first)

    try:
        failed = set()  # stages that did not finish: what needs them is not run
        # stages in order, those next to each other with one (non-empty) group together: they run at the same time
        for group in [list(g) for _, g in itertools.groupby(sw.stages, lambda st: st.group or id(st))]:
            if len(group) == 1:
                one_stage(group[0])
            else:
                with ThreadPoolExecutor(len(group)) as pool:
                    _pass_interrupt(lambda: list(pool.map(one_stage, group)), stop)
            failed |= {st.name for st in group if status.get(st.name, {}).get("status") != "finished"}
        for v in [v for v in todo if sw.needs(v) & failed]:
            todo.remove(v)
            finish(v, {**blocked(v), "run_dir": str(d / "runs" / v.run_name)})
        if sw.batched_seeds:  # each variant's seeds still to do (batched_variants: each grid's runs): one process
            groups: dict[str, list] = {}
            for v in todo:
                groups.setdefault(v.batch["template"] if sw.batched_variants and v.batch else v.name, []).append(v)
            for vs in groups.values():
                if over():
                    break  # the one-by-one loop below records them as not_run
                if needs_gpus(sw, vs[0], len(chosen), of):
                    continue  # the one-by-one loop records them as skipped
                prog.say(f"[{prog.done + 1}/{prog.total}] running {', '.join(v.run_name for v in vs)} batched ...")
                for v in vs:
                    started(v)
                recs = run_seed_group(sw, vs, d, first)
                if recs is None:
                    continue  # left in todo: one by one
                for v, rec in zip(vs, recs):
                    todo.remove(v)
                    finish(v, rec)
                evaluate_finished(sw, d, status, None, prog, runs=vs, gpus=first)
        single = [v for v in todo if v.nproc == 1]
        slots = len(chosen) * jobs_per_gpu if sw.launcher in ("gpu", "per_gpu") else 0
        if slots > 1 and (sw.launcher == "per_gpu" or jobs_per_gpu > 1) and single:
            free = [g for _ in range(jobs_per_gpu) for g in reversed(chosen)]  # pop() takes the first chosen first

            def job(v):
                with lock:
                    gpu = free.pop()
                try:
                    rec = attempt(v, [gpu])
                    if jobs_per_gpu > 1:
                        rec["jobs_per_gpu"] = jobs_per_gpu
                    return rec
                finally:
                    with lock:
                        free.append(gpu)
            with ThreadPoolExecutor(max_workers=slots) as pool:
                futures = {pool.submit(job, v): v for v in single}
                pending = set(futures)
                def drain():
                    for fut in as_completed(pending):
                        pending.discard(fut)
                        finish(futures[fut], fut.result())
                while pending:
                    _pass_interrupt(drain, stop)
            if jobs_per_gpu > 1:  # out of memory beside other runs: once more, alone on a GPU, after the pool
                for v in single:
                    rec = status.get(v.run_name, {})
                    if rec.get("status") == "failed" and str(rec.get("reason", "")).startswith("oom"):
                        prog.say(f"{v.run_name}: out of memory beside other runs; running it again, alone")
                        again = attempt(v, first)
                        again["retried_alone_after"] = rec["reason"][:120]
                        finish(v, again)
            todo = [v for v in todo if v.nproc > 1]  # multi-process runs: on the first nproc GPUs, one after another
        for v in todo:
            finish(v, attempt(v, chosen[:v.nproc]))
            # evaluated at once, so that --max-time, which only stops new runs from starting, cannot starve it
            evaluate_finished(sw, d, status, None, prog, runs=[v], gpus=first)
        if stop.is_set():
            raise KeyboardInterrupt
        evaluate_finished(sw, d, status, deadline, prog, gpus=first)
    finally:
        if prog.console is not None:
            prog.console.close()
        write_report(d)
    return d
