"""Sweep files: parse and validate a sweep TOML (its keys: docs/sweeps.md) into a Sweep of variants, each a set of
overrides. `genlab sweep NAME key=value ...` replaces a sweep key (CLI_KEYS), sets a [params] name, or sets a config
key last on every run and run stage. Everything, every variant's full config included, is checked before anything runs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from genlab.config.check import VARIANT_KEYS, member_name, sampling_keys_of
from genlab.config.fields import did_you_mean
from genlab.config.tree import SWEEP_DIR, load_config, load_toml
from genlab.core.errors import GenlabError
from genlab.lab.sweep.expand import Variant, axis_entries, batch_templates, combine, safe_name
from genlab.lab.sweep.stages import RESERVED as RESERVED_NAMES
from genlab.lab.sweep.stages import VALUE, check_placeholders, expand_all, needs, parse_stages, references, resolve
from genlab.lab.sweep.tables import check_tables

TOP_KEYS = {"name", "description", "steps", "seeds", "batched_seeds", "batched_variants", "launcher", "nproc", "timeout", "loss_at", "loss_at_time", "metrics", "base",
            "axis", "stage", "eval", "reference", "fd_target", "params", "tables", "env", "max_time"}
LAUNCHERS = ("cpu", "gpu", "per_gpu", "torchrun")
# sweep keys `genlab sweep NAME key=value` may replace
CLI_KEYS = ("steps", "seeds", "launcher", "nproc", "timeout")
# the runner owns these: every run's folder, name and seed come from the sweep
RESERVED = ("train.out_dir", "train.name", "train.resume", "train.seed", "train.seeds", "train.lrs", "train.weight_decays",
            "train.ema_decays")


@dataclass
class Sweep:
    name: str
    path: Path
    preset: str
    base_overrides: list
    variants: list = field(default_factory=list)
    steps: int | None = None
    seeds: list = field(default_factory=lambda: [0])
    launcher: str = "cpu"
    nproc: int = 1
    timeout: float = 3600.0
    loss_at: list = field(default_factory=list)
    metrics: list = field(default_factory=list)
    description: str = ""
    order: list = field(default_factory=list)   # every run name in sweep-file order (kept by --only)
    stages: list = field(default_factory=list)  # [[stage]] entries, run first, in order (stages.py)
    reference: str | None = None                # the run the report's ratios divide by
    batched_seeds: bool = False                 # each variant's seeds in one batched process (train.seeds)
    batched_variants: bool = False              # variants differing in batchable grid axes too (Variant.batch)
    cli: list = field(default_factory=list)     # `genlab sweep NAME key=value ...` overrides, as given
    configs: dict = field(default_factory=dict)  # run stage or variant name -> (its checked config, reads a stage's data)
    tables: dict = field(default_factory=dict)   # [tables.NAME]: the report's tables of stage rows (tables.py)
    env: dict = field(default_factory=dict)      # the environment of every process it starts
    max_time: float | None = None               # the default of --max-time: no stage or run starts after it

    @property
    def stage_map(self) -> dict:
        return {s.name: s for s in self.stages}

    def as_run(self, st) -> Variant:
        """A stage as a one-run variant (no seed suffix, no train.seed); a command stage's words are its overrides."""
        return Variant(st.name, st.overrides if st.is_run else st.command, 0, st.nproc, st.preset, st.eval, stage=True,
                       reference=st.reference)

    def needs(self, v: Variant) -> set:
        """The stages a run depends on."""
        return needs(self.stages, v.overrides + v.eval)


def _int_list(raw, key, src, minimum=0):
    v = raw.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= minimum for x in v):
        raise GenlabError(f"{src}: {key} must be a list of integers >= {minimum}, got {v!r}")
    return v


def _positive(raw, key, src, kind, default):
    v = raw.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, kind) or v <= 0:
        raise GenlabError(f"{src}: {key} must be a positive {kind.__name__ if kind is int else 'number'}, got {v!r}")
    return v


