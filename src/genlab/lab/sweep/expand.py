"""Axes -> variants: a grid (crossed keys), zipped keys, named variants, constant-parameter sizes, named variants
matched in parameters to a reference DiT; x seeds. Variant names (`depth=6-dim=1088`, `-s<seed>`): docs/sweeps.md.
"""
from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field

from genlab.config.tree import apply_overrides
from genlab.core.errors import GenlabError
from genlab.data.datasets import dataset_registry
from genlab.lab.match import constant_param_dims, matched_overrides, reference_params

AXIS_KEYS = {"key", "values", "zip", "variants", "type", "depths", "ref", "tolerance", "data"}
AXIS_TYPES = ("constant_params", "matched_params")
NAMED_KEYS = {"name", "overrides", "nproc", "preset", "eval", "reference"}


@dataclass
class Variant:
    name: str          # e.g. "precision=bf16-depth=6"
    overrides: list
    seed: int = 0
    nproc: int = 1
    preset: str | None = None   # a named variant's own preset (else the sweep's [base] preset)
    eval: list = field(default_factory=list)    # `genlab eval RUN ...` overrides after it trains (stages.py)
    stage: bool = False         # a [[stage]] run: one run, named without a seed suffix
    reference: str | None = None  # the run its quality-vs-NFE ratios divide by (report.py)
    # batched_variants: {"template": the name with {lr}/{weight_decay}/{ema_decay} where its batched values go,
    # "values": {train list key (lrs, ...): the value text}}; variants with one template share a process
    batch: dict | None = None

    @property
    def run_name(self) -> str:
        return self.name if self.stage else f"{self.name}-s{self.seed}"


def value_text(v) -> str:
    """A TOML value as the `key=value` override text the config parser reads back."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(value_text(x) for x in v) + "]"
    return str(v)


def _short(key: str) -> str:
    return key.split(".")[-1]


def safe_name(name: str) -> str:
    """Folder-safe: keeps letters, digits and . _ = + -."""
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name)


def _grid(ax, i, src):
    if "key" not in ax or not isinstance(ax["key"], str):
        raise GenlabError(f"{src}: axis {i} has values but no key = \"section.name\"")
    if not isinstance(ax["values"], list) or not ax["values"]:
        raise GenlabError(f"{src}: axis {i} ({ax['key']}) is empty")
    return [(f"{_short(ax['key'])}={value_text(v)}", [f"{ax['key']}={value_text(v)}"], 1, {}) for v in ax["values"]]


def _zip(ax, i, src):
    z = ax["zip"]
    if not isinstance(z, dict) or not z or any(not isinstance(v, list) or not v for v in z.values()):
        raise GenlabError(f"{src}: axis {i} (zip) is empty")
    lengths = {len(v) for v in z.values()}
    if len(lengths) != 1:
        raise GenlabError(f"{src}: axis {i} (zip) lists have different lengths {sorted(lengths)}")
    return [("-".join(f"{_short(k)}={value_text(v[j])}" for k, v in z.items()),
             [f"{k}={value_text(v[j])}" for k, v in z.items()], 1, {}) for j in range(lengths.pop())]


def _named(ax, i, src):
    vs = ax["variants"]
    if not isinstance(vs, list) or not vs:
        raise GenlabError(f"{src}: axis {i} (variants) is empty")
    out = []
    for v in vs:
        if (not isinstance(v, dict) or not isinstance(v.get("name"), str) or set(v) - NAMED_KEYS
                or not isinstance(v.get("overrides", []), list) or not isinstance(v.get("eval", []), list)
                or not isinstance(v.get("preset", ""), str)):
            raise GenlabError(f"{src}: axis {i}: each variant is {{ name = \"...\", overrides = [...] }} "
                              f"(and optional nproc, preset, eval = [...]), got {v!r}")
        nproc = v.get("nproc", 1)
        if not isinstance(nproc, int) or nproc < 1:
            raise GenlabError(f"{src}: axis {i}: variant '{v['name']}' has nproc {nproc!r}; give an integer >= 1")
        extra = {k: v[k] for k in ("preset", "eval", "reference") if k in v}
        out.append((v["name"], [str(x) for x in v.get("overrides", [])], nproc, extra))
    return out


def _matched_params(ax, i, src, base):
    """Named variants, each given the width (and MLP width) whose parameter count matches a plain DiT of the base
    config's size (genlab.lab.match), at the data shape `data = { image_size, channels, num_classes }`."""
    data = ax.get("data")
    if not isinstance(data, dict) or set(data) != {"image_size", "channels", "num_classes"}:
        raise GenlabError(f"{src}: axis {i} (matched_params) needs data = {{ image_size = S, channels = C, num_classes = K }}")
    spec = {"kind": "image", **{k: int(v) for k, v in data.items()}}
    tol = float(ax.get("tolerance", 0.02))
    target = reference_params(base.model, spec)
    out = []
    for label, ovs, nproc, extra in _named(ax, i, src):
        cfg = copy.deepcopy(base)
        try:
            apply_overrides(cfg, [o for o in ovs if o.startswith("model.")])
            out.append((label, ovs + matched_overrides(cfg.model, spec, target, tol), nproc, extra))
        except GenlabError as e:
            raise GenlabError(f"{src}: axis {i} (matched_params): variant '{label}': {e}") from None
    return out


