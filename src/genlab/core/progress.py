"""Console progress for training, evaluation and sampling: a tqdm bar on a terminal, else plain lines (a log reads
top to bottom). `log.progress=false` silences status lines, bars and eval/sampling progress, never the start line
or the summary."""
from __future__ import annotations

import contextlib
import sys
import time

_enabled = True
QUIET_LINE_EVERY_S = 15.0  # off a terminal: a long eval or sampling loop reports at most this often
# A run on the CPU is estimated from its analytic FLOPs at this training rate per thread: optimistic on purpose (the
# 2-core machine sustains ~16 GFLOP/s per thread on digits_flow, docs/benchmarks.md), so the estimate is a lower bound
CPU_FLOPS_PER_THREAD = 50e9
CPU_WARN_AFTER_S = 600.0  # warn when even that estimate exceeds 10 minutes of training


@contextlib.contextmanager
def enabled(on: bool):
    """Turn progress output on or off for the code inside (the trainer applies `log.progress`)."""
    global _enabled
    old, _enabled = _enabled, bool(on)
    try:
        yield
    finally:
        _enabled = old


def is_on() -> bool:
    return _enabled


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _tqdm(**kw):
    from tqdm.auto import tqdm
    return tqdm(dynamic_ncols=True, **kw)


def fmt_duration(s: float) -> str:
    s = int(round(max(s, 0.0)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


def cpu_slow_warning(flops_per_step: float, steps_left: int, threads: int) -> str | None:
    """A one-line warning when a CPU run's optimistic time estimate exceeds CPU_WARN_AFTER_S (e.g. a GPU preset on a
    laptop), else None."""
    rate = CPU_FLOPS_PER_THREAD * max(1, threads)
    per_step = flops_per_step / rate
    if per_step * steps_left < CPU_WARN_AFTER_S:
        return None
    return (f"training on the CPU: {flops_per_step / 1e9:,.0f} GFLOP per step, so {steps_left} steps take at least "
            f"~{fmt_duration(per_step * steps_left)} (~{per_step:.2g} s/step at an optimistic {rate / 1e9:.0f} GFLOP/s "
            f"for {threads} threads); this looks like a GPU recipe: use a GPU, or lower train.steps or the model size. "
            f"The first status line follows step 1")


def status_line(rec: dict, total: int, eta_s: float | None) -> str:
    """`step 100/800  loss 0.5123  lr 1.00e-03  912 samples/s  ETA 1m05s`."""
    parts = [f"step {rec['step']}/{total}", f"loss {rec['loss']:.4f}"]
    if rec.get("lr") is not None:
        parts.append(f"lr {rec['lr']:.2e}")
    if rec.get("samples_per_s") is not None:
        parts.append(f"{rec['samples_per_s']:.0f} samples/s")
    if rec.get("tokens_per_s"):
        parts.append(f"{rec['tokens_per_s']:.0f} tok/s")
    if eta_s is not None:
        parts.append(f"ETA {fmt_duration(eta_s)}")
    return "  ".join(parts)


class TrainStatus:
    """The training console: a status line per logged step, plus a tqdm bar on a terminal."""

    def __init__(self, total: int, initial: int, desc: str):
        self.total, self.stream = total, sys.stdout
        self.bar = _tqdm(total=total, initial=initial, desc=desc, leave=True) if _is_tty(sys.stderr) else None
        self.t0, self.step0 = time.perf_counter(), initial

    def log(self, rec: dict):
        done = rec["step"] - self.step0
        elapsed = time.perf_counter() - self.t0
        # mean speed since this process started (the first step's compile time is included, so early ETAs run high)
        eta = elapsed / done * (self.total - rec["step"]) if done > 0 else None
        line = status_line(rec, self.total, eta)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{rec['loss']:.4f}", sps=f"{rec.get('samples_per_s') or 0:.0f}")
        self.note(line)

    def note(self, line: str):
        """One line between status lines (printed whether or not the status lines are on)."""
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def update(self, n: int = 1):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Task:
    """Progress of one eval or sampling loop: a transient tqdm bar on a terminal; elsewhere a line at
    most every QUIET_LINE_EVERY_S and one when it finishes."""

    def __init__(self, desc: str, total: int | None, unit: str = "it", stream=None):
        self.desc, self.total, self.unit, self.n = desc, total, unit, 0
        self.stream = stream or sys.stderr
        self.on = _enabled
        self.bar = _tqdm(total=total, desc=desc, unit=unit, leave=False, file=self.stream) \
            if self.on and _is_tty(self.stream) else None
        self.t0 = self.t_line = time.perf_counter()

    def _count(self) -> str:
        return f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"

    def update(self, n: int = 1):
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.on and time.perf_counter() - self.t_line >= QUIET_LINE_EVERY_S:
            self.t_line = time.perf_counter()
            print(f"{self.desc}: {self._count()} ({fmt_duration(self.t_line - self.t0)})", file=self.stream, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.on:
            print(f"{self.desc}: {self._count()} in {time.perf_counter() - self.t0:.1f} s", file=self.stream, flush=True)
        self.on = False  # closing twice prints once

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def track(iterable, desc: str, total: int | None = None, unit: str = "it"):
    """Iterate with a Task around the loop."""
    with Task(desc, total if total is not None else len(iterable), unit) as task:
        for x in iterable:
            yield x
            task.update(1)