def _check_overrides(ovs, where, src, reserved=RESERVED):
    for o in ovs:
        if not isinstance(o, str) or "=" not in o:
            raise GenlabError(f"{src}: {where}: override {o!r} is not 'key=value'")
        if o.split("=", 1)[0].strip() in reserved:
            raise GenlabError(f"{src}: {where}: '{o}' is set by the sweep itself ({', '.join(RESERVED)}); use seeds = [...] (and batched_seeds) for seeds, batched_variants for lr / weight-decay / EMA axes")


def shipped_sweeps() -> list[str]:
    return sorted(p.stem for p in SWEEP_DIR.glob("*.toml"))


def resolve_sweep_path(name_or_path) -> Path:
    """A path to a sweep file, or the name of one shipped with genlab (genlab/configs/sweeps/NAME.toml)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = SWEEP_DIR / f"{path.name}.toml"
    if path.suffix != ".toml" and path.name == str(name_or_path) and shipped.is_file():
        return shipped
    raise GenlabError(f"sweep file '{name_or_path}' not found{did_you_mean(path.stem, shipped_sweeps())}; "
                      f"shipped sweeps: {', '.join(shipped_sweeps())} (or a path to a .toml file)")


def _cli_value(key: str, text: str):
    """A TOML value (20, [0, 1], "cpu"), else the bare word (cpu); seeds also as 0,1 or 3, as train.seeds takes them."""
    import tomllib
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    if key == "seeds" and isinstance(value, (int, str)) and str(value).replace(",", "").isdigit():
        return [int(x) for x in str(value).split(",")]
    return value


def split_cli(items: list[str], params: dict = {}) -> tuple[dict, list[str], dict]:  # noqa: B006 - read only
    """Command-line overrides: {sweep key: value}, the config overrides (section.key=value) and {parameter: value}."""
    top, config, given = {}, [], {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if eq and "." in key:
            config.append(item)
        elif eq and key in CLI_KEYS:
            top[key] = _cli_value(key, value)
        elif eq and key in params:
            given[key] = value
        else:
            mine = f", a parameter of this file ({', '.join(params)})" if params else ""
            raise GenlabError(f"override '{item}' is neither a sweep key ({', '.join(CLI_KEYS)}){mine} nor a config key "
                              f"section.key=value{did_you_mean(key, [*CLI_KEYS, *params])}")
    return top, config, given


def read_file(path: Path, overrides: list[str]) -> tuple[dict, list[str], dict]:
    """The file's TOML with its [params] filled in everywhere (the command line's NAME=value first; stages fill theirs
    with their matrix values), its config overrides from the command line, and the parameters."""
    raw, src = load_toml(path), str(path)
    params = raw.get("params", {})
    if not isinstance(params, dict) or not all(re.fullmatch(r"[A-Za-z_]\w*", k) and k not in RESERVED_NAMES for k in params):
        raise GenlabError(f"{src}: [params] holds NAME = \"value\" (letters, digits, _; not {', '.join(RESERVED_NAMES)})")
    params = {k: str(v) for k, v in params.items()}
    top, cli, given = split_cli(overrides, params)
    params.update(given)
    def value(k, v):  # `max_time = "{BUDGET}"`: the parameter read as TOML (360), else as text
        if k in ("params", "description", "stage"):
            return v
        return _cli_value(k, expand_all(v, params)) if isinstance(v, str) and VALUE.fullmatch(v) else expand_all(v, params)
    return {**{k: value(k, v) for k, v in raw.items()}, **top}, cli, params


def _varied(cli: list[str], combos: list, src: str) -> None:
    """A command-line config key the variants set differently (or only some set) would make them one run under
    several names."""
    for o in cli:
        key = o.split("=", 1)[0].strip()
        sets = [{x.split("=", 1)[1].strip() for x in ov if x.split("=", 1)[0].strip() == key} for _, ov, _, _ in combos]
        values = set().union(*sets)
        if len(values) > 1 or (values and not all(sets)):
            raise GenlabError(f"{src}: '{o}': {key} is what this sweep's variants differ in ({', '.join(sorted(values))}); "
                              "pick variants with --only instead")


def _reads_stage(ovs: list[str]) -> bool:
    """Its data or reference images are a stage's output: not there before the sweep runs."""
    return any(o.split("=", 1)[0].strip() in ("data.path", "eval.val_path") and references(o) for o in ovs)


