"""Optional Weights & Biases logging (log.wandb=true), next to metrics.jsonl and TensorBoard."""
from __future__ import annotations

import sys
import time

import pytest
from conftest import tiny_config

from genlab.core.errors import GenlabError
from genlab.runtime.metrics import read_metrics
from genlab.training.seeds import train


def test_wandb_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
    cfg = tiny_config(tmp_path, "train.steps=2", "log.wandb=true")
    with pytest.raises(GenlabError, match=r'pip install "genlab\[wandb\]"'):
        train(cfg)


def test_wandb_offline_run_gets_the_same_metrics_as_the_jsonl(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged, real_init = [], wandb.init

    def spy_init(**kw):  # the real offline run, with its log calls recorded
        run = real_init(**kw)
        real_log = run.log
        run.log = lambda data, step=None, **k: (logged.append((step, dict(data))), real_log(data, step=step, **k))[1]
        return run

    monkeypatch.setattr(wandb, "init", spy_init)
    cfg = tiny_config(tmp_path, "train.steps=6", "log.every=3", "log.wandb=true", "log.wandb_project=genlab-test",
                      "log.tensorboard=true", "eval.num_samples=0")
    s = train(cfg)
    run_dir = tmp_path / s["run_dir"].split("/")[-1]
    jsonl = [r for r in read_metrics(run_dir) if "loss" in r]
    assert [(st, d["loss"]) for st, d in logged if "loss" in d] == [(r["step"], r["loss"]) for r in jsonl] and len(jsonl) == 2
    assert list(run_dir.glob("tb/events.out.tfevents.*"))  # TensorBoard still written alongside
    # the offline run is on disk under RUN/wandb/, its id the run folder's name, with the genlab config attached
    (record,) = (run_dir / "wandb").glob(f"offline-run-*-{run_dir.name}/run-{run_dir.name}.wandb")
    for _ in range(100):  # wandb-core finishes writing the file a moment after run.finish() returns
        data = record.read_bytes()
        if b"samples_per_s" in data:
            break
        time.sleep(0.1)
    assert b"genlab-test" in data and b"wandb_project" in data and b"samples_per_s" in data
