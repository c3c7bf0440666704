"""A sweep's tables of stage rows (the benchmark suites' tables): each [tables.NAME] of the sweep file is one table
of the report, its rows the stages that name it, in sweep order; columns, ratios and curves: docs/sweeps.md.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from genlab.core.errors import GenlabError
from genlab.core.tables import markdown_table
from genlab.lab.bench import BENCH_HEAD, bench_cells
from genlab.runtime.metrics import read_metrics

TABLE_KEYS = {"title", "columns", "keep", "tail", "format", "append"}
COLUMN_KEYS = {"key", "label", "fmt", "scale", "pct", "curve", "ratio", "baseline", "match", "per", "invert"}


def check_tables(tables, src: str) -> dict:
    """[tables.NAME] of a sweep file, checked: their keys and their columns' keys."""
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise GenlabError(f"{src}: tables are [tables.NAME] tables with {', '.join(sorted(TABLE_KEYS))}")
    for name, t in tables.items():
        cols = t.get("columns", [])
        bad = set(t) - TABLE_KEYS or (cols != "bench" and not isinstance(cols, list)) or t.get("format", "loss_windows") != "loss_windows"
        bad = bad or [c for c in cols if not (c == "bench" or isinstance(c, str) or isinstance(c, dict) and c.keys() <= COLUMN_KEYS)]
        if bad:
            raise GenlabError(f"{src}: [tables.{name}]: takes {', '.join(sorted(TABLE_KEYS))}; columns are \"bench\", keys "
                              f"or {{{', '.join(sorted(COLUMN_KEYS))}}}; format = \"loss_windows\"")
    return tables


def read_json(text: str):
    """The JSON object a program's output ends with (one line, or printed over several), else None."""
    lines = text.rstrip().splitlines()
    for i in reversed([i for i, line in enumerate(lines) if line.lstrip().startswith("{")]):
        try:
            v = json.loads("\n".join(lines[i:]))
            return v if isinstance(v, dict) else None
        except ValueError:
            continue
    return None


def _curves(run: Path) -> dict:
    """Every logged metric of a run by step: {"loss": [(step, value), ...], "eval/val_loss": [...]}."""
    curves: dict = {}
    for r in read_metrics(run) if (run / "metrics.jsonl").exists() else []:
        for k, v in r.items():
            if k != "step" and "step" in r and isinstance(v, (int, float)) and not isinstance(v, bool):
                curves.setdefault(k, []).append((r["step"], v))
    return curves


def _result(d: Path, name: str, rec: dict) -> dict:
    status = rec.get("status", "?") + (f": {rec['reason']}" if rec.get("reason") else "")
    if rec.get("stage") == "run":
        summary = d / "runs" / name / "summary.json"
        data = json.loads(summary.read_text()) if summary.exists() else None
        return {"name": name, "status": status, "data": data, "text": "", "curves": _curves(d / "runs" / name)}
    out, js = d / "logs" / f"{name}.out", d / "logs" / f"{name}.json"
    text = out.read_text(errors="replace") if out.exists() else ""
    data = json.loads(js.read_text()) if js.exists() else read_json(text)
    return {"name": name, "status": status, "data": data, "text": text, "curves": {}}


def lookup(row: dict, key: str):
    node = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return node
    flat = _flat(row)  # eval's JSON nests its metrics: "feature_fd" is found as "eval/feature_fd"
    return next((v for k, v in flat.items() if k == key or k.endswith(("/" + key, "." + key))), None)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def fmt(v, spec: str | None = None) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return format(v, spec) if spec else str(v) if isinstance(v, int) else format(v, ".4g")


def _columns(spec) -> list[dict]:
    cols = []
    for c in (["bench"] if spec == "bench" else spec):
        if c == "bench":
            cols += [{"bench": i, "label": label} for i, label in enumerate(BENCH_HEAD)]
        else:
            cols.append({"key": c, "label": c} if isinstance(c, str) else {"label": c.get("key") or c.get("ratio") or c.get("curve"), **c})
    return cols


def _cell(col: dict, row: dict, rows: list[dict]) -> str:
    if "bench" in col:
        return str(bench_cells(row)[col["bench"]]) if isinstance(row.get("switches"), dict) else "n/a"
    if "curve" in col:
        return ", ".join(f"{s}: {v:.4g}" for s, v in row["_curves"].get(col["curve"], []))
    if "ratio" in col:
        return _ratio(col, row, rows)
    v = lookup(row, col["key"])
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = v * col.get("scale", 1)
        if col.get("pct"):
            return format(100 * v, col.get("fmt", ".1f")) + "%"
    return fmt(v, col.get("fmt"))


