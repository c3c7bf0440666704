"""A sweep's [[stage]] entries (runs and commands that run first, in order), its [params] and placeholders
(`{stage:NAME}`, `{NAME}`, `{NAME?TEXT}`, `{NAME=VALUE?TEXT}`); the format is docs/sweeps.md.
"""
from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from genlab.config.fields import did_you_mean
from genlab.core.errors import GenlabError

STAGE_KEYS = {"name", "preset", "overrides", "command", "eval", "reference", "nproc", "timeout", "table", "matrix",
              "when", "creates", "group", "env", "part", "optional"}
PLACEHOLDER = re.compile(r"\{([A-Za-z_]+)(?::([^{}]*))?\}")   # {stage:NAME}, {out}, {left}: filled when it runs
VALUE = re.compile(r"\{(\w+)(?:=([\w.-]*))?(?:\?([^{}]*))?\}")  # {NAME}, {NAME?TEXT}, {NAME=V?TEXT}: when read
RESERVED = ("stage", "out", "left")
NAME = re.compile(r"[A-Za-z0-9_.,=+-]+")


@dataclass
class Stage:
    name: str
    command: list = field(default_factory=list)  # a command stage's words: genlab|python|bash ... (empty: a run)
    preset: str | None = None
    overrides: list = field(default_factory=list)
    eval: list = field(default_factory=list)
    reference: str | None = None  # a run stage's ratios divide by this run (default: itself)
    nproc: int = 1
    timeout: float | None = None
    table: str | None = None
    creates: str | None = None
    group: str = ""
    env: dict = field(default_factory=dict)
    part: str | None = None
    optional: bool = False
    template: str = ""            # the name as written, placeholders and all (--only matches it)

    @property
    def is_run(self) -> bool:
        return not self.command


def truthy(text) -> bool:
    return str(text).strip() not in ("", "0", "false", "False")


def expand(text: str, values: dict) -> str:
    """The {NAME} forms of `values` filled in, inner ones first; other placeholders are left for later."""
    def one(m):
        name, equals, then = m.groups()
        if name not in values:
            return m.group(0)
        if equals is not None:
            return (then or "") if str(values[name]) == equals else ""
        return (then if truthy(values[name]) else "") if then is not None else str(values[name])
    while True:
        new = VALUE.sub(one, text)
        if new == text:
            return text
        text = new


def expand_all(node, values: dict):
    """`expand` over every string of a TOML tree; a list item that is one placeholder becomes the words of its
    value (none when it is empty), so that a parameter can hold several overrides."""
    if isinstance(node, str):
        return expand(node, values)
    if isinstance(node, list):
        out = []
        for x in node:
            whole = isinstance(x, str) and x.startswith("{") and x.endswith("}") and ":" not in x
            out += expand(x, values).split() if whole else [expand_all(x, values)]
        return out
    if isinstance(node, dict):
        return {k: expand_all(v, values) for k, v in node.items()}
    return node


def stage_output(d: Path, stage: Stage) -> Path:
    return d / ("runs" if stage.is_run else "stages") / stage.name


def references(text: str) -> list[str]:
    """The stage names a string refers to."""
    return [m.group(2) for m in PLACEHOLDER.finditer(text) if m.group(1) == "stage"]


def check_placeholders(texts, known: list[str], where: str, src: str, out_ok: bool = False) -> None:
    """Every placeholder is {stage:NAME} of an earlier stage (or {out}, {left} in a command)."""
    valid = "{stage:NAME}" + (", {out}, {left}" if out_ok else "") + ", or a name of the file's [params]"
    for text in map(str, texts):
        bad = [m.group(0) for m in VALUE.finditer(text) if not (out_ok and m.group(0) in ("{out}", "{left}"))]
        bad += [m.group(0) for m in PLACEHOLDER.finditer(text) if m.group(2) is not None and m.group(1) != "stage"]
        if bad:
            raise GenlabError(f"{src}: {where}: unknown placeholder {bad[0]} in {text!r}; valid: {valid}")
        for arg in references(text):
            if arg not in known:
                raise GenlabError(f"{src}: {where}: {{stage:{arg}}} names no earlier stage; "
                                  f"stages before it: {', '.join(known) or 'none'}")


def resolve(text: str, d: Path, stages: dict, out: Path | None = None, left: float | None = None) -> str:
    """The placeholders of `text` replaced by the stage outputs under the sweep folder d."""
    def sub(m):
        if m.group(1) == "out":
            return str(out)
        if m.group(1) == "left":
            return "inf" if left is None else str(max(0, int(left)))
        return str(stage_output(d, stages[m.group(2)]))
    return PLACEHOLDER.sub(sub, text)


