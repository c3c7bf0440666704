"""A suite file: the commands of one benchmark, declared; read, checked and expanded into runnable entries.

A suite is TOML (`benchmarks/suites/<name>.toml`):

    description = "what it measures, on which machine, how long"
    budget_s = 540                  # no entry starts after this many seconds (a number or "{PARAM}")
    wheels = ["torchao"]            # modules installed from $WHEELS (default wheels/) when missing
    env = { NCCL_NVLS_ENABLE = "0" }

    [params]                        # defaults; `--set NAME=VALUE` or the environment variable NAME overrides
    STEPS = "20"

    [tables.dit_b2]                 # one markdown file, <out>/dit_b2.md
    title = "DiT-B/2 bs256"
    columns = "bench"               # "bench", a list of columns (see tables.py), or absent: the entries' text

    [[entry]]
    name = "b2_eager"
    kind = "bench"                  # see KINDS
    args = ["bench_dit_b2", "train.compile=off", "--steps", "{STEPS}"]
    table = "dit_b2"
    timeout = 90

Placeholders: `{NAME}` is a parameter, an entry's `vars` or matrix value, or a built-in (`out`, `logs`, `runs`,
`root`, `left`: seconds of budget left, `suite`, `name`); `{NAME?TEXT}` is TEXT when NAME is set (not empty, not
"0") and empty otherwise; `{NAME=VALUE?TEXT}` is TEXT when NAME equals VALUE. An argument that is one placeholder
(it starts with "{" and ends with "}") becomes the words of its value (none when empty);
an argument that expands to nothing is dropped. A matrix axis is a list, or a string that expands to a
";"-separated list. The other entry fields are listed in ENTRY_KEYS and read by execute.py: `stage` and
`optional` (run only when `--only` names it) for selection; `when`, `creates`, `needs`, `unless_finished`,
`min_left` decide whether it runs; `group`, `env`, `nproc`, `stop_signal`, `fill_steps`, `collect`, `result`,
`run` and `vars` shape how.
"""
from __future__ import annotations

import itertools
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

SUITES = Path(__file__).resolve().parent.parent / "suites"
REPO = SUITES.parent.parent

# kind -> what the driver runs (execute.command_for builds the argv)
KINDS = {
    "bench": "python -m genlab bench ARGS --json <logs>/<name>.json; the row is that JSON",
    "train": "python -m genlab train ARGS train.out_dir=<runs> train.name=<run>; the row is the run's summary.json",
    "eval": "python -m genlab eval ARGS; the row is the JSON it prints",
    "genlab": "python -m genlab ARGS (data preparation, sampling, sweeps report ...); its text",
    "sweep": "python -m genlab sweep ARGS; copies the sweep's report.md and packs its folder (no checkpoints)",
    "python": "python ARGS (a script under benchmarks/, or -m pytest ...); its text, or its last JSON line (result=json)",
    "shell": "bash -c SHELL, for the few steps that need a pipe or a tool found at run time",
}
SUITE_KEYS = {"description", "budget_s", "wheels", "env", "params", "tables", "entry"}
TABLE_KEYS = {"title", "columns", "keep", "tail", "format", "append"}
ENTRY_KEYS = {"name", "kind", "args", "shell", "table", "timeout", "repeats", "stage", "group", "env", "nproc",
              "matrix", "when", "creates", "needs", "unless_finished", "fill_steps", "vars", "run", "result",
              "collect", "stop_signal", "min_left", "optional"}
FILL_KEYS = {"json", "key", "unit", "seconds", "startup_s", "factor", "multiple", "min", "default"}
PLACEHOLDER = re.compile(r"\{(\w+)(?:=([\w.-]*))?(?:\?([^{}]*))?\}")
DEFAULT_TIMEOUT = 600


class SuiteError(ValueError):
    """A suite file that cannot run, said in one line."""


