"""Run a benchmark suite: `python benchmarks/run.py --suite NAME [--set KEY=VALUE ...] [--only a,b] [--out DIR]`.

A suite (`benchmarks/suites/NAME.toml`) declares the commands of one benchmark; this driver does the shared
setup, runs each entry in its own process and writes the markdown tables (`DIR/<table>.md`, each headed by the
date, commit, device and the command line) that docs/benchmarks.md quotes. `--list` shows the suites,
`--dry-run` the commands of one without running them. Run from anywhere: it works in the repository root.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite_driver import spec  # noqa: E402
from suite_driver.execute import Runner  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", help="a name under benchmarks/suites/ or a .toml path")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a suite parameter")
    p.add_argument("--only", help="comma list of entry names or stages")
    p.add_argument("--out", default="out", help="folder for tables, logs.tgz and collected files (default: out)")
    p.add_argument("--list", action="store_true", help="list the suites (with --suite: its entries and parameters)")
    p.add_argument("--dry-run", action="store_true", help="print each entry's command, run nothing")
    p.add_argument("--keep-logs", action="store_true", help="leave logs/ unpacked (default: logs.tgz)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    import os
    os.chdir(spec.REPO)
    if a.list and not a.suite:
        for name in spec.all_suites():
            print(f"{name:16s} {spec.load(name).description.splitlines()[0] if spec.load(name).description else ''}")
        return 0
    if not a.suite:
        print("run.py: --suite NAME is required (--list shows them)", file=sys.stderr)
        return 2
    try:
        sets = dict(s.split("=", 1) for s in a.set)
        suite = spec.load(a.suite, sets)
        entries = spec.select(suite.entries, a.only)
    except (spec.SuiteError, ValueError) as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2
    out = Path(a.out).resolve()
    argv_text = "python benchmarks/run.py " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    runner = Runner(suite, out, argv_text, keep_logs=a.keep_logs)
    if a.list or a.dry_run:
        print(suite.description)
        print("parameters: " + (", ".join(f"{k}={v!r}" for k, v in suite.params.items()) or "none"))
        for e in entries:
            argv_e, _ = runner.command(e, runner.values(e), dry=True) if a.dry_run else (None, None)
            where = f" -> {e.table}.md" if e.table else ""
            print(f"  {e.name} [{e.kind}{', stage ' + e.spec['stage'] if 'stage' in e.spec else ''}]{where}"
                  + (f"\n      {shlex.join(argv_e)}" if argv_e else ""))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    return runner.run(entries)


if __name__ == "__main__":
    sys.exit(main())
