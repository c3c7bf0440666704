"""Throughput, MFU and memory accounting, and the run's metric sinks (JSONL, TensorBoard, Weights & Biases)."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
from pathlib import Path

import torch

from genlab.core.errors import GenlabError

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s. MFU is always reported against the bf16
# peak so that every precision variant is measured on the same scale.
PEAK_BF16_FLOPS = {
    "H200": 989e12, "H100 SXM": 989e12, "H100 80GB HBM3": 989e12, "H100 NVL": 835e12, "H100 PCIe": 756e12,
    "H100": 989e12, "GH200": 989e12, "B200": 2250e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
    "A10G": 70e12, "A10": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12,
}


def peak_flops(device: torch.device) -> float | None:
    """bf16 dense peak of this device, or GENLAB_PEAK_FLOPS; None on CPU (no MFU there)."""
    if os.environ.get("GENLAB_PEAK_FLOPS"):
        return float(os.environ["GENLAB_PEAK_FLOPS"])
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def peak_memory_gib(device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def start_wandb(run_dir: Path, project: str, config: dict | None):
    """A W&B run named after the run folder. Its id is the folder name, so `genlab train --resume` continues
    the same W&B run; WANDB_MODE=offline writes it under RUN/wandb/ for a later `wandb sync`."""
    try:
        import wandb
    except ImportError:
        raise GenlabError('log.wandb=true needs the wandb package: pip install "genlab[wandb]"') from None
    name = Path(run_dir).name
    return wandb.init(project=project, name=name, id=re.sub(r"[^\w.-]", "-", name), resume="allow",
                      dir=str(run_dir), config=config)


class MetricsLog:
    """Appends metric records to metrics.jsonl, TensorBoard and (log.wandb) Weights & Biases."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, enabled: bool = True, wandb_project: str | None = None,
                 config: dict | None = None):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.wandb = start_wandb(run_dir, wandb_project, config) if enabled and wandb_project else None
        self.tb = None
        if enabled and tensorboard:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(Path(run_dir) / "tb"))
        self._f = open(self.path, "a") if enabled else None

    def write(self, record: dict):
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()
        if self.tb is not None:
            step = record["step"]
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in clean.items() if k != "step" and isinstance(v, (int, float))},
                           step=record["step"])

    def close(self):
        if self._f:
            self._f.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def read_metrics(run_dir) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def train_records(recs: list[dict]) -> list[dict]:
    """The training-log records of one run as one history. A resumed run appends to metrics.jsonl and
    restarts its clock: records the resumed process logged again supersede the old ones, and its
    wall_time continues from where the earlier process stopped."""
    out, offset, prev_wall = [], 0.0, None
    for r in recs:
        if "loss" not in r or r.get("loss") is None:
            continue
        wall = r.get("wall_time")
        # a new process: its clock restarted (resume), or it starts again at its checkpoint's step
        restart = not out or (out and r["step"] <= out[-1]["step"]) or (wall is not None and prev_wall is not None and wall < prev_wall)
        if out and restart:
            offset = out[-1].get("wall_time") or 0.0
            out = [x for x in out if x["step"] < r["step"]]
        prev_wall = wall
        out.append({**r, "wall_time": None if wall is None else wall + offset, "_warm": restart})
    return out