@dataclass
class Entry:
    name: str
    kind: str
    args: list[str]
    table: str | None
    timeout: int
    spec: dict                       # the raw entry, placeholders not yet expanded (fields read when it runs)
    values: dict = field(default_factory=dict)   # vars and matrix values of this entry
    repeat: int = 0
    group: str = ""                  # entries next to each other with one (non-empty) group run at once


@dataclass
class Suite:
    name: str
    path: Path
    raw: dict
    params: dict
    tables: dict
    entries: list[Entry]

    @property
    def description(self) -> str:
        return self.raw.get("description", "")


def suite_path(name: str) -> Path:
    p = Path(name)
    return p if p.suffix == ".toml" and p.exists() else SUITES / f"{name}.toml"


def all_suites() -> list[str]:
    return sorted(p.stem for p in SUITES.glob("*.toml"))


def truthy(value) -> bool:
    return str(value).strip() not in ("", "0", "false", "False")


def expand(text: str, values: dict) -> str:
    """Replace placeholders until none is left (inner ones first); an unknown name is an error."""
    def one(m):
        name, equals, text_if = m.group(1), m.group(2), m.group(3)
        if name not in values:
            raise SuiteError(f"unknown placeholder {{{name}}} (known: {', '.join(sorted(values))})")
        if equals is not None:
            return (text_if or "") if str(values[name]) == equals else ""
        if text_if is not None:
            return text_if if truthy(values[name]) else ""
        return str(values[name])
    for _ in range(10):
        new = PLACEHOLDER.sub(one, text)
        if new == text:
            return new
        text = new
    return text


def expand_args(args: list, values: dict) -> list[str]:
    out = []
    for a in args:
        a = str(a)
        if a.startswith("{") and a.endswith("}"):     # an argument that is one placeholder: its words
            out += expand(a, values).split()
            continue
        s = expand(a, values)
        if s:
            out.append(s)
    return out


def load(name: str, overrides: dict | None = None, environ: dict | None = None) -> Suite:
    """Read and check a suite; parameters come from its [params], then the environment, then `overrides`."""
    path = suite_path(name)
    if not path.exists():
        raise SuiteError(f"no suite {name!r} (suites: {', '.join(all_suites())})")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SuiteError(f"{path.name}: {e}") from None
    _check_keys(raw, SUITE_KEYS, path.name)
    environ = os.environ if environ is None else environ
    params = {k: str(v) for k, v in raw.get("params", {}).items()}
    for k in params:
        if k in environ:
            params[k] = environ[k]
    for k, v in (overrides or {}).items():
        if k not in params:
            raise SuiteError(f"{path.name}: --set {k}: not a parameter of this suite (parameters: {', '.join(params) or 'none'})")
        params[k] = v
    tables = raw.get("tables", {})
    for t, spec in tables.items():
        _check_keys(spec, TABLE_KEYS, f"{path.name} [tables.{t}]")
    suite = Suite(path.stem, path, raw, params, tables, [])
    suite.entries = _entries(suite)
    return suite


def builtins(suite: Suite, out: str = "out", left: float = 0) -> dict:
    values = {"suite": suite.name, "out": out, "logs": f"{out}/logs", "left": str(max(0, int(left))),
              "runs": f"/tmp/genlab-bench-runs/{suite.name}", "root": "/tmp/genlab-sweeps"}
    values.update(suite.params)          # a suite may set RUNS-like names of its own; runs/root stay built-in
    values["runs"] = suite.params.get("RUNS", values["runs"])
    values["root"] = suite.params.get("SWEEP_ROOT", values["root"])
    return values


def _check_keys(spec: dict, allowed: set, where: str):
    unknown = set(spec) - allowed
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(allowed))})")


