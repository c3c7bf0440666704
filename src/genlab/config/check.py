"""Config validation, derived from what the components declare: ranges, the keys the selected components read, and
what model, data and method require of each other (a method's capabilities are reached through the registry by name).
It runs before any file is written or model built; every failure is one GenlabError line naming the key."""
from __future__ import annotations

import dataclasses
import re
import string

from genlab.config.fields import check_value, dotted_of, meta_of
from genlab.config.keys import declared_keys, readers, sections
from genlab.core.errors import GenlabError
from genlab.core.registry import REGISTRIES, all_registries


def check_section(cfg, sec: str) -> None:
    """Every field of one section against its declared range, choices or registry."""
    obj = getattr(cfg, sec)
    for f in dataclasses.fields(obj):
        check_value(sec, f, meta_of(f)["type"], getattr(obj, f.name))
    if sec == "eval" and not str(obj.metrics).replace(",", " ").strip():  # its names were checked above (`lists=`); weights where eval runs
        raise GenlabError("eval.metrics is empty; valid choices: " + ", ".join(_registry("eval_metric").names())
                          + " (eval.num_samples=0 turns eval off)")


def _registry(name: str):
    return all_registries()[name]


def check_config(cfg) -> None:
    for sec, _ in sections(cfg):
        check_section(cfg, sec)
    _check_train(cfg)
    _check_components(cfg)  # an incompatible method/model/data pair first: it explains the unused options
    _check_choices(cfg)
    for key, msg in unused_options(cfg):
        if not _soft(key):
            raise GenlabError(msg)


# An unused sampling/eval option changes no weights (and shared override lists set them for several
# methods), so it is a warning printed before training and recorded in the run's config.toml; any other
# unused option (data, model, optim, train, a method's training option) means the run is not what the user
# believes it is, so it is an error. Which method keys act only at sampling time, each method class says.
def _soft(key: str) -> bool:
    return key.startswith("eval.") or any(key in sampling_keys_of(name) for name in _registry("method").names())


def sampling_keys_of(method: str) -> list[str]:
    """Those the method's spec lists, plus the keys of every entry of the registries those keys select (e.g.
    method.sampler -> the SDE's method.sde_noise)."""
    declared = declared_keys()
    keys = list(_registry("method").get(method).sampling_keys)
    for dotted in list(keys):
        kind = meta_of(declared[dotted][0].field).get("registry")
        for _, spec in (REGISTRIES[kind].specs() if kind in REGISTRIES else ()):
            keys += [k for k in dotted_of(spec.keys) if k not in keys]
    return keys


def config_warnings(cfg) -> list[str]:
    return [msg for key, msg in unused_options(cfg) if _soft(key)]


def _lookup(cfg, dotted: str):
    sec, key = dotted.split(".")
    return getattr(getattr(cfg, sec), key)


def _selected(cfg, dotted: str, meta: dict) -> list[str]:
    """The entry names a selector key picks: one name, a list, or comma-separated names (`lists=`)."""
    value = _lookup(cfg, dotted)
    if meta.get("lists"):
        return [v.strip() for v in str(value).split(",") if v.strip()]
    return list(value) if isinstance(value, list) else [value]


def read_keys(cfg) -> dict[str, str]:
    """dotted key -> who reads it, for this config: the core keys, then the keys of every selected component
    (a selector key that is read picks entries of its registry, whose keys may select further entries)."""
    declared = declared_keys()
    read = {dotted: "core" for dotted, (_, owners) in declared.items() if "core" in owners}
    changed = True
    while changed:
        changed = False
        for dotted in list(read):
            meta = meta_of(declared[dotted][0].field)
            kind = meta.get("registry") or meta.get("lists")
            if kind not in REGISTRIES:
                continue
            for name in _selected(cfg, dotted, meta):
                if name not in REGISTRIES[kind]:
                    continue  # an unknown name is reported by the range check
                spec = REGISTRIES[kind].spec(name)
                for k in dotted_of(spec.keys) + tuple(spec.reads):
                    if k not in read:
                        read[k] = f"{kind} '{name}' ({dotted}={name})"
                        changed = True
    return read


def _why_unused(cfg, dotted: str, declared: dict, read: dict) -> str:
    """'not read by method 'flow' (method.name=flow); read by method 'mdlm'': the selector that decides, the owners."""
    everyone = sorted(set(readers()[dotted]))
    kinds = {o.split(" ")[0] for o in everyone}
    for kind in kinds:  # a selector of that registry that this config reads names the entry chosen instead
        for sel, (k, _) in declared.items():
            meta = meta_of(k.field)
            if sel in read and (meta.get("registry") == kind or meta.get("lists") == kind):
                chosen = _lookup(cfg, sel)
                shown = ",".join(chosen) if isinstance(chosen, list) else chosen
                return (f"is not read by {kind.replace('_', ' ')} '{shown}' ({sel}={shown}); read by "
                        f"{', '.join(everyone)}; remove it or choose another {sel}")
    return f"is not read by the components this config selects; read by {', '.join(everyone)}"


