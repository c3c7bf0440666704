"""Run every variant of a sweep as its own `genlab train` process; record what happened to each.

State lives in sweeps/<name>/status.json (written atomically after every variant), so re-running a
sweep skips finished variants, resumes interrupted ones from their last checkpoint and never loses a
finished result. A crash, an out-of-memory error, a timeout or a non-finite loss becomes a failed row
with its reason and log; the remaining variants still run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from genlab.sweep.spec import Sweep, Variant

REPO_SRC = Path(__file__).resolve().parents[2]


def sweep_dir(sw: Sweep, root="sweeps") -> Path:
    return Path(root) / sw.name


def load_status(d: Path) -> dict:
    p = d / "status.json"
    return json.loads(p.read_text()) if p.exists() else {}


def save_status(d: Path, status: dict):
    tmp = d / "status.json.tmp"
    tmp.write_text(json.dumps(status, indent=2))
    os.replace(tmp, d / "status.json")


def visible_gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


def _failure_reason(log: Path, rc: int) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if "out of memory" in text.lower():
        return "oom: " + next((x for x in reversed(lines) if "out of memory" in x.lower()), "")[:200]
    if rc == 3 or "genlab: diverged" in text:
        return "diverged: " + next((x for x in reversed(lines) if "diverged" in x), "non-finite loss")[:200]
    if rc == 2:
        return "bad config: " + (lines[-1] if lines else "")[:200]
    return f"crashed (exit {rc}): " + (lines[-1] if lines else "no output")[:200]


def _command(sw: Sweep, v: Variant, runs: Path, resume: bool) -> list[str]:
    train = ["-m", "genlab", "train"]
    if resume:
        args = train + ["--resume", str(runs / v.run_name)]
    else:
        args = train + [sw.preset, *v.overrides, f"train.out_dir={runs}", f"train.name={v.run_name}", "log.progress=false"]
    if sw.launcher == "cpu":
        args += ["train.device=cpu"] if not resume else []
    if v.nproc > 1 or sw.launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={v.nproc}", *args]
    return [sys.executable, *args]


def run_variant(sw: Sweep, v: Variant, d: Path, gpu: int | None = None) -> dict:
    runs = d / "runs"
    run = runs / v.run_name
    log = d / "logs" / f"{v.run_name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    if sw.launcher in ("gpu", "per_gpu", "torchrun") and v.nproc > max(1, visible_gpus()):
        return {"status": "skipped", "reason": f"needs {v.nproc} GPUs, {visible_gpus()} visible", "log": str(log)}
    has_ckpt = (run / "checkpoints").exists() and any((run / "checkpoints").glob("*.pt"))
    resume = run.exists() and has_ckpt
    if run.exists() and not has_ckpt:  # started but never checkpointed: start over, keep the old log
        if log.exists():
            log.rename(log.with_suffix(".log.prev"))
        shutil.rmtree(run)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_SRC) + os.pathsep + env.get("PYTHONPATH", "")
    if sw.launcher == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(_command(sw, v, runs, resume))}\n")
        f.flush()
        try:
            rc = subprocess.run(_command(sw, v, runs, resume), stdout=f, stderr=subprocess.STDOUT, env=env,
                                timeout=sw.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    rec = {"log": str(log), "run_dir": str(run), "seconds": time.time() - t0, "resumed": resume}
    summary = run / "summary.json"
    if rc is None:
        rec.update(status="failed", reason=f"timeout after {sw.timeout:.0f} s")
    elif rc == 0 and summary.exists() and json.loads(summary.read_text()).get("status") == "finished":
        rec.update(status="finished", reason="")
    else:
        rec.update(status="failed", reason=_failure_reason(log, rc), returncode=rc)
    return rec


def run_sweep(sw: Sweep, root="sweeps", retry_failed: bool = False, progress: bool = True) -> Path:
    d = sweep_dir(sw, root)
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sw.path, d / "sweep.toml") if not (d / "sweep.toml").exists() else None
    status = load_status(d)
    todo = []
    for v in sw.variants:
        st = status.get(v.run_name, {}).get("status")
        if st == "finished" or (st in ("failed", "skipped") and not retry_failed):
            continue
        todo.append(v)
    done = len(sw.variants) - len(todo)
    say = (lambda msg: print(msg, flush=True)) if progress else (lambda msg: None)
    say(f"sweep {sw.name}: {len(sw.variants)} runs, {done} already done, {len(todo)} to run -> {d}")

    def finish(v, rec):
        nonlocal done
        status[v.run_name] = {**rec, "variant": v.name, "seed": v.seed, "overrides": v.overrides}
        save_status(d, status)
        done += 1
        extra = f" ({rec['reason']})" if rec.get("reason") else ""
        say(f"[{done}/{len(sw.variants)}] {v.run_name}: {rec['status']}{extra} in {rec.get('seconds', 0):.0f} s")

    if sw.launcher == "per_gpu" and visible_gpus() > 1:
        n = visible_gpus()
        free = list(range(n))
        with ThreadPoolExecutor(max_workers=n) as pool:
            def job(v):
                gpu = free.pop()
                try:
                    return v, run_variant(sw, v, d, gpu)
                finally:
                    free.append(gpu)
            for v, rec in pool.map(job, todo):
                finish(v, rec)
    else:
        for v in todo:
            say(f"[{done + 1}/{len(sw.variants)}] running {v.run_name} ...")
            finish(v, run_variant(sw, v, d))
    from genlab.sweep.report import write_report
    write_report(d)
    return d
