"""Sweep reports: results.csv, report.md (one table) and report.html (the table, plots, sample grids).

Every number of a row comes from that run's own metrics.jsonl and summary.json. Throughput, MFU and
data-wait are averaged over the logged intervals after the first (which holds compilation and warm-up);
peak memory is the maximum; wall time is the run's own. Seeds of a variant are combined as mean ± std.
"""
from __future__ import annotations

import csv
import html
import json
import math
import shutil
from pathlib import Path

from genlab.train.metrics import read_metrics

COLUMNS = ["final_loss", "samples_per_s", "tokens_per_s", "mfu", "peak_mem_gib", "wall_time", "data_wait_frac"]


def run_row(run_dir: Path, loss_at=()) -> dict:
    """The numbers of one run, read from its own files."""
    run_dir = Path(run_dir)
    recs = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    train = [r for r in recs if "loss" in r and r.get("loss") is not None]
    row = {}
    if train:
        row["final_loss"] = train[-1]["loss"]
        row["steps"] = train[-1]["step"]
        steady = train[1:] or train
        for k in ("samples_per_s", "tokens_per_s", "mfu", "data_wait_frac"):
            vals = [r[k] for r in steady if r.get(k) is not None]
            row[k] = sum(vals) / len(vals) if vals else None
        mems = [r["peak_mem_gib"] for r in train if r.get("peak_mem_gib") is not None]
        row["peak_mem_gib"] = max(mems) if mems else None
        row["wall_time"] = train[-1].get("wall_time")
        for s in loss_at:
            at = [r for r in train if r["step"] <= s]
            row[f"loss@{s}"] = at[-1]["loss"] if at else None
    for r in recs:
        for k, v in r.items():
            if k.startswith("eval/") and isinstance(v, (int, float)):
                row[k[5:]] = v
    sp = run_dir / "summary.json"
    if sp.exists():
        s = json.loads(sp.read_text())
        row["wall_time"] = s.get("wall_time", row.get("wall_time"))
    return row