def _entries(suite: Suite) -> list[Entry]:
    entries, seen = [], set()
    base = builtins(suite)
    for i, spec in enumerate(suite.raw.get("entry", [])):
        where = f"{suite.path.name} entry {i + 1} ({spec.get('name', '?')})"
        _check_keys(spec, ENTRY_KEYS, where)
        for req in ("name", "kind"):
            if req not in spec:
                raise SuiteError(f"{where}: needs {req!r}")
        if spec["kind"] not in KINDS:
            raise SuiteError(f"{where}: kind {spec['kind']!r} is not one of {', '.join(KINDS)}")
        if (spec["kind"] == "shell") != ("shell" in spec):
            raise SuiteError(f"{where}: a shell entry has `shell` (and no args); other kinds have no `shell`")
        if spec.get("table") is not None and spec["table"] not in suite.tables:
            raise SuiteError(f"{where}: table {spec['table']!r} is not declared under [tables]")
        if "fill_steps" in spec:
            _check_keys(spec["fill_steps"], FILL_KEYS, f"{where} fill_steps")
        axes = {}
        for axis, vals in spec.get("matrix", {}).items():
            if isinstance(vals, str):
                vals = [v.strip() for v in expand(vals, base).split(";") if v.strip()]
            axes[axis] = [str(v) for v in vals]
        combos = [dict(zip(axes, c)) for c in itertools.product(*axes.values())] if axes else [{}]
        for combo in combos:
            values = {**base, **{k: str(v) for k, v in spec.get("vars", {}).items()}, **combo}
            try:
                name = re.sub(r"[^\w.,=+-]", "_", expand(spec["name"], values))   # names become log file names
                values["name"] = name
                args = expand_args(spec.get("args", []), values)
            except SuiteError as e:
                raise SuiteError(f"{where}: {e}") from None
            repeats = int(spec.get("repeats", 1))
            for r in range(repeats):
                full = name if repeats == 1 else f"{name}#{r + 1}"
                if full in seen:
                    raise SuiteError(f"{where}: two entries are named {full!r}")
                seen.add(full)
                try:
                    timeout = int(float(expand(str(spec.get("timeout", DEFAULT_TIMEOUT)), values)))
                    group = expand(str(spec.get("group", "")), values)
                except (SuiteError, ValueError) as e:
                    raise SuiteError(f"{where}: timeout/group: {e}") from None
                entries.append(Entry(full, spec["kind"], args, spec.get("table"), timeout, spec,
                                     {**{k: str(v) for k, v in spec.get("vars", {}).items()}, **combo, "name": name}, r, group))
    return entries


def select(entries: list[Entry], only: str | None) -> list[Entry]:
    """`--only a,b`: entries whose name, name without its matrix part, stage, or name template (with or without its
    placeholders: `upsample` picks every entry of `upsample{split}`) is listed; without it every entry but the
    `optional` ones."""
    if not only:
        return [e for e in entries if not e.spec.get("optional")]
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    picked = [e for e in entries if e.name in wanted or e.name.split("#")[0] in wanted or e.spec.get("stage") in wanted
              or e.spec["name"] in wanted or re.sub(r"\{[^}]*\}", "", e.spec["name"]) in wanted]
    if not picked:
        raise SuiteError(f"--only {only}: matches no entry (entries: {', '.join(e.name for e in entries)})")
    return picked


def problems(suite: Suite) -> list[str]:
    """What would stop an entry from running, found without running it: a missing script, preset or sweep file."""
    configs = REPO / "src" / "genlab" / "configs"
    found = []
    for e in suite.entries:
        first = e.args[0] if e.args else ""
        if e.kind == "python" and first.endswith(".py") and not (REPO / first).exists():
            found.append(f"{e.name}: no script {first}")
        if e.kind in ("bench", "train") and first and not first.startswith(("-", "/")) and "=" not in first \
                and not first.endswith(".toml") and not (configs / f"{first}.toml").exists():
            found.append(f"{e.name}: no preset {first!r} in src/genlab/configs")
        if e.kind == "sweep" and not (configs / "sweeps" / f"{first}.toml").exists() and not first.endswith(".toml"):
            found.append(f"{e.name}: no sweep file {first!r} in src/genlab/configs/sweeps")
    return found
