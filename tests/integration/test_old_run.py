"""A run folder written by main at 926cedf (before the floors move) still samples, evaluates and resumes.

The fixture (tests/fixtures/run_926cedf) is a 10-step tiny DiT on the embedded digits, made with that commit's
`genlab train`; run_926cedf_sample.png is what that commit's `genlab sample --n 20 --steps 4 --seed 0` drew from it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from PIL import Image

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def old_run(tmp_path):
    dst = tmp_path / "run_926cedf"
    shutil.copytree(FIXTURES / "run_926cedf", dst)
    return dst


def test_old_run_samples_the_same_pixels(old_run, tmp_path):
    out = tmp_path / "grid.png"
    r = run_cli("sample", str(old_run), "--n", "20", "--steps", "4", "--seed", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    new = np.asarray(Image.open(out), dtype=np.int16)
    ref = np.asarray(Image.open(FIXTURES / "run_926cedf_sample.png"), dtype=np.int16)
    assert new.shape == ref.shape
    assert np.abs(new - ref).max() <= 1  # float32 sampling, uint8 rounding: one level at most


def test_old_run_evaluates_to_its_recorded_numbers(old_run):
    recorded = json.loads((old_run / "summary.json").read_text())
    r = run_cli("eval", str(old_run), "eval.num_samples=50")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    # the evaluation the run made at its last step, repeated by today's code (same seed, samples and classifier)
    assert got["step"] == 10
    assert got["feature_fd"] == pytest.approx(recorded["feature_fd"], rel=2e-2)
    assert got["classifier_val_acc"] == pytest.approx(recorded["classifier_val_acc"], abs=0.02)


@pytest.mark.slow  # trains in a subprocess; the old run's sampling and eval stay in the fast subset
def test_old_run_resumes_and_extends(old_run):
    r = run_cli("train", "--resume", str(old_run), "train.steps=12", "eval.num_samples=20")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (old_run / "checkpoints" / "step_00000012.pt").exists()
    assert json.loads((old_run / "summary.json").read_text())["step"] == 12
