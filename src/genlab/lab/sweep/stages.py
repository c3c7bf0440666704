"""What a sweep does besides its variants: [[stage]] entries that run first, in order, and an evaluation after
each run.

    eval = ["eval.nfe_list=1,2,4,8"]            # after each run finishes: `genlab eval RUN <these>` (a named
                                                # variant or a stage adds its own with eval = [...])
    reference = "teacher"                       # the run the report's ratios divide by (a stage or a variant;
                                                # a named variant or a run stage may name its own)

    [[stage]]                                   # a run, trained like a variant (one run, no seed suffix)
    name = "teacher"
    preset = "mnist_flow_fast"
    overrides = ["train.steps=3700"]

    [[stage]]                                   # a genlab command; {out} is its own output folder
    name = "pairs"
    command = "data generate pairs {stage:teacher} --out {out} --n 60000"

A stage's output is `{stage:NAME}` in later stages, variants' overrides and eval overrides: a run stage's run folder
(sweeps/<sweep>/runs/NAME), a command stage's {out} (sweeps/<sweep>/stages/NAME). A placeholder that names no
earlier stage is an error before anything runs; a variant whose stage failed is not run (failed: stage X failed).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from genlab.core.errors import GenlabError

STAGE_KEYS = {"name", "preset", "overrides", "command", "eval", "reference"}
PLACEHOLDER = re.compile(r"\{([A-Za-z_]+)(?::([^{}]*))?\}")


@dataclass
class Stage:
    name: str
    command: list = field(default_factory=list)  # genlab arguments of a command stage (empty: a run stage)
    preset: str | None = None
    overrides: list = field(default_factory=list)
    eval: list = field(default_factory=list)
    reference: str | None = None  # a run stage's ratios divide by this run (default: itself)

    @property
    def is_run(self) -> bool:
        return not self.command


def stage_output(d: Path, stage: Stage) -> Path:
    return d / ("runs" if stage.is_run else "stages") / stage.name


def references(text: str) -> list[str]:
    """The stage names a string refers to."""
    return [m.group(2) for m in PLACEHOLDER.finditer(text) if m.group(1) == "stage"]


def check_placeholders(texts, known: list[str], where: str, src: str, out_ok: bool = False) -> set:
    """Every placeholder is {stage:NAME} of an earlier stage (or {out} in a command stage); returns the names."""
    used = set()
    for text in texts:
        for m in PLACEHOLDER.finditer(str(text)):
            kind, arg = m.group(1), m.group(2)
            if kind == "out" and arg is None and out_ok:
                continue
            if kind != "stage" or arg is None:
                valid = "{stage:NAME}" + (", {out}" if out_ok else "")
                raise GenlabError(f"{src}: {where}: unknown placeholder {m.group(0)} in {text!r}; valid: {valid}")
            if arg not in known:
                raise GenlabError(f"{src}: {where}: {m.group(0)} names no earlier stage; "
                                  f"stages before it: {', '.join(known) or 'none'}")
            used.add(arg)
    return used


def resolve(text: str, d: Path, stages: dict, out: Path | None = None) -> str:
    """The placeholders of `text` replaced by the stage outputs under the sweep folder d."""
    def sub(m):
        if m.group(1) == "out":
            return str(out)
        return str(stage_output(d, stages[m.group(2)]))
    return PLACEHOLDER.sub(sub, text)


def parse_stages(raw, src: str) -> list[Stage]:
    if not isinstance(raw, list):
        raise GenlabError(f"{src}: stages are [[stage]] tables")
    stages, names = [], []
    for i, st in enumerate(raw):
        if not isinstance(st, dict) or not isinstance(st.get("name"), str) or set(st) - STAGE_KEYS:
            raise GenlabError(f"{src}: stage {i} is {{ name, preset + overrides | command, eval }}, got {st!r}")
        name = st["name"]
        if name in names or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
            raise GenlabError(f"{src}: stage name {name!r} is taken or not a folder name (letters, digits, . _ + -)")
        if ("command" in st) == ("preset" in st) or ("command" in st and ("overrides" in st or "eval" in st)):
            raise GenlabError(f"{src}: stage '{name}' has either command = \"...\" or preset (+ overrides, eval)")
        for key in ("overrides", "eval"):
            if not isinstance(st.get(key, []), list):
                raise GenlabError(f"{src}: stage '{name}': {key} must be a list of 'key=value' strings")
        if "command" in st:
            if not isinstance(st["command"], str) or not st["command"].strip():
                raise GenlabError(f"{src}: stage '{name}': command must be a genlab command line, e.g. \"data generate ...\"")
            args = shlex.split(st["command"])
            args = args[1:] if args[0] == "genlab" else args
            check_placeholders(args, names, f"stage '{name}'", src, out_ok=True)
            stages.append(Stage(name, command=args))
        else:
            ovs, ev = [str(x) for x in st.get("overrides", [])], [str(x) for x in st.get("eval", [])]
            check_placeholders(ovs + ev, names, f"stage '{name}'", src)
            stages.append(Stage(name, preset=st["preset"], overrides=ovs, eval=ev, reference=st.get("reference", name)))
        names.append(name)
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