def _matrix(st: dict, params: dict, where: str) -> list[dict]:
    """The stage's matrix as one {axis: value} per stage ([{}] without one); a string axis is a ";" list."""
    axes = st.get("matrix", {})
    if not isinstance(axes, dict):
        raise GenlabError(f"{where}: matrix = {{ axis = [values] or \"a;b\" }}, got {axes!r}")
    lists = {k: [x.strip() for x in expand(v, params).split(";") if x.strip()] if isinstance(v, str)
             else [str(x) for x in v] for k, v in axes.items()}
    return [dict(zip(lists, c)) for c in itertools.product(*lists.values())]


def _number(st: dict, key: str, where: str, kind=float):
    try:
        v = kind(st[key]) if key in st else None
    except (TypeError, ValueError):
        v = 0
    if v is not None and v <= 0:
        raise GenlabError(f"{where}: {key} must be a positive number, got {st[key]!r}")
    return v


def _one(st: dict, raw_name: str, names: list[str], src: str) -> Stage:
    name = st["name"]
    if name in names or not NAME.fullmatch(name):
        raise GenlabError(f"{src}: stage name {name!r} is taken or not a folder name (letters, digits, . , = _ + -)")
    if ("command" in st) == ("preset" in st) or ("command" in st and ("overrides" in st or "eval" in st)):
        raise GenlabError(f"{src}: stage '{name}' has either command = \"...\" or preset (+ overrides, eval)")
    for key in ("overrides", "eval"):
        if not isinstance(st.get(key, []), list):
            raise GenlabError(f"{src}: stage '{name}': {key} must be a list of 'key=value' strings")
    if not isinstance(st.get("env", {}), dict):
        raise GenlabError(f"{src}: stage '{name}': env must be a table of NAME = \"value\"")
    where = f"{src}: stage '{name}'"
    common = dict(nproc=_number(st, "nproc", where, int) or 1, timeout=_number(st, "timeout", where),
                  table=st.get("table"), creates=st.get("creates"), group=str(st.get("group", "")),
                  env={k: str(v) for k, v in st.get("env", {}).items()}, part=st.get("part"),
                  optional=bool(st.get("optional", False)), template=raw_name)
    if "command" in st:
        if not isinstance(st["command"], str) or not st["command"].strip():
            raise GenlabError(f"{where}: command must be a command line, e.g. \"data generate ...\"")
        args = shlex.split(st["command"])
        args = args if args[0] in ("genlab", "python", "bash") else ["genlab", *args]
        check_placeholders(args, names, f"stage '{name}'", src, out_ok=True)
        return Stage(name, command=args, **common)
    ovs, ev = [str(x) for x in st.get("overrides", [])], [str(x) for x in st.get("eval", [])]
    check_placeholders(ovs + ev, names, f"stage '{name}'", src)
    return Stage(name, preset=st["preset"], overrides=ovs, eval=ev, reference=st.get("reference", name), **common)


def parse_stages(raw, src: str, tables, params: dict) -> list[Stage]:
    """[[stage]] tables -> stages in order, a matrix stage as one stage per value; those whose `when` is unset go."""
    if not isinstance(raw, list):
        raise GenlabError(f"{src}: stages are [[stage]] tables")
    stages, names = [], []
    for i, st in enumerate(raw):
        if not isinstance(st, dict) or not isinstance(st.get("name"), str):
            raise GenlabError(f"{src}: stage {i} is a [[stage]] table with a name, got {st!r}")
        unknown = sorted(set(st) - STAGE_KEYS)
        if unknown:
            raise GenlabError(f"{src}: stage '{st['name']}': unknown key(s) {', '.join(unknown)}; valid: "
                              f"{', '.join(sorted(STAGE_KEYS))}{did_you_mean(unknown[0], STAGE_KEYS)}")
        if st.get("table") is not None and st["table"] not in tables:
            raise GenlabError(f"{src}: stage '{st['name']}': table {st['table']!r} is not one of the file's [tables] "
                              f"({', '.join(tables) or 'none'})")
        for combo in _matrix(st, params, f"{src}: stage '{st['name']}'"):
            one = expand_all({k: v for k, v in st.items() if k != "matrix"}, {**params, **combo})
            one["name"] = re.sub(r"[^\w.,=+-]", "_", one["name"])  # a matrix value with spaces names a folder too
            if truthy(one.pop("when", "1")):
                stages.append(_one(one, st["name"], names, src))
                names.append(stages[-1].name)
    return stages


def needs(stages: list[Stage], texts) -> set:
    """The stages a list of strings depends on, directly or through the stages they name."""
    by = {s.name: s for s in stages}
    todo = {n for t in texts for n in references(str(t))}
    out = set()
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            s = by[n]
            todo |= {m for t in s.command + s.overrides + s.eval for m in references(t)}
    return out