def _constant_params(ax, i, src, base):
    if ax["type"] not in AXIS_TYPES:
        raise GenlabError(f"{src}: axis {i} has unknown type '{ax['type']}'; valid: {', '.join(AXIS_TYPES)}")
    depths, ref = ax.get("depths"), ax.get("ref", {})
    if not isinstance(depths, list) or not depths or not all(isinstance(d, int) and d > 0 for d in depths):
        raise GenlabError(f"{src}: axis {i} (constant_params) is empty: give depths = [positive integers]")
    if not isinstance(ref, dict) or not {"depth", "dim"} <= set(ref) or set(ref) - {"depth", "dim", "head_dim"}:
        raise GenlabError(f"{src}: axis {i} (constant_params) needs ref = {{ depth = D, dim = W }} (optional head_dim)")
    if int(ref["dim"]) % int(ref.get("head_dim", 64)):
        raise GenlabError(f"{src}: axis {i} (constant_params): ref.dim {ref['dim']} is not a multiple of head_dim {ref.get('head_dim', 64)}")
    tol = float(ax.get("tolerance", 0.05))
    ds = dataset_registry.spec(base.data.name)
    spec = None  # real datasets: their shape needs the data; the default latent shape is close enough to rank widths
    if ds.synthetic and ds.shape is not None:
        spec = {k: ds.shape(base.data)[k] for k in ("kind", "image_size", "channels", "num_classes")}
    rows = constant_param_dims(int(ref["depth"]), int(ref["dim"]), depths, head_dim=int(ref.get("head_dim", 64)),
                               model=base.model, spec=spec)
    bad = [f"depth {d}: {100 * e:+.1f}%" for d, _, _, e in rows if abs(e) > tol]
    if bad:
        raise GenlabError(f"{src}: axis {i} (constant_params): no width within {100 * tol:.0f}% of the reference "
                          f"parameter count for {', '.join(bad)}; pick other depths, a smaller ref.head_dim, or raise tolerance")
    return [(f"depth={d}-dim={w}", [f"model.depth={d}", f"model.dim={w}", f"model.heads={h}"], 1, {}) for d, w, h, _ in rows]


def axis_entries(ax: dict, i: int, src: str, base) -> list[tuple[str, list, int, dict]]:
    """One [[axis]] table -> [(label, overrides, nproc, {preset, eval} of a named variant)]; `base`: the base config
    (its model and data shape for the size axes)."""
    if not isinstance(ax, dict):
        raise GenlabError(f"{src}: axis {i} must be a table ([[axis]])")
    unknown = set(ax) - AXIS_KEYS
    if unknown:
        raise GenlabError(f"{src}: axis {i} has unknown key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(AXIS_KEYS))}")
    if ax.get("type") == "matched_params":  # named variants, each matched in size to the reference DiT
        if "variants" not in ax or "values" in ax or "zip" in ax:
            raise GenlabError(f"{src}: axis {i} (matched_params) takes variants = [...] (and data, tolerance)")
        return _matched_params(ax, i, src, base)
    kinds = [k for k in ("values", "zip", "variants", "type") if k in ax]
    if len(kinds) != 1:
        raise GenlabError(f"{src}: axis {i} must have exactly one of key+values, zip, variants or type = \"constant_params\"")
    if kinds[0] == "type":
        return _constant_params(ax, i, src, base)
    return {"values": _grid, "zip": _zip, "variants": _named}[kinds[0]](ax, i, src)


def combine(entries: list[list[tuple]]) -> list[tuple[str, list, int, dict]]:
    """Cross the axes: every combination -> (name, overrides, nproc, {preset, eval}). Duplicate names are an error
    upstream; two named variants with different presets cannot be crossed."""
    out = []
    for combo in itertools.product(*entries):
        name = safe_name("-".join(c[0] for c in combo))
        presets = {c[3]["preset"] for c in combo if c[3].get("preset")}
        if len(presets) > 1:
            raise GenlabError(f"variant '{name}' crosses named variants of different presets ({', '.join(sorted(presets))})")
        refs = [c[3]["reference"] for c in combo if c[3].get("reference")]
        extra = {"preset": presets.pop() if presets else None, "eval": [e for c in combo for e in c[3].get("eval", [])],
                 "reference": refs[-1] if refs else None}
        out.append((name, [o for c in combo for o in c[1]], max(c[2] for c in combo), extra))
    return out


def batch_templates(axes: list, entries: list[list[tuple]], batchable: dict) -> list[dict | None]:
    """batched_variants: for each combination (combine's order), the name template and values of its entries from
    grid axes (key + values) over a batchable key (`batchable`: config key -> train list key, e.g. optim.lr -> lrs),
    or None when it has none. Variants with one template differ only in those values: one batched process."""
    grid = [isinstance(ax, dict) and "values" in ax and ax.get("key") in batchable for ax in axes]
    out = []
    for combo in itertools.product(*entries):
        parts, values = [], {}
        for is_batch, (label, ovs, _, _), ax in zip(grid, combo, axes):
            if is_batch:
                parts.append(f"{_short(ax['key'])}={{{_short(ax['key'])}}}")
                values[batchable[ax["key"]]] = ovs[0].split("=", 1)[1]
            else:
                parts.append(safe_name(label))
        out.append({"template": "-".join(parts), "values": values} if values else None)
    return out
