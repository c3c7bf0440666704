"""Config field metadata: every key declares a one-line description and its valid values next to its
default, so `validate`, `genlab config` and docs/config.md all read the same declaration.

    KEYS = declare("method", time_shift=F(1.0, "SD3 shift of training times", ge=0),
                   sampler=F("heun", "ODE/SDE sampler", registry="sampler"))

A component lists its declarations in its registry spec (`keys=KEYS`); which components read a key is
what decides whether setting it is valid (config_check.read_keys).

Exactly one kind of declaration is required besides the doc (a test checks every field):
numeric bounds (ge/gt/le/lt), `choices`, `registry` (a genlab registry name), `free` (what an open
string holds, e.g. "a file path"), or a bool type (true/false needs nothing more).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from genlab.core.errors import GenlabError, did_you_mean  # noqa: F401  (did_you_mean lives with the errors: the registry needs no config import)
from genlab.core.registry import all_registries


def F(default, doc: str, *, ge=None, gt=None, le=None, lt=None, choices=None, registry: str | None = None,
      free: str | None = None, type: type | None = None, lists: str | None = None):
    """A dataclass field with its description and valid values.

    registry: the value names an entry of that registry (its keys are then read too); lists: the value is a
    comma-separated list of that registry's entries; type: the key's type when the default does not say it.
    """
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": tuple(choices) if choices else None,
            "registry": registry, "free": free, "lists": lists,
            "type": type or _type_of(default)}
    if isinstance(default, list):  # a mutable default: every config gets its own copy
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _type_of(default):
    for t in (bool, int, float, str, list, tuple):
        if isinstance(default, t):
            return t
    raise TypeError(f"cannot infer the type of a config key from default {default!r}: pass F(..., type=...)")


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key as a component declares it: `section.name`, its type and its F(...) field."""
    section: str
    name: str
    field: dataclasses.Field

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def type(self):
        return self.field.metadata["type"]

    @property
    def default(self):
        f = self.field
        return f.default_factory() if f.default is dataclasses.MISSING else f.default


def declare(section: str, **fields) -> tuple[Key, ...]:
    """Config keys a component reads, next to its code: `KEYS = declare("method", time_shift=F(1.0, "...", ge=0))`.
    User-facing names stay `section.name`; the section classes are assembled from every declaration."""
    for name, f in fields.items():
        if not isinstance(f, dataclasses.Field) or "doc" not in (f.metadata or {}):
            raise TypeError(f"{section}.{name}: declare keys with F(default, doc, ...)")
        f.name = name
    return tuple(Key(section, name, f) for name, f in fields.items())


def meta_of(f: dataclasses.Field) -> dict:
    return dict(f.metadata) if f.metadata else {}


def declares_range(f: dataclasses.Field, typ) -> bool:
    m = meta_of(f)
    return typ is bool or any(m.get(k) is not None for k in ("ge", "gt", "le", "lt", "choices", "registry", "free"))


def _num(x) -> str:
    return repr(x) if isinstance(x, float) else str(x)


def describe_range(f: dataclasses.Field, typ, names: bool = True) -> str:
    """One line: the valid values of a field, as shown by `genlab config` and docs/config.md (names=False:
    registries without their entries, which depend on the optional packages installed)."""
    m = meta_of(f)
    if typ is bool:
        return "true | false"
    if m.get("choices"):
        return " | ".join(str(c) for c in m["choices"])
    if m.get("registry"):
        return f"registry `{m['registry']}`" + (_registry_names(m["registry"]) if names else " (`genlab list`)")
    parts = []
    lo = (">= " + _num(m["ge"])) if m.get("ge") is not None else ("> " + _num(m["gt"])) if m.get("gt") is not None else None
    hi = ("<= " + _num(m["le"])) if m.get("le") is not None else ("< " + _num(m["lt"])) if m.get("lt") is not None else None
    parts = [p for p in (lo, hi) if p]
    if parts:
        each = "each " if typ is tuple else ""
        return each + ", ".join(parts)
    return m.get("free") or ""


def _registry_names(kind: str) -> str:
    reg = all_registries().get(kind)
    return f": {', '.join(reg.names())}" if reg is not None else ""


def check_value(section: str, f: dataclasses.Field, typ, value: Any) -> None:
    """Raise a one-line GenlabError when value is outside the field's declared range or choices."""
    m, key = meta_of(f), f"{section}.{f.name}"
    if m.get("choices") and value not in m["choices"]:
        raise GenlabError(f"{key} must be one of {', '.join(map(str, m['choices']))}; got {value!r}" + did_you_mean(str(value), m["choices"]))
    if m.get("registry"):
        for v in (value if isinstance(value, list) else [value]):  # list fields name several entries
            all_registries()[m["registry"]].get(v)  # raises with the valid choices (and a suggestion)
    if m.get("lists") and isinstance(value, str):  # comma-separated entry names of one registry
        valid = all_registries()[m["lists"]].names()
        for n in filter(None, (s.strip() for s in value.split(","))):
            if n not in valid:
                raise GenlabError(f"unknown {key} entry '{n}'{did_you_mean(n, valid)}; valid choices: {', '.join(valid)}")
    for v in (value if isinstance(value, tuple) else (value,)):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if v != v or v in (float("inf"), float("-inf")):
            raise GenlabError(f"{key} must be a finite number, got {v}")
        for op, bound, ok in (("ge", ">=", lambda a, b: a >= b), ("gt", ">", lambda a, b: a > b),
                              ("le", "<=", lambda a, b: a <= b), ("lt", "<", lambda a, b: a < b)):
            b = m.get(op)
            if b is not None and not ok(v, b):
                raise GenlabError(f"{key} must be {bound} {_num(b)}, got {value!r}")