def _check_eval(eval_ovs, preset, overrides, where, src, stages, nominal):
    """`genlab eval` overrides: only eval.* and the method's sampling keys, valid on the run's config."""
    check_placeholders(eval_ovs, [s.name for s in stages], where, src)
    _check_overrides(eval_ovs, f"{where}: eval", src)
    ovs = [resolve(o, nominal, {s.name: s for s in stages}) for o in overrides + eval_ovs]
    try:
        cfg = load_config(preset, ovs[:len(overrides)])
        allowed = sampling_keys_of(cfg.method.name)
        for o in eval_ovs:
            key = o.split("=", 1)[0].strip()
            if not (key.startswith("eval.") or key in allowed):
                raise GenlabError(f"eval override '{o}' is not an eval.* key or a sampling key of method "
                                  f"{cfg.method.name} ({', '.join(allowed) or 'none'})")
        load_config(preset, ovs)
    except GenlabError as e:
        raise GenlabError(f"{src}: {where}: {e}") from None


def load_sweep(path, overrides: list[str] = ()) -> Sweep:
    """The sweep file at `path` (or a shipped sweep's name) with `genlab sweep` command-line overrides, all checked."""
    path = resolve_sweep_path(path)
    raw, cli, params = read_file(path, list(overrides))
    sw = _settings(raw, path, list(overrides))
    src = str(path)
    _check_overrides(sw.base_overrides, "base.overrides", src)
    _check_overrides(cli, "command line", src)
    sw.stages = parse_stages(raw.get("stage", []), src, sw.tables, params)
    known = [s.name for s in sw.stages]
    sweep_eval = raw.get("eval", [])
    if not isinstance(sweep_eval, list):
        raise GenlabError(f"{src}: eval must be a list of `genlab eval` overrides, e.g. [\"eval.nfe_list=1,2,4,8\"]")
    sweep_eval = [str(x) for x in sweep_eval]
    check_placeholders(sw.base_overrides, known, "base.overrides", src)
    check_placeholders(cli, known, "command line", src)
    common = sw.base_overrides + ([f"train.steps={sw.steps}"] if sw.steps else [])
    for where, ovs in (("[base]", common), ("command line", common + cli)):  # a bad key is blamed where it was given
        try:
            base_cfg = load_config(sw.preset, ovs)
        except GenlabError as e:
            raise GenlabError(f"{src}: {where}: {e}") from None
    _stage_configs(sw, cli, sweep_eval)
    axes = raw.get("axis", [])
    if not isinstance(axes, list) or not (axes or sw.stages):
        raise GenlabError(f"{src}: a sweep needs at least one [[axis]] or [[stage]]")
    if axes:
        _variants(sw, raw, axes, base_cfg, common, cli, sweep_eval)
    sw.order = [s.name for s in sw.stages] + [v.run_name for v in sw.variants]
    runs = {s.name for s in sw.stages if s.is_run} | {v.name for v in sw.variants}
    sw.reference = raw.get("reference")
    for ref in {sw.reference} | {v.reference for v in sw.variants} | {s.reference for s in sw.stages}:
        if ref is not None and ref not in runs:
            raise GenlabError(f"{src}: reference = {ref!r} names no run stage or variant")
    return sw