def _ratio(col: dict, row: dict, rows: list[dict]) -> str:
    base = next((r for r in rows if all(str(lookup(r, k)) == str(v) for k, v in col.get("baseline", {}).items())
                 and all(lookup(r, m) == lookup(row, m) for m in col.get("match", []))), None)
    a, b = lookup(row, col["ratio"]), None if base is None else lookup(base, col["ratio"])
    if not all(isinstance(x, (int, float)) and x for x in (a, b)):
        return ""
    v = (b / a if col.get("invert") else a / b) / ((lookup(row, col["per"]) or 1) if col.get("per") else 1)
    return format(100 * v, ".1f") + "%" if col.get("pct") else format(v, col.get("fmt", ".2f")) + "x"


def structured(spec: dict, results: list[dict]) -> str:
    """A row per stage that measured something, the others (and a bench row's compile counts) as notes below."""
    cols = _columns(spec["columns"])
    rows = [{"name": r["name"], "status": r["status"], **(r["data"] or {}), "_curves": r["curves"]} for r in results]
    body, notes = [], []
    for r, row in zip(results, rows):
        if r["data"] is None:
            notes.append(f"{r['name']}: {r['status']}")
            continue
        body.append([_cell(c, row, rows) for c in cols])
        if "recompiles" in row:  # a bench row: what the timing could hide
            notes.append(f"{r['name']}: graphs {row.get('graphs')}, recompiles {row.get('recompiles')}, "
                         f"host syncs/step {row.get('host_syncs_per_step')}")
    return markdown_table([c["label"] for c in cols], body) + ("\n\n" + "\n".join(notes) if notes else "")


def text(spec: dict, results: list[dict]) -> str:
    parts = []
    for r in results:
        lines = r["text"].splitlines()
        if spec.get("keep") == "table":
            lines = [x for x in lines if x.startswith("|")]
        if spec.get("tail"):
            lines = lines[-int(spec["tail"]):]
        head = [f"{r['name']}: {r['status']}"] if len(results) > 1 or r["status"] != "finished" else []
        parts.append("\n".join(head + lines))
    return "\n\n".join(p for p in parts if p.strip())


def loss_windows(results: list[dict], window: int = 50) -> str:
    """Mean training loss per window of steps, one row a run; the first run is the reference (float8 vs bf16)."""
    curves = {r["name"]: dict(r["curves"]["loss"]) for r in results if r["curves"].get("loss")}
    if not curves:
        return "(no run logged a loss)"
    ref = next(iter(curves.values()))
    wins = [(a, a + window) for a in range(0, max(max(c) for c in curves.values()), window)]

    def mean(c, a, b):
        v = [x for s, x in c.items() if a < s <= b]
        return sum(v) / len(v) if v else float("nan")
    rows = []
    for name, c in curves.items():
        means = [mean(c, a, b) for a, b in wins]
        rel = max((abs(m - mean(ref, a, b)) / mean(ref, a, b) for m, (a, b) in zip(means, wins)), default=float("nan"))
        rows.append([name, *(f"{m:.4f}" for m in means), f"{100 * rel:.2f}%"])
    head = ["run", *(f"{a + 1}-{b}" for a, b in wins), "max rel. diff of window means"]
    return f"mean training loss per {window}-step window\n\n" + markdown_table(head, rows)


def render(d: Path, tables: dict, status: dict) -> str:
    """Every table that has rows, under its title, with the files it appends."""
    by_table: dict = {}
    for name, rec in status.items():
        if rec.get("table"):
            by_table.setdefault(rec["table"], []).append(_result(d, name, rec))
    parts = []
    for name, spec in tables.items():
        results = by_table.get(name)
        if not results:
            continue
        body = (loss_windows(results) if spec.get("format") == "loss_windows" else
                structured(spec, results) if "columns" in spec else text(spec, results))
        parts.append(f"## {spec.get('title', name)}\n\n{body}" + "".join(_append(d, p, status) for p in spec.get("append", [])))
    return "\n\n".join(parts)


def _append(d: Path, pattern: str, status: dict) -> str:
    def out(m):
        return str(d / ("runs" if status.get(m.group(1), {}).get("stage") == "run" else "stages") / m.group(1))
    p = Path(re.sub(r"\{stage:([^{}]*)\}", out, pattern))
    return f"\n\n### {p.parent.name}/{p.name}\n\n{p.read_text().strip()}" if p.is_file() else ""
