"""`genlab sweep SWEEP.toml|NAME [key=value ...]` runs an ablation sweep; `genlab sweep report DIR [--compare DIR2]` rebuilds
its report. The sweep itself (spec, expand, sizes, runner, report) is the genlab.lab.sweep package, imported when the
command runs."""
from __future__ import annotations

import json
import signal
from pathlib import Path

from genlab.core.errors import GenlabError

ORDER = 7


def cmd_report(items, args):
    if len(items) != 2:
        raise GenlabError("usage: genlab sweep report DIR [--compare DIR2]")
    from genlab.lab.sweep.report import compare, write_report
    d = Path(items[1])
    for x in [d] + ([Path(args.compare)] if args.compare else []):
        if not (x / "status.json").is_file():
            raise GenlabError(f"'{x}' is not a sweep folder (no status.json)")
    if args.compare:
        print(compare(d, args.compare))
        return 0
    print(write_report(d, partial=args.partial).read_text())
    print(f"report: {d / 'report.html'}")
    return 0


def cmd_sweep(args):
    items = args.items
    # `report` is a sub-command unless a sweep file of that name exists
    if items[0] == "report" and not Path(items[0]).is_file():
        return cmd_report(items, args)
    if args.compare:
        raise GenlabError("--compare goes with `genlab sweep report DIR --compare DIR2`")
    if args.partial:
        raise GenlabError("--partial goes with `genlab sweep report DIR --partial`")
    if any("=" not in x for x in items[1:]):
        raise GenlabError("usage: genlab sweep SWEEP.toml|NAME [key=value ...]  (or: genlab sweep report DIR)")
    from genlab.lab.sweep.runner import run_sweep
    from genlab.lab.sweep.spec import load_sweep, select
    sw = select(load_sweep(items[0], items[1:]), args.only)  # validates every variant before anything runs
    gpus = _check(sw, args)  # --dry-run makes every check the run makes
    if args.dry_run:
        _print_plan(sw)
        return 0
    term = signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stop from outside still writes the report
    try:
        d = run_sweep(sw, root=args.root, retry_failed=args.retry_failed,
                      max_time=sw.max_time if args.max_time is None else args.max_time,
                      jobs_per_gpu=args.jobs_per_gpu, gpus=gpus)
    except KeyboardInterrupt:
        print("genlab: sweep interrupted; runs in flight saved a checkpoint. Re-run the same command to resume.")
        return 130
    finally:
        signal.signal(signal.SIGTERM, term)
    print((d / "report.md").read_text())
    print(f"report: {d / 'report.html'}")
    status = json.loads((d / "status.json").read_text())
    mine = [status[n]["status"] for n in [s.name for s in sw.stages] + [v.run_name for v in sw.variants] if n in status]
    return 0 if all(s in ("finished", "skipped") for s in mine) else 1


def _check(sw, args) -> list[int] | None:
    """The options, the machine and every run's files, before anything runs; the GPUs chosen with --gpus."""
    from genlab.lab.sweep.runner import check_runs, choose_gpus, visible_gpus
    if args.max_time is not None and args.max_time < 0:
        raise GenlabError(f"--max-time must be >= 0 seconds, got {args.max_time}")
    if args.timeout is not None:
        if args.timeout <= 0:
            raise GenlabError(f"--timeout must be > 0 seconds, got {args.timeout}")
        sw.timeout = args.timeout
    if args.jobs_per_gpu < 1:
        raise GenlabError(f"--jobs-per-gpu must be >= 1, got {args.jobs_per_gpu}")
    if args.jobs_per_gpu > 1 and sw.launcher not in ("gpu", "per_gpu"):
        raise GenlabError(f"--jobs-per-gpu needs launcher gpu or per_gpu; sweep '{sw.name}' has launcher \"{sw.launcher}\"")
    check_runs(sw, args.root)
    return None if args.gpus is None else choose_gpus(args.gpus, sw.launcher, visible_gpus())


def _print_plan(sw):
    print(f"sweep {sw.name}: preset {sw.preset}, launcher {sw.launcher}, {len(sw.stages) + len(sw.variants)} runs"
          + (f"; command-line overrides: {' '.join(sw.cli)}" if sw.cli else ""))
    for st in sw.stages:
        print(f"  stage {st.name}: " + (" ".join(st.command) if st.command else f"{st.preset} {' '.join(st.overrides)}")
              + (f"; then genlab eval {' '.join(st.eval)}" if st.eval else "") + (f"  -> table {st.table}" if st.table else ""))
    for v in sw.variants:
        print(f"  {v.run_name}: " + (f"{v.preset} " if v.preset else "") + " ".join(v.overrides)
              + (f"  (nproc {v.nproc})" if v.nproc > 1 else "") + (f"; then genlab eval {' '.join(v.eval)}" if v.eval else ""))


def add_parser(sub):
    p = sub.add_parser("sweep", help="run an ablation sweep (genlab sweep FILE.toml or a shipped sweep's NAME) or rebuild its report (genlab sweep report DIR)")
    p.add_argument("items", nargs="+", metavar="SWEEP.toml | NAME [key=value ...] | report DIR",
                   help="a sweep file or the name of a shipped sweep (genlab list), then overrides for every run: "
                        "sweep keys (steps=20, launcher=cpu, seeds=0,1, nproc, timeout), the file's [params] (STEPS=5) "
                        "or config keys (model.dim=64); or: report DIR")
    p.add_argument("--dry-run", action="store_true",
                   help="make every check the run would make (devices, data folders), list the runs, run nothing")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only these variants (variant or run names) and stages (names or parts), and the stages "
                        "they need; comma-separated or repeated")
    p.add_argument("--retry-failed", action="store_true", help="run failed and skipped variants again")
    p.add_argument("--max-time", type=float, default=None, metavar="S",
                   help="start no run or stage after S seconds (default: the file's max_time); the rest are left for "
                        "the next call")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="per-run time limit (overrides the file's timeout)")
    p.add_argument("--jobs-per-gpu", type=int, default=1, metavar="N",
                   help="run N single-process runs on each GPU at once (small models; step times are then shared-GPU times)")
    p.add_argument("--gpus", default=None, metavar="N|I,J,...",
                   help="use the first N visible GPUs, or these (e.g. 0,2,3; one as 2,); default: all visible")
    p.add_argument("--root", default="sweeps", help="parent folder of sweep folders (default: sweeps)")
    p.add_argument("--compare", default=None, metavar="DIR2", help="with `report`: a second sweep folder to put side by side")
    p.add_argument("--partial", action="store_true",
                   help="with `report`: count unfinished runs (timeouts, stops) with what they logged, marked partial")
    p.set_defaults(fn=cmd_sweep)
