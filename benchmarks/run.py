"""Run a benchmark suite (benchmarks/suites/NAME.toml, a sweep file of stages) with the sweep engine: `genlab sweep FILE
KEY=VALUE ... [--only ...] [any genlab sweep option]` in the repository root, after installing the wheels in $WHEELS
(default wheels/; a device machine has no package index). benchmarks/README.md says more.

    python benchmarks/run.py --list                           # the suites, one line each
    python benchmarks/run.py --suite perf --dry-run           # its stages and their commands (checks need its GPUs)
    python benchmarks/run.py --suite perf --out out           # run it; out/perf.md (the report), out/perf.tgz
    python benchmarks/run.py --suite sparse --only quality --set STEPS=500 --set ARGS="model.heads=8"
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
SUITES = REPO / "benchmarks" / "suites"


def suite_path(name: str) -> Path:
    return Path(name).resolve() if name.endswith(".toml") else SUITES / f"{name}.toml"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", help="a name under benchmarks/suites/ or a .toml path")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a parameter of the suite")
    p.add_argument("--only", help="comma list of stage names or parts")
    p.add_argument("--out", help="copy the report and the packed sweep folder here")
    p.add_argument("--list", action="store_true", help="list the suites")
    return p.parse_known_args(argv)


def main(argv=None) -> int:
    a, rest = parse(argv)
    if a.list or not a.suite:
        for p in sorted(SUITES.glob("*.toml")):
            print(f"{p.stem:16s} {tomllib.loads(p.read_text()).get('description', '').splitlines()[0]}")
        return 0 if a.list else 2
    wheels = sorted(Path(os.environ.get("WHEELS", REPO / "wheels")).glob("*.whl"))
    if wheels:  # quick when they are there already
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels)])
    cmd = [sys.executable, "-m", "genlab", "sweep", str(suite_path(a.suite)), *a.set, *(["--only", a.only] if a.only else []), *rest]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
    root = REPO / (rest[rest.index("--root") + 1] if "--root" in rest else "sweeps")
    folder = root / tomllib.loads(suite_path(a.suite).read_text()).get("name", suite_path(a.suite).stem)
    if a.out and (folder / "report.md").exists():
        Path(a.out).mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / "report.md", Path(a.out) / f"{folder.name}.md")
        with tarfile.open(Path(a.out) / f"{folder.name}.tgz", "w:gz") as tar:
            tar.add(folder, arcname=folder.name, filter=lambda i: None if "checkpoints" in i.name else i)
    return rc


if __name__ == "__main__":
    sys.exit(main())
