"""The config tree: dataclasses with defaults, TOML presets and dotted `key=value` overrides.

A config fully determines a run. Unknown keys and wrong types fail before any work is done.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any, get_origin

import tomllib

from genlab.config.check import check_config, read_keys, selections
from genlab.config.fields import did_you_mean, meta_of
from genlab.config.keys import RETIRED, SECTIONS, Config, section_class
from genlab.core.errors import GenlabError
from genlab.core.registry import REGISTRIES

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # shipped as package data
SWEEP_DIR = CONFIG_DIR / "sweeps"


def __getattr__(name):  # DataConfig, ModelConfig, ...: the composed section classes (core and component keys)
    for s in SECTIONS:
        if name == f"{s.capitalize()}Config":
            return section_class(s)
    raise AttributeError(name)


def _coerce(value: Any, typ, where: str, choices=None):
    """Check/convert a TOML or CLI value to the declared field type (CLI values arrive as text); a TOML bool for a
    text key whose choices are true/false (train.graph_step, a bool once) is that text, so old configs load."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif typ in (int, float) and (isinstance(value, str) or number and (typ is float or isinstance(value, int))):
        with contextlib.suppress(ValueError):
            return typ(value)
    elif typ is str and (isinstance(value, str) or number):
        return str(value)
    elif typ is str and isinstance(value, bool) and str(value).lower() in (choices or ()):
        return str(value).lower()
    elif typ is list or typ is tuple or get_origin(typ) is tuple:  # TOML array, JSON text or comma-separated text
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = [v.strip() for v in value.strip("()[]").split(",") if v.strip()]
        if typ is list and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)  # a list of names
        if typ is not list and isinstance(value, (list, tuple)):
            with contextlib.suppress(TypeError, ValueError):
                return tuple(float(v) for v in value)
    name = getattr(typ, "__name__", str(typ))
    raise GenlabError(f"config key '{where}' expects {name}, got {value!r}")



def apply_dict(cfg: Config, data: dict, source: str = "config") -> Config:
    """Merge a nested dict (from TOML) into cfg, validating every key and type."""
    top = [f.name for f in dataclasses.fields(Config)]
    for key, val in data.items():
        if key not in top:
            raise GenlabError(f"unknown config section '{key}' in {source}{did_you_mean(key, top)}; valid: {', '.join(top)}")
        if key == "preset":
            cfg.preset = _coerce(val, str, key)
            continue
        if not isinstance(val, dict):
            raise GenlabError(f"config section '{key}' in {source} must be a table")
        section = getattr(cfg, key)
        metas = {f.name: meta_of(f) for f in dataclasses.fields(section)}
        types = {k: m["type"] for k, m in metas.items()}  # what values are coerced to
        for k, v in val.items():
            if f"{key}.{k}" in RETIRED and k not in types:
                if v != RETIRED[f"{key}.{k}"]:
                    raise GenlabError(f"config key '{key}.{k}' in {source} was removed: no component reads it")
                continue  # a saved run config from before the key was removed
            if k not in types:
                raise GenlabError(f"unknown config key '{key}.{k}' in {source}{did_you_mean(k, types)}; "
                                  f"valid keys of [{key}]: {', '.join(types)}")
            setattr(section, k, _coerce(v, types[k], f"{key}.{k}", metas[k].get("choices")))
    return cfg


def parse_override(text: str) -> tuple[str, str, Any]:
    if "=" not in text:
        raise GenlabError(f"override '{text}' must look like section.key=value (e.g. optim.lr=3e-4)")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) != 2:
        raise GenlabError(f"override key '{key}' must be section.key (e.g. model.depth=12)")
    return parts[0], parts[1], raw.strip()


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    for text in overrides:
        section, key, raw = parse_override(text)
        apply_dict(cfg, {section: {key: raw}}, source=f"override '{text}'")
    return cfg


def resolve_preset_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        return p
    for cand in (CONFIG_DIR / name_or_path, CONFIG_DIR / f"{name_or_path}.toml"):
        if cand.exists():
            return cand
    presets = sorted(x.stem for x in CONFIG_DIR.glob("*.toml"))
    raise GenlabError(f"config '{name_or_path}' not found{did_you_mean(p.stem, presets)}; presets: {', '.join(presets)} (or a path to a .toml file)")


