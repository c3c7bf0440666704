"""Name -> spec registries, so every interchangeable part is chosen by a config string (docs/architecture.md:
the Registry seam). An entry registers next to its code with a typed spec: builder, one-line doc, the config keys
it owns (`keys`) or reads (`reads`) and its capabilities as spec fields (a misspelt one is a TypeError at import).

No import cycle: this module imports nothing of genlab but its errors; a lookup imports the registering modules on
first use (`load_entries`, by package name), and a lower floor reaches a registry by name: `all_registries()[kind]`.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genlab.core.errors import GenlabError, did_you_mean

REGISTRIES: dict[str, "Registry"] = {}
_loaded = False
generation = 0  # bumped on every registration: derived config classes are rebuilt when it moves


# the packages whose __init__ imports the modules that register components (each package lists its own files)
COMPONENT_PACKAGES = ("genlab.runtime", "genlab.nn", "genlab.optim", "genlab.data", "genlab.sampling", "genlab.eval",
                      "genlab.families")


def load_entries():
    """Import every registering module once (idempotent), then the files named by $GENLAB_PLUGINS
    (os.pathsep-separated module names or .py paths: a component of your own in one file)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in COMPONENT_PACKAGES:  # by name: the registry sits below every floor it loads
        importlib.import_module(name)
    families = importlib.import_module("genlab.families")
    for info in pkgutil.iter_modules(families.__path__):  # one package per family: its folder is its registration
        if info.ispkg:
            importlib.import_module(f"genlab.families.{info.name}")
    importlib.import_module("genlab.training")  # the step strategies (their checks), after the families they train
    for item in filter(None, os.environ.get("GENLAB_PLUGINS", "").split(os.pathsep)):
        load_plugin(item)


def load_plugin(item: str):
    """Import one plugin: a module name, or a .py file (registered under its file stem)."""
    if not item.endswith(".py"):
        return importlib.import_module(item)
    import sys
    p = Path(item)
    if not p.is_file():
        raise GenlabError(f"plugin file '{item}' not found ($GENLAB_PLUGINS)")
    name = f"genlab_plugin_{p.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True, kw_only=True)
class Spec:
    builder: Any                  # the registered function, class or value
    doc: str = ""
    keys: Any = ()                # the config.fields.Keys class (or a tuple of them) this entry reads (it owns them)
    reads: tuple[str, ...] = ()   # dotted keys declared by another component that this entry reads too
    defaults: dict | None = None  # {dotted key: value} this entry brings when chosen: over what an earlier config
                                  # layer set for the entry it replaced (config.component_defaults)

    def check_choice(self, cfg, key: str, name: str, registry: "Registry") -> None:
        """Config validation asks every entry a config selects (`key`=`name`): a one-line GenlabError where it
        cannot run this config. Most entries run anywhere; a kernel may not (nn/kernels.py)."""


def spec_with_arg(registry: "Registry", value: str, label: str) -> tuple[str, str, Any]:
    """'NAME[:ARG]' chosen by `label` (a config key or option) -> (name, arg, spec), for registries whose specs
    declare `arg` (what ARG names, "" = none): one-line GenlabErrors for an unknown name or a missing/extra ARG."""
    name, _, arg = str(value).partition(":")
    try:
        spec = registry.spec(name)
    except GenlabError as e:  # unknown name: one line with the valid choices
        raise GenlabError(f"{label}: {e}") from None
    if spec.arg and not arg:
        raise GenlabError(f"{label}={name} needs {spec.arg}: {label}={name}:<{spec.arg}>")
    if not spec.arg and arg:
        raise GenlabError(f"{label}={name} takes no ':{arg}'")
    return name, arg, spec


class Registry:
    def __init__(self, kind: str, spec: type = Spec):
        self.kind = kind
        self.spec_type = spec
        self._specs: dict[str, Spec] = {}
        REGISTRIES[kind] = self

    def register(self, name: str, doc: str = "", **fields):
        """Decorator: `@registry.register("name", "doc", keys=..., <capability>=...)`; the registered object is
        returned unchanged. Also usable as `registry.register(name, doc, ...)(value)` for plain values."""
        def wrap(fn):
            global generation
            if name in self._specs:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            first_line = doc or (getattr(fn, "__doc__", None) or "").strip().split("\n")[0]
            self._specs[name] = self.spec_type(builder=fn, doc=first_line, **fields)
            generation += 1
            return fn
        return wrap

    def spec(self, name: str) -> Spec:
        if name not in self._specs:
            load_entries()
        if name not in self._specs:
            raise GenlabError(f"unknown {self.kind} '{name}'{did_you_mean(str(name), self._specs)}; "
                              f"valid choices: {', '.join(sorted(self._specs))}")
        return self._specs[name]

    def get(self, name: str):
        """The registered builder (function, class or value)."""
        return self.spec(name).builder

    def doc(self, name: str) -> str:
        load_entries()
        return self._specs[name].doc if name in self._specs else ""

    def names(self):
        load_entries()
        return sorted(self._specs)

    def __contains__(self, name):
        if name not in self._specs:
            load_entries()
        return name in self._specs

    def items(self):
        """(name, builder) pairs, sorted by name."""
        load_entries()
        return [(n, s.builder) for n, s in sorted(self._specs.items())]

    def specs(self):
        """(name, spec) pairs, sorted by name."""
        load_entries()
        return sorted(self._specs.items())


def all_registries():
    """Import every module that registers something, then return the registries."""
    load_entries()
    return dict(sorted(REGISTRIES.items()))


