"""What a run cost to make, in device-seconds (eval_nfe.json "cost"; docs/few_step.md): its training, the generated
data it reads (once per chain) and, recursively, its teacher's."""
from __future__ import annotations

import json
from pathlib import Path

from genlab.config.tree import load_toml
from genlab.runtime.metrics import read_metrics, train_records


def _read_json(p: Path) -> dict:
    try:
        return json.loads(p.read_text()) if p.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def generated_data(cfg: dict, seen: set | None = None) -> list[dict]:
    """Folders the config names that were generated with a recorded cost (meta.json "seconds"), skipping those in
    `seen` (resolved paths already counted further down a teacher chain) and adding the rest to it."""
    out, seen = [], set() if seen is None else seen
    for section in cfg.values():
        for v in (section.values() if isinstance(section, dict) else ()):
            if not isinstance(v, str) or not v:
                continue
            key = str(Path(v).resolve())
            if key in seen:
                continue
            # the part of its meta.json that records a generation cost: the top level, or the section a generator
            # writes under its own name (`genlab data generate pairs`: meta["pairs"])
            meta = _read_json(Path(v) / "meta.json")
            meta = next((r for r in (meta, *(x for x in meta.values() if isinstance(x, dict)))
                         if isinstance(r.get("seconds"), (int, float))), {})
            if meta:
                seen.add(key)
                world = int(meta.get("world", 1) or 1)
                out.append({"path": v, "seconds": float(meta["seconds"]), "device": meta.get("device", "unknown"),
                            "world": world, "gpu_seconds": float(meta["seconds"]) * world})
    return out


def run_cost(run_dir, _seen=None, _data_seen=None) -> dict:
    """One run's own cost and, nested under "teacher", its teacher's (None without one; {"path", "missing": True}
    where the teacher run folder cannot be found from here). A generated dataset is counted once per chain, by the
    first run that names it (reflow's pairs feed both the 2-rectified flow and its distilled student)."""
    run_dir = Path(run_dir)
    seen = set() if _seen is None else _seen
    data_seen = set() if _data_seen is None else _data_seen
    seen.add(run_dir.resolve())
    summary = _read_json(run_dir / "summary.json")
    recs = train_records(read_metrics(run_dir))
    secs = float(recs[-1]["wall_time"]) if recs and recs[-1].get("wall_time") is not None else summary.get("wall_time")
    world = int(summary.get("world", 1) or 1)
    cfg = load_toml(run_dir / "config.toml")
    data = generated_data(cfg, data_seen)
    share = world / int(summary.get("batched_seeds") or 1)  # N batched seeds shared the device's time
    own = (secs or 0.0) * share + sum(d["gpu_seconds"] for d in data)
    res = {"run": str(run_dir), "device": summary.get("device", "unknown"), "world": world, "train_seconds": secs,
           "train_gpu_seconds": None if secs is None else secs * share, "data": data, "own_gpu_seconds": own,
           "teacher": None}
    tpath = (cfg.get("method") or {}).get("teacher")
    if tpath:  # a run folder, a checkpoint (RUN/checkpoints/step_N.pt) or an export (RUN/model.safetensors)
        tdir = next((c for c in (Path(tpath), Path(tpath).parent, Path(tpath).parent.parent)
                     if (c / "config.toml").is_file()), None)
        if tdir is None or tdir.resolve() in seen:
            res["teacher"] = {"path": tpath, "missing": True}
        else:
            res["teacher"] = run_cost(tdir, seen, data_seen)
    return res


def cost_summary(run_dir) -> dict:
    """The flat numbers of a table: this run's cost on top of its root teacher (the first run of the teacher chain
    that has no teacher), in device-seconds, and that as a share of the root teacher's training."""
    c = run_cost(run_dir)
    chain = [c]
    while chain[-1].get("teacher") and not chain[-1]["teacher"].get("missing"):
        chain.append(chain[-1]["teacher"])
    root, last_teacher = chain[-1] if len(chain) > 1 else None, chain[-1].get("teacher") or {}
    students = chain[:-1] if root is not None else chain
    extra = sum(x["own_gpu_seconds"] for x in students)
    out = {"device": c["device"], "world": c["world"], "train_gpu_seconds": c["train_gpu_seconds"],
           "data_gpu_seconds": sum(d["gpu_seconds"] for d in c["data"]), "gpu_seconds": extra,
           "teacher_run": root["run"] if root else None, "teacher_gpu_seconds": root["own_gpu_seconds"] if root else None,
           "teacher_device": root["device"] if root else None,
           "teacher_missing": last_teacher.get("path") if last_teacher.get("missing") else None}
    out["pct_of_teacher"] = 100 * extra / root["own_gpu_seconds"] if root and root["own_gpu_seconds"] else None
    out["chain"] = c
    return out


def cost_line(s: dict) -> str:
    """One line for the table's header."""
    def secs(v):
        return "?" if v is None else f"{v:.1f}"
    parts = [f"cost: {secs(s['gpu_seconds'])} device-s on {s['device']} x{s['world']}"]
    if s["data_gpu_seconds"]:
        parts.append(f"of which generated data {secs(s['data_gpu_seconds'])} s")
    if s["teacher_run"]:
        parts.append(f"on top of teacher {s['teacher_run']}: {secs(s['teacher_gpu_seconds'])} device-s on "
                     f"{s['teacher_device']} ({s['pct_of_teacher']:.1f}% of it)" if s["pct_of_teacher"] is not None else
                     f"on top of teacher {s['teacher_run']} (training time unknown)")
    elif s["teacher_missing"]:
        parts.append(f"teacher {s['teacher_missing']} not found from here: its cost is not counted")
    return "; ".join(parts)