def _settings(raw: dict, path: Path, overrides: list[str]) -> Sweep:
    """The sweep's own keys, checked: everything but its stages and variants."""
    src = str(path)
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise GenlabError(f"{src}: unknown sweep key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(TOP_KEYS))}")
    base = raw.get("base", {})
    if not isinstance(base, dict) or set(base) - {"preset", "overrides"}:
        raise GenlabError(f"{src}: [base] takes preset and overrides, got {', '.join(sorted(base)) if isinstance(base, dict) else base!r}")
    if not isinstance(base.get("overrides", []), list):
        raise GenlabError(f"{src}: base.overrides must be a list of 'key=value' strings")
    launcher = raw.get("launcher", "cpu")
    if launcher not in LAUNCHERS:
        raise GenlabError(f"{src}: unknown launcher '{launcher}'; valid: {', '.join(LAUNCHERS)}")
    seeds = _int_list(raw, "seeds", src) if "seeds" in raw else [0]
    if not seeds or len(set(seeds)) != len(seeds):
        raise GenlabError(f"{src}: seeds must be a non-empty list of distinct integers")
    lat = raw.get("loss_at_time", [])
    if not isinstance(lat, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in lat):
        raise GenlabError(f"{src}: loss_at_time must be a list of positive seconds, got {lat!r}")
    metrics = raw.get("metrics", [])
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise GenlabError(f"{src}: metrics must be a list of column names, e.g. [\"final_loss\", \"samples_per_s\", \"mfu\"]")
    for key in ("batched_seeds", "batched_variants"):
        if not isinstance(raw.get(key, False), bool):
            raise GenlabError(f"{src}: {key} must be true or false, got {raw[key]!r}")
        if raw.get(key) and (launcher == "torchrun" or raw.get("nproc", 1) != 1):
            raise GenlabError(f"{src}: {key} trains several runs in one process; it does not go with "
                              f"launcher = \"torchrun\" or nproc > 1")
    if not isinstance(raw.get("env", {}), dict):
        raise GenlabError(f"{src}: env must be a table of NAME = \"value\"")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name or safe_name(name) != name:
        raise GenlabError(f"{src}: name must be a non-empty folder name (letters, digits, . _ = + -), got {name!r}")
    batched_variants = raw.get("batched_variants", False)
    max_time = _positive(raw, "max_time", src, (int, float), None)
    return Sweep(name=name, path=path, preset=base.get("preset", "digits_flow"),
                 base_overrides=[str(x) for x in base.get("overrides", [])],
                 steps=_positive(raw, "steps", src, int, None), seeds=seeds, launcher=launcher,
                 nproc=_positive(raw, "nproc", src, int, 1), timeout=float(_positive(raw, "timeout", src, (int, float), 3600)),
                 loss_at=_int_list(raw, "loss_at", src, 1), metrics=metrics, description=str(raw.get("description", "")),
                 batched_seeds=raw.get("batched_seeds", False) or batched_variants, batched_variants=batched_variants,
                 cli=overrides, tables=check_tables(raw.get("tables", {}), src), env={k: str(v) for k, v in raw.get("env", {}).items()},
                 max_time=None if max_time is None else float(max_time))


def _run_config(sw: Sweep, preset: str, ovs: list[str], where: str):
    """A run's full config as the runner will start it (placeholders stand for paths under sweeps/<name>)."""
    on_cpu = ["train.device=cpu"] if sw.launcher == "cpu" else []
    try:
        return load_config(preset, on_cpu + [resolve(o, Path("sweeps") / sw.name, sw.stage_map) for o in ovs])
    except GenlabError as e:
        raise GenlabError(f"{sw.path}: {where}: {e}") from None


def _stage_configs(sw: Sweep, cli: list[str], sweep_eval: list[str]) -> None:
    """Every run stage's full config, checked; a run after a command stage may read what that command makes."""
    src, nominal = str(sw.path), Path("sweeps") / sw.name
    made = False
    for st in sw.stages:
        made |= not st.is_run
        if not st.is_run:
            continue
        _check_overrides(st.overrides, f"stage '{st.name}'", src, RESERVED[:3])  # one run: it may pick its seed
        st.overrides = st.overrides + cli
        sw.configs[st.name] = (_run_config(sw, st.preset, st.overrides, f"stage '{st.name}'"),
                               made or _reads_stage(st.overrides))
        st.eval = sweep_eval + st.eval
        if st.eval:
            _check_eval(st.eval, st.preset, st.overrides, f"stage '{st.name}'", src, sw.stages, nominal)


