"""Sweep files: parse, validate and expand into variants (each a list of config overrides).

A sweep file is TOML:

    name = "lr"                      # folder name under sweeps/
    steps = 200                      # sets train.steps for every variant
    seeds = [0, 1]                   # every variant runs once per seed; the report shows mean ± std
    launcher = "gpu"                 # cpu | gpu | per_gpu | torchrun
    nproc = 2                        # processes per variant for launcher=torchrun
    timeout = 900                    # seconds per variant
    loss_at = [100, 200]             # extra loss columns

    [base]
    preset = "bench_dit_b2"
    overrides = ["train.compile=off"]

    [[axis]]                         # a grid: the axes are crossed
    key = "train.precision"
    values = ["bf16", "fp32"]

    [[axis]]                         # zipped keys: one variant per position
    zip = { "model.depth" = [6, 12], "model.dim" = [1024, 768] }

    [[axis]]                         # named variants, each a set of overrides (optional nproc)
    variants = [{ name = "ddp2", overrides = ["train.parallel=ddp"], nproc = 2 }]

    [[axis]]                         # depth vs width at a constant parameter count
    type = "constant_params"
    depths = [6, 12, 24]
    ref = { depth = 12, dim = 768 }

Everything is checked (including every variant's full config) before anything runs.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from genlab.config import load_config, load_toml
from genlab.errors import GenlabError

TOP_KEYS = {"name", "steps", "seeds", "launcher", "nproc", "timeout", "loss_at", "metrics", "base", "axis", "description"}
AXIS_KEYS = {"key", "values", "zip", "variants", "type", "depths", "ref", "name"}
LAUNCHERS = ("cpu", "gpu", "per_gpu", "torchrun")


@dataclass
class Variant:
    name: str                      # e.g. "train.precision=bf16,model.depth=6" shortened to "precision=bf16-depth=6"
    overrides: list
    seed: int = 0
    nproc: int = 1

    @property
    def run_name(self) -> str:
        return f"{self.name}-s{self.seed}"


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


def _value_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(_value_text(x) for x in v) + "]"
    return str(v)


def _short(key: str) -> str:
    return key.split(".")[-1]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name)


def _axis_entries(ax: dict, i: int, src: str) -> list[tuple[str, list, int]]:
    """One axis -> [(label, overrides, nproc)]."""
    unknown = set(ax) - AXIS_KEYS
    if unknown:
        raise GenlabError(f"{src}: axis {i} has unknown key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(AXIS_KEYS))}")
    kinds = [k for k in ("values", "zip", "variants") if k in ax] + (["type"] if "type" in ax else [])
    if len(kinds) != 1:
        raise GenlabError(f"{src}: axis {i} must have exactly one of key+values, zip, variants or type=\"constant_params\"")
    if "values" in ax:
        if "key" not in ax:
            raise GenlabError(f"{src}: axis {i} has values but no key")
        if not isinstance(ax["values"], list) or not ax["values"]:
            raise GenlabError(f"{src}: axis {i} ({ax['key']}) is empty")
        return [(f"{_short(ax['key'])}={_value_text(v)}", [f"{ax['key']}={_value_text(v)}"], 1) for v in ax["values"]]
    if "zip" in ax:
        z = ax["zip"]
        if not isinstance(z, dict) or not z or any(not isinstance(v, list) or not v for v in z.values()):
            raise GenlabError(f"{src}: axis {i} (zip) is empty")
        lengths = {len(v) for v in z.values()}
        if len(lengths) != 1:
            raise GenlabError(f"{src}: axis {i} (zip) lists have different lengths {sorted(lengths)}")
        out = []
        for j in range(lengths.pop()):
            ov = [f"{k}={_value_text(v[j])}" for k, v in z.items()]
            out.append(("-".join(f"{_short(k)}={_value_text(v[j])}" for k, v in z.items()), ov, 1))
        return out
    if "variants" in ax:
        vs = ax["variants"]
        if not isinstance(vs, list) or not vs:
            raise GenlabError(f"{src}: axis {i} (variants) is empty")
        out = []
        for v in vs:
            if not isinstance(v, dict) or "name" not in v or set(v) - {"name", "overrides", "nproc"}:
                raise GenlabError(f"{src}: axis {i}: each variant needs name and overrides (and optional nproc), got {v!r}")
            out.append((str(v["name"]), [str(x) for x in v.get("overrides", [])], int(v.get("nproc", 1))))
        return out
    if ax["type"] != "constant_params":
        raise GenlabError(f"{src}: axis {i} has unknown type '{ax['type']}'; valid: constant_params")
    from genlab.sweep.sizes import constant_param_dims
    depths, ref = ax.get("depths"), ax.get("ref", {})
    if not depths:
        raise GenlabError(f"{src}: axis {i} (constant_params) is empty: give depths = [...]")
    if not {"depth", "dim"} <= set(ref):
        raise GenlabError(f"{src}: axis {i} (constant_params) needs ref = {{ depth = D, dim = W }}")
    rows = constant_param_dims(int(ref["depth"]), int(ref["dim"]), [int(d) for d in depths], head_dim=int(ref.get("head_dim", 64)))
    return [(f"depth={d}-dim={w}", [f"model.depth={d}", f"model.dim={w}", f"model.heads={h}"], 1) for d, w, h, _ in rows]


def load_sweep(path) -> Sweep:
    path = Path(path)
    if not path.exists():
        raise GenlabError(f"sweep file '{path}' not found")
    raw = load_toml(path)
    src = str(path)
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise GenlabError(f"{src}: unknown sweep key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(TOP_KEYS))}")
    base = raw.get("base", {})
    if set(base) - {"preset", "overrides"}:
        raise GenlabError(f"{src}: [base] takes preset and overrides, got {', '.join(sorted(base))}")
    launcher = raw.get("launcher", "cpu")
    if launcher not in LAUNCHERS:
        raise GenlabError(f"{src}: unknown launcher '{launcher}'; valid: {', '.join(LAUNCHERS)}")
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise GenlabError(f"{src}: seeds must be a non-empty list of integers")
    sw = Sweep(name=_safe(raw.get("name", path.stem)), path=path, preset=base.get("preset", "digits_flow"),
               base_overrides=[str(x) for x in base.get("overrides", [])], steps=raw.get("steps"), seeds=seeds,
               launcher=launcher, nproc=int(raw.get("nproc", 1)), timeout=float(raw.get("timeout", 3600)),
               loss_at=[int(s) for s in raw.get("loss_at", [])])
    axes = raw.get("axis", [])
    if not isinstance(axes, list) or not axes:
        raise GenlabError(f"{src}: a sweep needs at least one [[axis]]")
    entries = [_axis_entries(ax, i, src) for i, ax in enumerate(axes)]
    common = sw.base_overrides + ([f"train.steps={sw.steps}"] if sw.steps else [])
    names = set()
    for combo in itertools.product(*entries):
        label = _safe("-".join(c[0] for c in combo))
        ov = [o for c in combo for o in c[1]]
        nproc = max([c[2] for c in combo] + [sw.nproc if sw.launcher == "torchrun" else 1])
        if label in names:
            raise GenlabError(f"{src}: two variants are both named '{label}'")
        names.add(label)
        try:  # the variant's full config must be valid before anything runs
            load_config(sw.preset, common + ov)
        except GenlabError as e:
            raise GenlabError(f"{src}: variant '{label}': {e}") from None
        for seed in seeds:
            sw.variants.append(Variant(label, common + ov + [f"train.seed={seed}"], seed, nproc))
    return sw