def unused_options(cfg) -> list[tuple[str, str]]:
    """(key, message) per option set away from its default that no selected component reads."""
    declared, read = declared_keys(), read_keys(cfg)
    out = []
    for sec, obj in sections(cfg):
        for f in dataclasses.fields(obj):
            if getattr(obj, f.name) == f.default or (f.default is dataclasses.MISSING and getattr(obj, f.name) == f.default_factory()):
                continue
            dotted = f"{sec}.{f.name}"
            if dotted not in read:
                out.append((dotted, f"{dotted} {_why_unused(cfg, dotted, declared, read)}"))
    return out


def _check_train(cfg):
    t = cfg.train
    if str(cfg.method.cache_schedule).strip():
        raise GenlabError("method.cache_schedule is a sampling plan measured on a trained run (genlab analyze RUN --what "
                          "cache): set it on genlab eval / genlab sample, not for training (method.cache_blocks caches "
                          "during training's evaluations)")
    if t.batch_size % t.grad_accum:
        raise GenlabError(f"train.batch_size ({t.batch_size}) must be divisible by train.grad_accum ({t.grad_accum})")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", t.device):
        raise GenlabError(f"unknown train.device '{t.device}'; valid: auto, cpu, cuda, cuda:N")
    if len(cfg.optim.betas) != 2:
        raise GenlabError(f"optim.betas must hold two numbers, got {list(cfg.optim.betas)}")
    convert = list(t.convert or []) + ([t.precision] if t.precision.startswith("float8_") else [])
    check_converter_combination(convert)
    if getattr(t, "float8_all_gather", False):
        if not {"float8", "float8_tensorwise"} & set(convert):
            raise GenlabError("train.float8_all_gather needs tensorwise float8 (train.convert=[\"float8\"] or "
                              f"train.precision=float8_tensorwise); this run converts {convert or 'nothing'}")
        if not _registry("parallel").spec(t.parallel).sharded:
            raise GenlabError(f"train.float8_all_gather all-gathers FSDP2 shards; it needs train.parallel=fsdp|hsdp, "
                              f"got train.parallel={t.parallel}")
    _registry("method").get(cfg.method.name).check_config(cfg)
    for _, spec in _registry("train_step").specs():  # each step strategy's own checks, beside it in training/
        if spec.check is not None:
            spec.check(cfg)


# batched variants: train.<list key> -> the single-run key each member sets, its short name (the sweep's variant
# naming: the last part of the key), and the values it takes
VARIANT_KEYS = {"lrs": ("optim.lr", "numbers > 0", lambda v: v > 0),
                "weight_decays": ("optim.weight_decay", "numbers >= 0", lambda v: v >= 0),
                "ema_decays": ("train.ema_decay", "numbers in (0, 1)", lambda v: 0 < v < 1)}


def parse_seeds(text: str, key: str = "train.seeds") -> list[int]:
    try:
        seeds = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise GenlabError(f"{key} must be comma-separated integers >= 0 (e.g. 0,1,2,3), got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise GenlabError(f"{key} must be distinct integers >= 0 (e.g. 0,1,2,3), got {text!r}")
    return seeds


def parse_variant_values(text: str, name: str) -> list[str]:
    """train.lrs / weight_decays / ema_decays: the values as written (they name the run folders), each checked."""
    key, valid, ok = VARIANT_KEYS[name]
    tokens = [x.strip() for x in str(text).split(",") if x.strip()]
    try:
        values = [float(x) for x in tokens]
    except ValueError:
        values = []
    if not values or not all(ok(v) for v in values) or len(set(values)) != len(values):
        raise GenlabError(f"train.{name} must be comma-separated distinct {valid} (the {key} of each batched member, "
                          f"e.g. {'1e-4,3e-4,1e-3' if name == 'lrs' else '0,0.01,0.1' if name == 'weight_decays' else '0.99,0.999'}), "
                          f"got {text!r}")
    return tokens


def variant_lists(cfg) -> dict[str, list[str]]:
    """{list key: its values as written} for the train.lrs|weight_decays|ema_decays that are set."""
    return {n: parse_variant_values(getattr(cfg.train, n), n) for n in VARIANT_KEYS if getattr(cfg.train, n)}


def member_name(name: str, values: dict[str, str]) -> str:
    """A batched variant's name without its seed suffix: NAME-lr=<v>-weight_decay=<v> (the values as written, the
    sweep's `<key>=<value>` parts), or NAME filled in where it is a template like "lr={lr}-depth=4" (the sweep's)."""
    short = {VARIANT_KEYS[n][0].split(".")[-1]: v for n, v in values.items()}
    if "{" in name:
        return name.format(**short)
    return "-".join([name, *(f"{k}={v}" for k, v in short.items())])


def check_member_name(cfg) -> None:
    """train.name as a batched-variant name template: each listed key's short name once, nothing else."""
    t, lists = cfg.train, variant_lists(cfg)
    if "{" in t.name and lists:  # a name template (the sweep passes one): every listed key, no other field
        try:
            parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(t.name) if f is not None]
        except ValueError:
            parsed = [("", "", None)]
        fields = {f for f, _, _ in parsed}
        short = {VARIANT_KEYS[n][0].split(".")[-1] for n in lists}
        if fields != short or any(spec or conv for _, spec, conv in parsed):
            raise GenlabError(f"train.name {t.name!r}: a name template names each batched-variant value once, "
                              f"as {{{'}, {'.join(sorted(short))}}} (the lists set); got fields {sorted(fields)}")


