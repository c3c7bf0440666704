"""Markdown tables from the results of a suite's entries.

A table's `columns` is "bench" (the columns `genlab bench` prints), or a list whose items are "bench", a key, or
{key, label, fmt, scale, pct, curve, ratio, baseline, match, per, invert}. A key is looked up in the entry's result
(a bench JSON, a run's summary.json, the JSON `genlab eval` prints), dotted for nesting; failing that, the first
nested key that ends with it. "name" and "status" are the entry's. `curve = "eval/val_loss"` lists that metric of
the run's metrics.jsonl by step. A ratio column divides a key by the same key of a baseline row (the first row
whose fields equal `baseline`, and whose `match` fields equal this row's); `invert` divides the other way; `per`
divides again by one of the row's own fields (e.g. world size, for scaling). Without `columns` a table is the text
that its entries printed (`keep = "table"`: only markdown table lines; `tail = N`: the last N lines).
"""
from __future__ import annotations

import json
from pathlib import Path

BENCH_COLUMNS = [
    {"key": "switches.model", "label": "model"}, {"key": "switches.batch", "label": "batch"},
    {"key": "switches.precision", "label": "precision"}, {"key": "_compile", "label": "compile"},
    {"key": "switches.activation_checkpointing", "label": "AC"}, {"key": "switches.parallel", "label": "parallel"},
    {"key": "samples_per_s", "label": "samples/s", "fmt": ".0f"}, {"key": "tokens_per_s", "label": "tokens/s", "fmt": ".0f"},
    {"key": "step_ms", "label": "step ms", "fmt": ".1f"}, {"key": "_split", "label": "fwd/bwd/opt ms"},
    {"key": "mfu", "label": "MFU", "pct": True}, {"key": "peak_mem_gib", "label": "peak GiB", "fmt": ".2f"},
]


def lookup(row: dict, key: str):
    node = row
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            break
    else:
        return node
    for k, v in _flat(row).items():     # eval JSON nests its metrics: find "feature_fd" in "eval/feature_fd"
        if k == key or k.endswith("/" + key) or k.endswith("." + key):
            return v
    return None


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _bench_derived(row: dict) -> dict:
    s = row.get("switches") or {}
    if not s:
        return row
    comp = s.get("compile", "?") + ("+autograd" if s.get("compiled_autograd") else "") + ("+optim" if s.get("compile_optimizer") else "")
    if s.get("compile_mode", "default") != "default" and s.get("compile") != "off":
        comp += f" ({s['compile_mode']})"
    split = "/".join(fmt(row.get(k), ".1f") for k in ("fwd_ms", "bwd_ms", "opt_ms"))
    return {**row, "_compile": comp, "_split": split}


def fmt(v, spec: str | None = None) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if spec:
        return format(v, spec)
    return str(v) if isinstance(v, int) else format(v, ".4g")


def columns_of(spec) -> list[dict]:
    items = BENCH_COLUMNS if spec == "bench" else spec
    cols = []
    for c in items:
        if c == "bench":
            cols += BENCH_COLUMNS
        elif isinstance(c, str):
            cols.append({"key": c, "label": c})
        else:
            cols.append({"label": c.get("key") or c.get("ratio") or c.get("curve"), **c})
    return cols


def _cell(col: dict, row: dict, rows: list[dict]) -> str:
    if "curve" in col:
        return ", ".join(f"{s}: {v:.4g}" for s, v in row.get("_curves", {}).get(col["curve"], []))
    if "ratio" in col:
        return _ratio(col, row, rows)
    v = lookup(row, col["key"])
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = v * col.get("scale", 1)
        if col.get("pct"):
            return format(100 * v, col.get("fmt", ".1f")) + "%"
    return fmt(v, col.get("fmt"))


