"""Config field metadata: every key declares a one-line description and its valid values next to its default
(`F(1.0, "SD3 shift of training times", ge=0)` in a Keys class; docs/architecture.md: Config), so validation,
`genlab config` and docs/config.md read the same declaration. Besides the doc a key declares one of: numeric bounds
(ge/gt/le/lt), `choices`, `registry` (a registry name), `free` (what an open string holds) or a bool type.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, ClassVar, TypeVar, dataclass_transform, get_origin, get_type_hints

from genlab.core.errors import GenlabError, did_you_mean  # noqa: F401  (did_you_mean lives with the errors: the registry needs no config import)
from genlab.core.registry import all_registries


def F(default, doc: str, *, ge=None, gt=None, le=None, lt=None, choices=None, registry: str | None = None,
      free: str | None = None, type: type | None = None, lists: str | None = None):
    """A dataclass field with its description and valid values. registry: the value names an entry of that registry
    (its keys are then read too); lists: a comma-separated list of its entries; type: when the default does not say."""
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


K = TypeVar("K", bound="Keys")


@dataclass_transform(field_specifiers=(F,))
class Keys:
    """A dataclass of config keys (`class ShortcutKeys(Keys, section="method")`), owned by the component that reads
    them. A config section's class is composed from every Keys class of that section (config/keys.py), so `of(cfg)`
    is the section object itself, typed as this class. Subclasses are dataclasses (no decorator needed)."""
    section: ClassVar[str]

    def __init_subclass__(cls, section: str | None = None, **kw):
        super().__init_subclass__(**kw)
        if section is not None:
            cls.section = section
        if not hasattr(cls, "section"):
            raise TypeError(f"{cls.__name__}: name the config section: class {cls.__name__}(Keys, section=\"method\")")
        for name, ann in cls.__dict__.get("__annotations__", {}).items():
            f = cls.__dict__.get(name)
            if not str(ann).startswith(("ClassVar", "typing.ClassVar")) and not (isinstance(f, dataclasses.Field) and "doc" in f.metadata):
                raise TypeError(f"{cls.section}.{name}: declare keys with F(default, doc, ...)")
        dataclasses.dataclass(cls)

    @classmethod
    def declared(cls) -> tuple[Key, ...]:
        """The keys this class itself defines (inherited ones belong to the base that defines them), each its
        type-checked Key (the annotation must agree with the type the default or F(type=...) says)."""
        if "_declared" not in cls.__dict__:
            hints = get_type_hints(cls)
            own = cls.__dict__.get("__annotations__", {})
            keys = tuple(Key(cls.section, f.name, f) for f in dataclasses.fields(cls) if f.name in own)
            for k in keys:
                hint = get_origin(hints[k.name]) or hints[k.name]
                if hint is not k.type:
                    raise TypeError(f"{k.dotted}: annotated {hints[k.name]} but its default is a {k.type.__name__}")
            cls._declared = keys
        return cls._declared

    @classmethod
    def dotted(cls) -> tuple[str, ...]:
        """`section.name` of every key this class defines (for a reader's `reads=`)."""
        return tuple(k.dotted for k in cls.declared())

    @classmethod
    def of(cls: type[K], cfg) -> K:
        """This class's keys of a config (or of its section object): the section itself, typed as this class."""
        sec = cfg if isinstance(cfg, Keys) and cfg.section == cls.section else getattr(cfg, cls.section)
        if not isinstance(sec, cls):
            raise GenlabError(f"config section [{cls.section}] has no {cls.__name__}: no registered component lists it in `keys`")
        return sec

    @classmethod
    def of_or_defaults(cls: type[K], cfg) -> K:
        """of(cfg), or a fresh object of the declared defaults where a caller passes no config (cfg None)."""
        return cls() if cfg is None else cls.of(cfg)


def key_classes(keys) -> tuple[type[Keys], ...]:
    """A spec's `keys` (one Keys class, or a tuple of them) as a tuple of classes."""
    return (keys,) if isinstance(keys, type) else tuple(keys)


def lineage(cls: type[Keys]) -> list[type[Keys]]:
    """cls and the Keys classes it inherits keys from, bases first (a reader that subclasses an owner reads both)."""
    return [b for b in reversed(cls.__mro__) if issubclass(b, Keys) and b is not Keys]


def declared_by(keys) -> tuple[Key, ...]:
    """Every Key of a spec's `keys`, inherited ones included."""
    classes = dict.fromkeys(b for c in key_classes(keys) for b in lineage(c))
    return tuple(k for c in classes for k in c.declared())


def dotted_of(keys) -> tuple[str, ...]:
    """`section.name` of every key of a spec's `keys` (for a reader's `reads=`)."""
    return tuple(k.dotted for k in declared_by(keys))


def meta_of(f: dataclasses.Field) -> dict:
    return dict(f.metadata) if f.metadata else {}


BOUNDS = (("ge", ">=", operator.ge), ("gt", ">", operator.gt), ("le", "<=", operator.le), ("lt", "<", operator.lt))


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
    parts = [f"{sign} {_num(m[op])}" for op, sign, _ in BOUNDS if m.get(op) is not None]
    if parts:
        return ("each " if typ is tuple else "") + ", ".join(parts)
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
        for op, bound, ok in BOUNDS:
            b = m.get(op)
            if b is not None and not ok(v, b):
                raise GenlabError(f"{key} must be {bound} {_num(b)}, got {value!r}")

