"""`genlab sweep`: a 3-variant CPU sweep where one variant diverges, the report, resume, and sweep-file errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from genlab.errors import GenlabError
from genlab.sweep.spec import load_sweep

from conftest import REPO, run_cli

TINY_SWEEP = REPO / "configs" / "sweeps" / "tiny_cpu.toml"


def _write_sweep(tmp_path, body: str, name="s") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(body)
    return p


BASE = TINY_SWEEP.read_text().split("[[axis]]")[0].replace('name = "tiny_cpu"', 'name = "failing"')


def test_sweep_runs_records_failure_reports_and_skips_finished(tmp_path):
    # lr=1e30 makes the third variant diverge (non-finite loss) while the other two finish
    p = _write_sweep(tmp_path, BASE + '\n[[axis]]\nkey = "optim.lr"\nvalues = [1e-3, 3e-3, 1e30]\n')
    r = run_cli("sweep", str(p), "--root", str(tmp_path / "sweeps"), timeout=900)
    d = tmp_path / "sweeps" / "failing"
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # one variant failed
    status = json.loads((d / "status.json").read_text())
    assert [status[k]["status"] for k in ("lr=0.001-s0", "lr=0.003-s0", "lr=1e+30-s0")] == ["finished", "finished", "failed"]
    assert status["lr=1e+30-s0"]["reason"].startswith("diverged")
    assert Path(status["lr=1e+30-s0"]["log"]).exists()

    # good rows carry the numbers of their own metrics.jsonl
    import csv
    rows = {row["variant"]: row for row in csv.DictReader(open(d / "results.csv"))}
    for name in ("lr=0.001", "lr=0.003"):
        recs = [json.loads(x) for x in (d / "runs" / f"{name}-s0" / "metrics.jsonl").read_text().splitlines()]
        train = [x for x in recs if "loss" in x]
        assert float(rows[name]["final_loss"]) == pytest.approx(train[-1]["loss"], rel=1e-12)
        steady = train[1:]
        assert float(rows[name]["samples_per_s"]) == pytest.approx(sum(x["samples_per_s"] for x in steady) / len(steady), rel=1e-9)
        assert float(rows[name]["loss@10"]) == pytest.approx([x for x in train if x["step"] == 10][0]["loss"], rel=1e-12)
        ev = [x for x in recs if "eval/sample_accuracy" in x][-1]
        assert float(rows[name]["sample_accuracy"]) == pytest.approx(ev["eval/sample_accuracy"])
        assert rows[name]["status"] == "finished"
    assert rows["lr=1e+30"]["status"] == "failed" and "diverged" in rows["lr=1e+30"]["reason"]
    md = (d / "report.md").read_text()
    assert "lr=1e+30" in md and "diverged" in md

    # the HTML report references every plot and sample grid, and they exist
    page = (d / "report.html").read_text()
    refs = re.findall(r'src="([^"]+)"', page)
    for f in ("loss_vs_step.png", "loss_vs_time.png", "throughput.png", "memory.png",
              "grids/lr=0.001.png", "grids/lr=0.003.png"):
        assert f in refs and (d / f).exists(), f

    # re-running skips finished (and failed) variants: their runs are not touched
    mtimes = {k: (d / "runs" / k / "summary.json").stat().st_mtime for k in ("lr=0.001-s0", "lr=0.003-s0")}
    r = run_cli("sweep", str(p), "--root", str(tmp_path / "sweeps"))
    assert "3 already done, 0 to run" in r.stdout
    assert mtimes == {k: (d / "runs" / k / "summary.json").stat().st_mtime for k in mtimes}

    # report rebuild and side-by-side comparison
    r = run_cli("sweep", "report", str(d))
    assert r.returncode == 0 and "lr=0.001" in r.stdout
    r = run_cli("sweep", "report", str(d), "--compare", str(d))
    assert r.returncode == 0 and "B/A" in r.stdout and "1.000" in r.stdout


def test_interrupted_variant_resumes(tmp_path):
    from genlab.sweep.runner import run_sweep
    p = _write_sweep(tmp_path, BASE.replace('name = "failing"', 'name = "resume"') + '\n[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
    sw = load_sweep(p)
    # simulate an interrupted variant: a run stopped at step 10 with a checkpoint, no summary of a finished run
    from genlab.config import load_config
    from genlab.train.trainer import Trainer
    v = sw.variants[0]
    runs = tmp_path / "sweeps" / "resume" / "runs"
    cfg = load_config(sw.preset, v.overrides + [f"train.out_dir={runs}", f"train.name={v.run_name}", "log.progress=false"])
    t = Trainer(cfg)
    t.stop_after = 10
    assert t.fit()["status"] == "interrupted"
    d = run_sweep(sw, root=tmp_path / "sweeps", progress=False)
    st = json.loads((d / "status.json").read_text())[v.run_name]
    assert st["status"] == "finished" and st["resumed"] is True
    steps = [json.loads(x)["step"] for x in (runs / v.run_name / "metrics.jsonl").read_text().splitlines()]
    assert steps[:2] == [5, 10] and steps[-2] == 20  # continued from 10, not restarted


@pytest.mark.parametrize("axis,needle", [
    ('[[axis]]\nkey = "optim.lr"\nvalues = []\n', "is empty"),
    ('[[axis]]\nkey = "optim.learning_rate"\nvalues = [1e-3]\n', "unknown config key 'optim.learning_rate'"),
    ('[[axis]]\nkey = "train.compile"\nvalues = ["turbo"]\n', "unknown compile 'turbo'"),
    ('[[axis]]\nzip = { "model.depth" = [2, 4], "model.dim" = [32] }\n', "different lengths"),
    ('', "at least one [[axis]]"),
])
def test_sweep_file_errors_fail_before_anything_runs(tmp_path, axis, needle):
    p = _write_sweep(tmp_path, BASE + "\n" + axis)
    r = run_cli("sweep", str(p), "--root", str(tmp_path / "sweeps"))
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "sweeps").exists()


def test_unknown_sweep_key(tmp_path):
    p = _write_sweep(tmp_path, 'stepz = 3\n' + BASE + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
    with pytest.raises(GenlabError, match="unknown sweep key"):
        load_sweep(p)


def test_grid_zip_and_variants_expand_with_seeds(tmp_path):
    p = _write_sweep(tmp_path, BASE.replace("seeds = [0]", "seeds = [0, 1]") +
                     '[[axis]]\nkey = "model.depth"\nvalues = [1, 2]\n'
                     '[[axis]]\nzip = { "optim.lr" = [1e-3, 2e-3], "optim.warmup_steps" = [1, 2] }\n'
                     '[[axis]]\nvariants = [{ name = "ema", overrides = ["train.ema_decay=0.99"] }, { name = "noema", overrides = ["train.ema_decay=0"] }]\n')
    sw = load_sweep(p)
    assert len(sw.variants) == 2 * 2 * 2 * 2
    names = {v.run_name for v in sw.variants}
    assert "depth=1-lr=0.001-warmup_steps=1-ema-s1" in names
    v = next(v for v in sw.variants if v.run_name == "depth=2-lr=0.002-warmup_steps=2-noema-s0")
    assert {"model.depth=2", "optim.lr=0.002", "optim.warmup_steps=2", "train.ema_decay=0", "train.seed=0"} <= set(v.overrides)


def test_constant_param_sizes_match_real_parameter_counts():
    from genlab.config import ModelConfig
    from genlab.models.dit import build_dit
    from genlab.sweep.sizes import constant_param_dims
    spec = {"kind": "image", "image_size": 32, "channels": 4, "num_classes": 1000}
    ref = sum(p.numel() for p in build_dit(ModelConfig(size="B"), spec).parameters())  # DiT-B/2: depth 12, dim 768
    for depth, dim, heads, err in constant_param_dims(12, 768, [4, 8, 12, 28], head_dim=32):
        n = sum(p.numel() for p in build_dit(ModelConfig(size="B", depth=depth, dim=dim, heads=heads), spec).parameters())
        assert abs(n - ref) / ref == pytest.approx(abs(err), abs=1e-12)
        assert abs(err) < 0.05, (depth, dim, err)
        assert dim % 32 == 0 and dim // heads == 32