def _ratio(col: dict, row: dict, rows: list[dict]) -> str:
    key = col["ratio"]
    base = next((r for r in rows if all(str(lookup(r, k)) == str(v) for k, v in col.get("baseline", {}).items())
                 and all(lookup(r, m) == lookup(row, m) for m in col.get("match", []))), None)
    a, b = lookup(row, key), None if base is None else lookup(base, key)
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not a or not b:
        return ""
    v = b / a if col.get("invert") else a / b
    if col.get("per"):
        v /= lookup(row, col["per"]) or 1
    return format(100 * v, ".1f") + "%" if col.get("pct") else format(v, col.get("fmt", ".2f")) + "x"


def structured(table: dict, results: list[dict]) -> str:
    cols = columns_of(table["columns"])
    rows = [_bench_derived({"name": r["name"], "status": r["status"], **(r.get("data") or {}), "_curves": r.get("curves", {})})
            for r in results]
    lines = ["| " + " | ".join(c["label"] for c in cols) + " |", "|" + " --- |" * len(cols)]
    notes = []
    for r, row in zip(results, rows):
        if r.get("data") is None:
            notes.append(f"{r['name']}: {r['status']}")
            continue
        lines.append("| " + " | ".join(_cell(c, row, rows) for c in cols) + " |")
        if "recompiles" in row:       # a bench row: what the timing could hide
            notes.append(f"{r['name']}: graphs {row.get('graphs')}, recompiles {row.get('recompiles')}, "
                         f"host syncs/step {row.get('host_syncs_per_step')}")
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")


def text(table: dict, results: list[dict]) -> str:
    parts = []
    for r in results:
        body = r.get("text") or ""
        lines = body.splitlines()
        if table.get("keep") == "table":
            lines = [ln for ln in lines if ln.startswith("|")]
        if table.get("tail"):
            lines = lines[-int(table["tail"]):]
        head = f"{r['name']}: {r['status']}" if len(results) > 1 or r["status"] != "ok" else ""
        parts.append("\n".join(([head] if head else []) + lines))
    return "\n\n".join(p for p in parts if p.strip())


def loss_windows(table: dict, results: list[dict], window: int = 50) -> str:
    """Mean training loss per window of steps, one row a run; the first run is the reference (float8 vs bf16)."""
    curves = {r["name"]: dict(r.get("curves", {}).get("loss", [])) for r in results if r.get("curves")}
    if not curves:
        return "(no run logged a loss)"
    ref = next(iter(curves.values()))
    last = max(max(c) for c in curves.values() if c)
    wins = [(a, a + window) for a in range(0, last, window)]

    def mean(c, a, b):
        v = [x for s, x in c.items() if a < s <= b]
        return sum(v) / len(v) if v else float("nan")
    lines = ["| run | " + " | ".join(f"{a + 1}-{b}" for a, b in wins) + " | max rel. diff of window means |",
             "|" + " --- |" * (len(wins) + 2)]
    for name, c in curves.items():
        means = [mean(c, a, b) for a, b in wins]
        rel = max((abs(m - mean(ref, a, b)) / mean(ref, a, b) for m, (a, b) in zip(means, wins)), default=float("nan"))
        lines.append(f"| {name} | " + " | ".join(f"{m:.4f}" for m in means) + f" | {100 * rel:.2f}% |")
    return f"mean training loss per {window}-step window\n\n" + "\n".join(lines)


def render(name: str, table: dict, results: list[dict], header: str, appended: list[Path]) -> str:
    if table.get("format") == "loss_windows":
        body = loss_windows(table, results)
    elif "columns" in table:
        body = structured(table, results)
    else:
        body = text(table, results)
    out = f"# {table.get('title', name)}\n\n{header}\n\n{body}\n"
    for p in appended:
        if p.exists():
            out += f"\n## {p.parent.name}/{p.name}\n\n{p.read_text()}\n"
    return out


def read_json_tail(text: str):
    """The last line of a program's output that parses as a JSON object, or the whole output if it is one."""
    try:
        v = json.loads(text)
        return v if isinstance(v, dict) else None
    except ValueError:
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None