def load_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise GenlabError(f"{path}: invalid TOML: {e}") from None


def load_config(preset: str | None = None, overrides: list[str] | dict = ()) -> Config:
    """Defaults <- preset TOML <- overrides (`section.key=value` text, or a {"section.key": value} dict of typed
    values), then the defaults of the components a layer switched (component_defaults). `preset` None means the
    default preset."""
    cfg = Config()
    path = resolve_preset_path(preset or "digits_flow")
    cfg.preset = path.stem
    data = load_toml(path)
    apply_dict(cfg, data, source=str(path))
    if isinstance(overrides, dict):  # typed values go in as they are, checked like TOML values
        for k, v in overrides.items():
            section, key, _ = parse_override(f"{k}=")
            apply_dict(cfg, {section: {key: v}}, source=f"override {k}={v!r}")
        given = {".".join(parse_override(f"{k}=")[:2]): v for k, v in overrides.items()}
    else:
        apply_overrides(cfg, list(overrides))
        given = {f"{s}.{k}": v for s, k, v in map(parse_override, overrides)}
    in_preset = {f"{sec}.{k}": v for sec, vals in data.items() if isinstance(vals, dict) for k, v in vals.items()}
    component_defaults(cfg, [in_preset, given])
    validate(cfg)
    return cfg


def component_defaults(cfg: Config, layers: list[dict]) -> None:
    """Each chosen component's own defaults (its registry spec's `defaults`), over what the layers before the one that
    switched to it set (layers: {dotted key: value} of each, in order; naming the entry already chosen is no switch,
    and a component no layer chose counts as chosen first). So `method.name=shortcut` on a preset written for flow
    samples with shortcut's flow_map instead of the preset's heun, while a sampler given beside it stays the user's
    (and is refused by validation if it cannot work). A default applies only where the config reads its key: it
    never makes an unused option."""
    applied = set()
    pending = True
    while pending:  # a default may select another component, whose keys and defaults count from then on
        pending, read = False, read_keys(cfg)
        for dotted, kind, name, defaults in _chosen_components(cfg, read):
            chosen_at = _switched_at(layers, dotted)
            for k, v in defaults.items():
                if k in read and (dotted, k) not in applied and not any(k in keys for keys in layers[chosen_at:]):
                    applied.add((dotted, k))
                    s, n = k.split(".")
                    apply_dict(cfg, {s: {n: v}}, source=f"the defaults of {kind} '{name}' ({dotted}={name})")
                    pending = True


def _switched_at(layers: list[dict], dotted: str) -> int:
    """The layer that set `dotted` to its final value, after any other value (0 where no layer set it)."""
    at, value = 0, None
    for i, layer in enumerate(layers):
        if dotted in layer and str(layer[dotted]) != value:
            at, value = i, str(layer[dotted])
    return at


def _chosen_components(cfg: Config, read) -> list[tuple[str, str, str, dict]]:
    """(selector key, registry, entry name, its defaults) for every read key that names one registry entry."""
    return [(dotted, kind, name, REGISTRIES[kind].spec(name).defaults or {}) for dotted, kind, name in selections(cfg, read)
            if not isinstance(name, list) and name in REGISTRIES[kind]]  # an unknown name: validation's error


validate = check_config  # ranges, unread options, then what model, data and method impose: before anything is built


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg, dict_factory=lambda kv: {k: list(v) if isinstance(v, tuple) else v for k, v in kv})


def from_dict(d: dict) -> Config:
    cfg = Config()
    apply_dict(cfg, d, source="saved config")
    return cfg


def dumps_toml(d: dict) -> str:
    """The config dict as TOML, written by tomli-w (tomllib only reads)."""
    import tomli_w
    return tomli_w.dumps(d)


def run_config_dict(cfg) -> dict:
    """The config a run folder shows: the keys its components read, plus any set away from its default (kept so a
    warning's subject stays visible); loading it back gives the same Config, the rest at their defaults."""
    read, d = read_keys(cfg), to_dict(cfg)
    defaults = to_dict(type(cfg)())
    return {sec: ({k: v for k, v in vals.items() if f"{sec}.{k}" in read or v != defaults[sec][k]}
                  if isinstance(vals, dict) else vals) for sec, vals in d.items()}