def is_batched(cfg) -> bool:
    """Several runs of this config in one process: train.seeds or a batched-variants list is set."""
    t = cfg.train
    return bool(t.seeds) or any(getattr(t, n) for n in VARIANT_KEYS)


def batched_label(cfg) -> str:
    named = [n for n in VARIANT_KEYS if getattr(cfg.train, n)]
    return f"train.{named[0]} (batched variants)" if named else "train.seeds (batched seeds)"


def check_converter_combination(names) -> None:
    """Model converters that exclude each other (train.convert plus the converter a float8_* precision implies):
    those that declare `linears` replace the same block linears' arithmetic, so a run takes one of them."""
    # float8 is float8_tensorwise's alias; an unknown name is the registry's own error later
    converters = _registry("convert")
    seen = {"float8_tensorwise" if n == "float8" else n: n for n in names if n in converters and converters.get(n).linears}
    if len(seen) > 1:
        # e.g. BitLinear's already-quantised operands would be cast again by float8, or replaced by it
        a, b = list(seen.values())[:2]
        raise GenlabError(f"{a} and {b} convert the same block linears; choose one (train.convert / train.precision)")


def _check_components(cfg):
    """What the method, model and dataset declare about each other."""
    d, m = cfg.data, cfg.model
    data, model, meth = _registry("dataset").spec(d.name), _registry("model").spec(m.name), _registry("method").get(cfg.method.name)
    if data.needs_path and not d.path:
        raise GenlabError(f"data.name={d.name} needs data.path (a folder made by `genlab data prepare`)")
    if data.check is not None:
        data.check(d)
    if meth.data_kinds and data.kind not in meth.data_kinds:
        raise GenlabError(f"method.name={cfg.method.name} trains on {'|'.join(meth.data_kinds)} data but data.name={d.name} "
                          f"provides {data.kind} data; choose a matching method.name or data.name")
    if meth.model_families and model.family not in meth.model_families:
        fits = [n for n, s in _registry("model").specs() if s.family in meth.model_families]
        raise GenlabError(f"method.name={cfg.method.name} needs model.name={'|'.join(fits)}, got model.name={m.name}")
    if meth.causal is not None and "model.causal" in read_keys(cfg) and m.causal != meth.causal:
        raise GenlabError(f"method.name={cfg.method.name} needs model.causal={str(meth.causal).lower()}")


def _check_choices(cfg):
    """Every entry this config selects, asked whether it can run this config: the model its shapes and layers
    (families/models.py), the optimizer the parallelism, a kernel the device (nn/kernels.py)."""
    for dotted, kind, value in selections(cfg, read_keys(cfg)):
        for name in (value if isinstance(value, list) else [value]):
            REGISTRIES[kind].spec(name).check_choice(cfg, dotted, name, REGISTRIES[kind])


def selections(cfg, read) -> list[tuple[str, str, object]]:
    """(selector key, registry, its value: a name or a list of names) for every read key that names registry entries."""
    declared = declared_keys()
    return [(dotted, kind, _lookup(cfg, dotted)) for dotted in read
            if (kind := meta_of(declared[dotted][0].field).get("registry")) in REGISTRIES]


def _trains_on_cpu(device: str) -> bool:
    """train.device=cpu, or auto on a machine without CUDA."""
    if device != "auto":
        return device == "cpu"
    import torch
    return not torch.cuda.is_available()