def _mean_std(vals):
    vals = [v for v in vals if isinstance(v, (int, float)) and v is not None and math.isfinite(v)]
    if not vals:
        return None, None
    m = sum(vals) / len(vals)
    sd = (sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else None
    return m, sd


def collect(d: Path) -> tuple[list[dict], list[str]]:
    """One row per variant (seeds combined) in sweep order, and the ordered metric columns."""
    d = Path(d)
    status = json.loads((d / "status.json").read_text()) if (d / "status.json").exists() else {}
    sweep_file = d / "sweep.toml"
    loss_at = []
    if sweep_file.exists():
        import tomllib
        loss_at = [int(s) for s in tomllib.loads(sweep_file.read_text()).get("loss_at", [])]
    groups: dict[str, list] = {}
    for run_name, st in status.items():
        groups.setdefault(st.get("variant", run_name), []).append((run_name, st))
    rows, metric_keys = [], []
    for variant, members in groups.items():
        per_seed = []
        for run_name, st in members:
            r = run_row(Path(st.get("run_dir", d / "runs" / run_name)), loss_at) if st.get("status") == "finished" else {}
            per_seed.append(r)
            for k in r:
                if k not in metric_keys and k != "steps":
                    metric_keys.append(k)
        statuses = [st.get("status") for _, st in members]
        reasons = sorted({st.get("reason") for _, st in members if st.get("reason")})
        row = {"variant": variant, "seeds": len(members), "status": "finished" if all(s == "finished" for s in statuses)
               else ("failed" if "failed" in statuses else statuses[0]), "reason": "; ".join(reasons),
               "runs": [rn for rn, _ in members], "logs": [st.get("log") for _, st in members]}
        for k in metric_keys:
            m, sd = _mean_std([r.get(k) for r in per_seed])
            row[k], row[k + "_std"] = m, sd
        rows.append(row)
    order = [c for c in COLUMNS if c in metric_keys] + [k for k in metric_keys if k.startswith("loss@")]
    order += [k for k in metric_keys if k not in order]
    return rows, order


def _fmt(v, sd=None, key=""):
    if v is None:
        return ""
    scale = 100 if key == "mfu" or key.endswith("accuracy") or key == "data_wait_frac" else 1
    spec = ".1f" if key in ("samples_per_s", "tokens_per_s", "wall_time") or scale == 100 else (".2f" if key == "peak_mem_gib" else ".4g")
    out = format(v * scale, spec) + ("%" if scale == 100 else "")
    if sd is not None:
        out += " ± " + format(sd * scale, spec)
    return out


HEADERS = {"final_loss": "final loss", "samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "mfu": "MFU",
           "peak_mem_gib": "peak mem GiB", "wall_time": "wall s", "data_wait_frac": "data wait"}


def markdown_table(rows, cols) -> str:
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)]
    head = ["variant", "seeds"] + [HEADERS.get(c, c) for c in cols] + ["status"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        st = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        cells = [r["variant"], str(r["seeds"])] + [_fmt(r.get(c), r.get(c + "_std"), c) for c in cols] + [st.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plots(d: Path, rows) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    curves = {}
    for r in rows:
        if r["status"] != "finished":
            continue
        run = d / "runs" / r["runs"][0]
        recs = [x for x in read_metrics(run) if "loss" in x]
        curves[r["variant"]] = recs
    for xkey, fname, xlabel in (("step", "loss_vs_step.png", "step"), ("wall_time", "loss_vs_time.png", "wall-clock s")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, recs in curves.items():
            ax.plot([x.get(xkey) for x in recs], [x["loss"] for x in recs], label=name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss (first seed)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(d / fname, dpi=110)
        plt.close(fig)
        files.append(fname)
    for key, fname, label in (("samples_per_s", "throughput.png", "samples/s"), ("peak_mem_gib", "memory.png", "peak memory GiB")):
        names = [r["variant"] for r in rows]
        vals = [r.get(key) or 0.0 for r in rows]
        fig, ax = plt.subplots(figsize=(7, 0.4 * len(names) + 1.2))
        ax.barh(names, vals, color=["tab:blue" if r["status"] == "finished" else "tab:red" for r in rows])
        ax.set_xlabel(label + ("" if any(vals) else " (not measured on this device)"))
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(d / fname, dpi=110)
        plt.close(fig)
        files.append(fname)
    return files


def write_report(d) -> Path:
    d = Path(d)
    rows, cols = collect(d)
    with open(d / "results.csv", "w", newline="") as f:
        keys = ["variant", "seeds", "status", "reason"] + [k for c in cols for k in (c, c + "_std")]
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    table = markdown_table(rows, cols)
    (d / "report.md").write_text(f"# Sweep {d.name}\n\n{table}\n\nPlots: loss_vs_step.png, loss_vs_time.png, "
                                 f"throughput.png, memory.png (in report.html).\n")
    plots = _plots(d, rows)
    grids = []
    (d / "grids").mkdir(exist_ok=True)
    for r in rows:
        src = d / "runs" / r["runs"][0] / "samples.png"
        if r["status"] == "finished" and src.exists():
            dst = d / "grids" / f"{r['variant']}.png"
            shutil.copyfile(src, dst)
            grids.append((r["variant"], f"grids/{dst.name}"))
    (d / "report.html").write_text(_html(d.name, rows, cols, plots, grids))
    return d / "report.md"


def _html(name, rows, cols, plots, grids) -> str:
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)]
    head = "".join(f"<th>{html.escape(HEADERS.get(c, c))}</th>" for c in ["variant", "seeds", *cols, "status"])
    body = []
    for r in rows:
        cells = [r["variant"], str(r["seeds"])] + [_fmt(r.get(c), r.get(c + "_std"), c) for c in cols]
        st = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        logs = " ".join(f'<a href="{html.escape(str(Path(lg).relative_to(Path(lg).parents[1])))}">log</a>'
                        for lg in r["logs"] if lg)
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + f"<td>{html.escape(st)} {logs}</td></tr>")
    imgs = "".join(f'<figure><img src="{p}"><figcaption>{p}</figcaption></figure>' for p in plots)
    gr = "".join(f'<figure><img src="{p}" style="image-rendering:pixelated"><figcaption>{html.escape(n)}</figcaption></figure>'
                 for n, p in grids)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>sweep {html.escape(name)}</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
            "figure{display:inline-block;margin:8px}</style></head><body>"
            f"<h1>Sweep {html.escape(name)}</h1><table><tr>{head}</tr>{''.join(body)}</table>"
            f"<h2>Plots</h2>{imgs}<h2>Samples (first seed)</h2>{gr}</body></html>")


def compare(d1, d2) -> str:
    """Two sweeps side by side: rows matched by variant name, columns A | B | B/A."""
    r1, c1 = collect(Path(d1))
    r2, c2 = collect(Path(d2))
    cols = [c for c in c1 if c in c2]
    by2 = {r["variant"]: r for r in r2}
    head = ["variant"] + [f"{HEADERS.get(c, c)} {x}" for c in cols for x in ("A", "B", "B/A")]
    lines = [f"A = {d1}, B = {d2}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in r1:
        o = by2.get(r["variant"], {})
        cells = [r["variant"]]
        for c in cols:
            a, b = r.get(c), o.get(c)
            ratio = f"{b / a:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else ""
            cells += [_fmt(a, None, c), _fmt(b, None, c), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
