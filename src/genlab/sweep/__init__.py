"""`genlab sweep`: vary one thing, keep the rest fixed, compare — one command, one table, a few plots.

    genlab sweep SWEEP.toml [--dry-run] [--retry-failed] [--root sweeps]
    genlab sweep report DIR [--compare DIR2]
"""
from __future__ import annotations

from pathlib import Path

from genlab.errors import GenlabError


def cmd_sweep(args):
    items = args.items
    if items[0] == "report":
        if len(items) != 2:
            raise GenlabError("usage: genlab sweep report DIR [--compare DIR2]")
        from genlab.sweep.report import compare, write_report
        d = Path(items[1])
        if not (d / "status.json").exists():
            raise GenlabError(f"'{d}' is not a sweep folder (no status.json)")
        if args.compare:
            if not (Path(args.compare) / "status.json").exists():
                raise GenlabError(f"'{args.compare}' is not a sweep folder (no status.json)")
            print(compare(d, args.compare))
            return 0
        print((write_report(d)).read_text())
        print(f"report: {d / 'report.html'}")
        return 0
    if len(items) != 1:
        raise GenlabError("usage: genlab sweep SWEEP.toml  (or: genlab sweep report DIR)")
    from genlab.sweep.runner import run_sweep
    from genlab.sweep.spec import load_sweep
    sw = load_sweep(items[0])  # validates every variant before anything runs
    if args.dry_run:
        print(f"sweep {sw.name}: preset {sw.preset}, launcher {sw.launcher}, {len(sw.variants)} runs")
        for v in sw.variants:
            print(f"  {v.run_name}: {' '.join(v.overrides)}" + (f"  (nproc {v.nproc})" if v.nproc > 1 else ""))
        return 0
    d = run_sweep(sw, root=args.root, retry_failed=args.retry_failed)
    print((d / "report.md").read_text())
    print(f"report: {d / 'report.html'}")
    failed = __import__("json").loads((d / "status.json").read_text())
    return 0 if all(v["status"] in ("finished", "skipped") for v in failed.values()) else 1


def add_parser(sub):
    p = sub.add_parser("sweep", help="run an ablation sweep (genlab sweep FILE.toml) or rebuild its report (genlab sweep report DIR)")
    p.add_argument("items", nargs="+", help="SWEEP.toml, or: report DIR")
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs without running them")
    p.add_argument("--retry-failed", action="store_true", help="run failed and skipped variants again")
    p.add_argument("--root", default="sweeps", help="parent folder of sweep folders")
    p.add_argument("--compare", default=None, help="with `report`: a second sweep folder to put side by side")
    p.set_defaults(fn=cmd_sweep)
    return p