def _variants(sw: Sweep, raw: dict, axes: list, base_cfg, common: list[str], cli: list[str], sweep_eval: list[str]):
    """The axes crossed into variants x seeds, each variant's full config checked."""
    src, nominal, known = str(sw.path), Path("sweeps") / sw.name, [s.name for s in sw.stages]
    entries = [axis_entries(ax, i, src, base_cfg) for i, ax in enumerate(axes)]
    target, first = raw.get("fd_target"), [e[0] for e in entries[0]]
    names = [target] if isinstance(target, str) else [*target, *target.values()] if isinstance(target, dict) else [target]
    if target is not None and any(n not in first for n in names):
        raise GenlabError(f"{src}: fd_target = {target!r} must name variants of the first axis ({', '.join(first)}): "
                          f"one, or a table {{variant = its target}}, the runs whose final FD the others race to")
    seen = set(known)
    try:
        combos = combine(entries)
    except GenlabError as e:
        raise GenlabError(f"{src}: {e}") from None
    _varied(cli, combos, src)
    batchable = {key: n for n, (key, _, _) in VARIANT_KEYS.items()}
    batches = batch_templates(axes, entries, batchable) if sw.batched_variants else [None] * len(combos)
    for (label, ov, nproc, extra), batch in zip(combos, batches):
        if label in seen:
            raise GenlabError(f"{src}: two variants are both named '{label}'")
        seen.add(label)
        _check_overrides(ov, f"variant '{label}'", src)
        check_placeholders(ov, known, f"variant '{label}'", src)
        preset = extra["preset"] or sw.preset
        if sw.batched_seeds and nproc > 1:
            raise GenlabError(f"{src}: variant '{label}': nproc {nproc} does not go with batched_seeds (one process)")
        batch_ov = [f"train.seeds={','.join(map(str, sw.seeds))}"] if sw.batched_seeds else []
        if batch is not None:  # checked as the member of a batched-variants process it will be
            batch_ov += [f"train.{n}={v}" for n, v in batch["values"].items()]
            if member_name(batch["template"], batch["values"]) != label:  # a value whose text is not folder-safe
                batch = None
        ov = ov + cli  # batched: checked as its seeds will run
        sw.configs[label] = (_run_config(sw, preset, common + ov + batch_ov, f"variant '{label}'"), _reads_stage(common + ov))
        ev = sweep_eval + extra["eval"]
        if ev:
            _check_eval(ev, preset, common + ov, f"variant '{label}'", src, sw.stages, nominal)
        nproc = max(nproc, sw.nproc if sw.launcher == "torchrun" else 1)
        sw.variants.extend(Variant(label, common + ov + [f"train.seed={s}"], s, nproc, extra["preset"], list(ev),
                                   reference=extra["reference"] or raw.get("reference"), batch=batch) for s in sw.seeds)


def select(sw: Sweep, only: list[str]) -> Sweep:
    """Keep what `only` names: variants (by name, or run name with `-s<seed>`), stages (by name, by the name as written
    with or without its placeholders, by part) and the stages those need; without it, all but the optional stages."""
    wanted = {x for item in only for x in item.split(",") if x}
    if not wanted:
        sw.stages = [st for st in sw.stages if not st.optional]
        return sw

    def names(st):
        return {st.name, st.template, re.sub(r"\{[^}]*\}", "", st.template), st.part} - {None}
    keep = [v for v in sw.variants if v.name in wanted or v.run_name in wanted]
    picked = {st.name for st in sw.stages if wanted & names(st)}
    missing = wanted - {v.name for v in keep} - {v.run_name for v in keep} - set().union(*map(names, sw.stages))
    if missing:
        choices = sorted({v.name for v in sw.variants} | set().union(*map(names, sw.stages)))
        raise GenlabError(f"--only: no variant or stage named {', '.join(sorted(missing))}; choices: {', '.join(choices)}")
    sw.variants = keep
    # the stages the kept runs need (their teacher, its pairs), the stages they are compared with, and those named
    used = set().union(*(sw.needs(v) for v in keep)) | {v.reference for v in keep if v.reference} | picked
    used |= needs(sw.stages, [f"{{stage:{n}}}" for n in used])
    sw.stages = [st for st in sw.stages if st.name in used]
    return sw
