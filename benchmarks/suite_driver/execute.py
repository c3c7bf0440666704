"""Running a suite: the shared setup, then every entry in its own process (cold), then the tables.

Setup (what every GPU script used to repeat): the output folder with logs/, `PYTHONPATH=src`, missing wheels
installed from $WHEELS, and a header naming the date, commit, device and torch/triton versions that heads every
table. Entries run in file order; consecutive entries with one `group` run at the same time. An entry past its
timeout gets `stop_signal` (default TERM; INT lets `genlab train` save a checkpoint) and is killed a minute later.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from . import spec as S
from . import tables

PACK_EXCLUDE = ("checkpoints", ".pt", "events.out.tfevents")


class Runner:
    def __init__(self, suite: S.Suite, out: Path, argv_text: str, keep_logs: bool = False, echo=print):
        self.suite, self.out, self.argv_text, self.keep_logs, self.echo = suite, out, argv_text, keep_logs, echo
        self.logs = out / "logs"
        self.start = time.monotonic()
        self.results: list[dict] = []
        self.budget = float(S.expand(str(suite.raw.get("budget_s", 540)), S.builtins(suite, str(out))))

    # ---- setup
    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def values(self, entry: S.Entry) -> dict:
        return {**S.builtins(self.suite, str(self.out), self.left()), **entry.values}

    def stamp(self, text: str):
        line = f"[{time.monotonic() - self.start:.0f}s] {text}"
        self.echo(line)
        with open(self.out / "main.log", "a") as f:
            f.write(line + "\n")

    def environment(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = "src" + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        base = S.builtins(self.suite, str(self.out))
        env.update({k: S.expand(str(v), base) for k, v in self.suite.raw.get("env", {}).items()})
        return env

    def install_wheels(self, env: dict):
        """Missing modules (tomli_w always, plus the suite's `wheels`) come from the carried wheels folder."""
        missing = [m for m in ["tomli_w", *self.suite.raw.get("wheels", [])]
                   if subprocess.run([sys.executable, "-c", f"import {m}"], capture_output=True, env=env).returncode]
        if not missing:
            return
        wheels = Path(os.environ.get("WHEELS", "wheels"))
        files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
        if not files:
            self.stamp(f"missing {', '.join(missing)} and no wheels in {wheels}/: entries that need them will fail")
            return
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *files],
                           capture_output=True, text=True, env=env)
        self.stamp(f"installed {len(files)} wheels from {wheels}/ for {', '.join(missing)}" if r.returncode == 0
                   else f"pip install failed: {r.stderr[-300:]}")

    def header(self, env: dict) -> str:
        def cmd(args):
            try:
                r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
                return r.stdout.strip() if r.returncode == 0 else ""
            except (OSError, subprocess.TimeoutExpired):
                return ""
        gpu = cmd(["nvidia-smi", "--query-gpu=name,clocks.max.sm,memory.total", "--format=csv,noheader"])
        device = gpu.replace("\n", "; ") if gpu else f"CPU only ({os.cpu_count()} cores)"
        versions = cmd([sys.executable, "-c", "import torch; v = 'torch ' + torch.__version__\n"
                        "try:\n import triton; v += ', triton ' + triton.__version__\nexcept ImportError: pass\nprint(v)"])
        commit = cmd(["git", "rev-parse", "--short", "HEAD"]) or "unknown"
        dirty = " (with uncommitted changes)" if cmd(["git", "status", "--porcelain", "--untracked-files=no"]) else ""
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        return (f"{date}, commit {commit}{dirty}, {device}, {versions or 'torch ?'}\n"
                f"command: `{self.argv_text}`")

    # ---- one entry
    def skip_reason(self, entry: S.Entry, v: dict) -> str | None:
        sp = entry.spec
        if "when" in sp and not S.truthy(S.expand(str(sp["when"]), v)):
            return f"skipped: {sp['when']} is not set"
        if "creates" in sp and Path(S.expand(sp["creates"], v)).exists():
            return "skipped: already there"
        if "needs" in sp:
            need = S.expand(sp["needs"], v)
            if need and not Path(need).exists():
                return f"skipped: needs {need}"
        if "unless_finished" in sp:
            summary = Path(S.expand(sp["unless_finished"], v)) / "summary.json"
            if summary.exists() and json.loads(summary.read_text()).get("status") == "finished":
                return "skipped: the run finished"
        if self.left() < float(S.expand(str(sp.get("min_left", 30)), v)):
            return "skipped: out of budget"
        return None

    def fill_steps(self, entry: S.Entry, v: dict, args: list[str]) -> list[str]:
        """train.steps sized so that the run takes `seconds`, from a step time measured by an earlier entry."""
        f = entry.spec["fill_steps"]
        seconds = S.expand(str(f["seconds"]), v)
        if not S.truthy(seconds):
            return args
        path = Path(S.expand(f["json"], v))
        step = json.loads(path.read_text()).get(f["key"]) if path.exists() else None
        if step is None:
            if "default" not in f:
                raise RuntimeError(f"fill_steps: no {f['key']} in {path}")
            step = float(f["default"])
        step_s = float(step) * float(f.get("unit", 1))
        n = int((float(seconds) - float(f.get("startup_s", 0))) / (float(f.get("factor", 1)) * step_s))
        mult = int(f.get("multiple", 1))
        n = max(int(S.expand(str(f.get("min", 1)), v)), n // mult * mult)
        self.stamp(f"{entry.name}: step {step_s * 1e3:.1f} ms -> train.steps={n} for {seconds} s")
        return [a for a in args if not a.startswith("train.steps=")] + [f"train.steps={n}"]

    def command(self, entry: S.Entry, v: dict, dry: bool = False) -> tuple[list[str], str | None]:
        if entry.kind == "shell":
            return ["bash", "-c", S.expand(entry.spec["shell"], v)], None
        args = S.expand_args(entry.spec.get("args", []), v)
        run_dir = None
        if entry.kind == "train":
            run = S.expand(entry.spec.get("run", "{name}"), v).replace("#", "_r")
            run_dir = f"{v['runs']}/{run}"
            args = args + [f"train.out_dir={v['runs']}", f"train.name={run}"]
            if "fill_steps" in entry.spec and not dry:
                args = self.fill_steps(entry, v, args)
        if entry.kind == "bench":
            args = args + ["--json", str(self.logs / f"{entry.name}.json")]
        py = [sys.executable]
        if entry.kind in ("bench", "train", "eval", "genlab", "sweep"):
            sub = {"bench": "bench", "train": "train", "eval": "eval", "sweep": "sweep"}.get(entry.kind)
            head = ["-m", "genlab"] + ([sub] if sub else [])
            if entry.spec.get("nproc"):
                nproc = S.expand(str(entry.spec["nproc"]), v)  # a number or "{WORLD}"
                head = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] + head
            return py + head + args, run_dir
        return py + args, run_dir

    def start_entry(self, entry: S.Entry, env: dict):
        v = self.values(entry)
        reason = self.skip_reason(entry, v)
        if reason:
            self.stamp(f"{entry.name}: {reason}")
            return None, {"name": entry.name, "status": reason, "entry": entry}
        try:
            argv, run_dir = self.command(entry, v)
        except (RuntimeError, S.SuiteError) as e:
            self.stamp(f"{entry.name}: {e}")
            return None, {"name": entry.name, "status": f"failed: {e}", "entry": entry}
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)   # genlab never overwrites a run folder: a fresh one each time
        e_env = {**env, **{k: S.expand(str(x), v) for k, x in entry.spec.get("env", {}).items()}}
        out, err = open(self.logs / f"{entry.name}.out", "w"), open(self.logs / f"{entry.name}.err", "w")
        err.write("$ " + " ".join(argv) + "\n")
        err.flush()
        self.stamp(f"{entry.name}: start")
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=e_env, start_new_session=True)
        # the budget bounds when an entry may start and how long it may run; a sweep bounds itself (--max-time)
        limit = entry.timeout if entry.kind == "sweep" else min(entry.timeout, self.left())
        return proc, {"name": entry.name, "entry": entry, "run_dir": run_dir, "values": v, "files": (out, err),
                      "deadline": time.monotonic() + limit, "limit": limit, "t0": time.monotonic()}

    def wait(self, proc, rec: dict):
        sig = getattr(signal, "SIG" + rec["entry"].spec.get("stop_signal", "TERM"))
        timed_out = False
        try:
            proc.wait(timeout=max(1, rec["deadline"] - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(proc, sig)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        for f in rec.pop("files"):
            f.close()
        took = time.monotonic() - rec["t0"]
        rec["status"] = (f"timed out after {rec['limit']:.0f} s" if timed_out
                         else "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode}, see logs/{rec['name']}.err)")
        self.stamp(f"{rec['name']}: {rec['status']} in {took:.0f} s")
        self.collect(rec)

    def collect(self, rec: dict):
        entry, v = rec["entry"], rec["values"]
        text = (self.logs / f"{entry.name}.out").read_text(errors="replace")
        rec["text"] = text
        data = None
        if entry.kind == "bench":
            p = self.logs / f"{entry.name}.json"
            data = json.loads(p.read_text()) if p.exists() else None
        elif entry.kind == "train" and rec.get("run_dir"):
            run = Path(rec["run_dir"])
            if (run / "summary.json").exists():
                data = json.loads((run / "summary.json").read_text())
            rec["curves"] = _curves(run / "metrics.jsonl")
        elif entry.kind == "eval" or entry.spec.get("result") == "json":
            data = tables.read_json_tail(text)
        elif entry.kind == "sweep" and entry.spec.get("args"):
            sweep = S.expand_args(entry.spec["args"][:1], v)[0]
            folder = Path(v["root"]) / Path(sweep).stem
            if (folder / "report.md").exists():
                rec["text"] = (folder / "report.md").read_text()
                shutil.copy(folder / "report.md", self.out / f"{folder.name}_report.md")
            if folder.exists():
                _pack(folder, self.out / f"{folder.name}.tgz")
        rec["data"] = data
        for pattern in entry.spec.get("collect", []):
            src = Path(S.expand(pattern, v))
            if src.exists():
                shutil.copy(src, self.out / f"{entry.name}_{src.name}")

    # ---- the suite
    def run(self, entries: list[S.Entry]) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        env = self.environment()
        self.install_wheels(env)
        head = self.header(env)
        (self.out / "env.txt").write_text(head + "\n")
        self.stamp(head)
        i, started, stopped = 0, [], None
        handlers = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while i < len(entries):
                group = [entries[i]]
                g = entries[i].group
                while g and i + len(group) < len(entries) and entries[i + len(group)].group == g:
                    group.append(entries[i + len(group)])
                started = []
                for e in group:  # one by one: a stop between two starts still finds the first
                    started.append(self.start_entry(e, env))
                for proc, rec in started:
                    if proc is not None:
                        self.wait(proc, rec)
                    self.results.append(rec)
                started = []
                i += len(group)
        except Stopped as e:  # an outer limit (timeout, scheduler, Ctrl-C): the rows so far still become tables
            stopped = e.args[0]
            for proc, rec in started:
                if rec in self.results:
                    continue
                if proc is not None:
                    self.halt(proc, rec, stopped)
                self.results.append(rec)
            self.stamp(f"stopped by {stopped}: the tables hold the entries that finished")
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
        self.write_tables(head)
        if not self.keep_logs:
            _pack(self.logs, self.out / "logs.tgz")
            shutil.rmtree(self.logs)
        if stopped:
            return 128 + getattr(signal, stopped)
        failed = [r for r in self.results if r["status"] != "ok" and not r["status"].startswith("skipped")]
        return 1 if failed else 0

    def halt(self, proc, rec: dict, why: str):
        """Stop an entry still running when the driver itself is stopped; keep what its output holds."""
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        for f in rec.pop("files", ()):
            f.close()
        rec["status"] = f"stopped ({why}) after {time.monotonic() - rec['t0']:.0f} s"
        try:
            self.collect(rec)
        except Exception as e:  # noqa: BLE001 - a half-written result is no reason to lose the others
            rec["status"] += f"; no result ({e})"

    def write_tables(self, head: str):
        for name, spec in self.suite.tables.items():
            results = [r for r in self.results if r["entry"].table == name]
            if not results:
                continue
            appended = [Path(S.expand(p, S.builtins(self.suite, str(self.out)))) for p in spec.get("append", [])]
            md = tables.render(name, spec, results, head, appended)
            (self.out / f"{name}.md").write_text(md)
            self.echo("\n" + md)


def _curves(metrics: Path) -> dict:
    """Every logged metric of a run by step: {"loss": [(step, value), ...], "eval/val_loss": [...]}."""
    curves: dict = {}
    if not metrics.exists():
        return curves
    for line in metrics.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        for k, val in r.items():
            if k != "step" and isinstance(val, (int, float)) and "step" in r:
                curves.setdefault(k, []).append((r["step"], val))
    return curves


def _pack(folder: Path, dest: Path):
    """A folder as one tarball without checkpoints (the device machine returns few files)."""
    def keep(info):
        return None if any(x in info.name for x in PACK_EXCLUDE) else info
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(folder, arcname=folder.name, filter=keep)


class Stopped(Exception):
    """The driver got SIGTERM or SIGINT."""


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
