"""The public Python API: the README's notebook example runs, imports stay light, text runs sample text."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO, TINY

import genlab
import genlab.runs.api
from genlab.core.errors import GenlabError


def _tiny(tmp_path) -> dict:
    return dict(o.split("=", 1) for o in TINY + [f"train.out_dir={tmp_path}", "eval.classifier_epochs=2"])


def test_readme_example_trains_loads_and_samples(tmp_path, monkeypatch):
    block = re.search(r"### Python API.*?```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    real = genlab.runs.api.load_config
    # the README's config, shrunk to seconds and kept out of the working folder
    monkeypatch.setattr(genlab.runs.api, "load_config",
                        lambda preset, overrides: real(preset, {**overrides, **_tiny(tmp_path), "train.steps": 10}))
    scope = {}
    exec(compile(block, "README.md", "exec"), scope)
    s, run, images = scope["summary"], scope["run"], scope["images"]
    assert s["status"] == "finished" and s["step"] == 10 and "sample_accuracy" in s
    assert run.step == 10 and run.config.model.dim == 32 and not run.model.training
    assert images.shape == (10, 1, 8, 8) and images.device.type == "cpu"
    assert images.min() >= -1 and images.max() <= 1 and images.std() > 0.05
    again = run.sample(n=10, class_id=7)  # seeded: the same call gives the same images
    assert torch.equal(images, again) and not torch.equal(images, run.sample(n=10, class_id=7, seed=1))
    with pytest.raises(GenlabError, match="classes 0..9"):
        run.sample(n=2, class_id=10)
    with pytest.raises(GenlabError, match="did you mean 'class_id'"):
        run.sample(n=2, clas_id=3)


@pytest.mark.slow
def test_text_run_samples_token_ids_and_text(tmp_path):
    over = {**_tiny(tmp_path), "train.steps": 4, "model.dim": 32, "model.depth": 1, "data.seq_len": 32,
            "eval.num_samples": 4}
    summary = genlab.train(genlab.load_config("text_ar", over))
    run = genlab.load_run(summary["run_dir"])
    ids = run.sample(n=3, length=12)
    assert ids.dtype == torch.long and ids.shape == (3, 12) and int(ids.max()) < run.spec["vocab_size"]
    texts = run.sample(n=2, prompt="ROMEO:", length=5, text=True)
    assert len(texts) == 2 and all(t.startswith("ROMEO:") and len(t) == len("ROMEO:") + 5 for t in texts)


@pytest.mark.slow
def test_image_bytes_run_samples_images_without_a_sampler_callback(tmp_path):
    # the Sparse Transformer's sample() has no per-step callback: progress falls back to batches
    cfg = genlab.load_config("sparse_tiny_cpu", {"train.steps": 2, "train.out_dir": str(tmp_path), "eval.num_samples": 0})
    run = genlab.load_run(genlab.train(cfg)["run_dir"])
    images = run.sample(n=3)
    assert images.shape == (3, 1, 8, 8) and images.min() >= -1 and images.max() <= 1
    assert len(torch.unique(images)) > 1


def test_load_config_takes_a_list_or_a_typed_dict_and_rejects_bad_keys():
    a = genlab.load_config("digits_flow", ["train.steps=7", "train.skip_nonfinite=true"])
    b = genlab.load_config("digits_flow", {"train.steps": 7, "train.skip_nonfinite": True})
    assert a == b and a.train.steps == 7
    with pytest.raises(GenlabError, match="valid keys of \\[train\\]"):
        genlab.load_config(None, {"train.stepz": 1})
    with pytest.raises(GenlabError, match="list of 'key=value'"):
        genlab.load_config(None, "train.steps=1")


def _python_with_src(code: str):
    """Run `python -c code` in a fresh interpreter that imports this checkout's genlab."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_building_the_cli_parser_does_not_import_torch():
    """A mistyped command line is answered before torch loads: every sub-command's parser is built without it."""
    code = ("import sys; from genlab.cli import build_parser; p = build_parser(); "
            "assert 'bench' in p._subparsers._group_actions[0].choices, 'no bench command'; "
            "print('torch' in sys.modules)")
    r = _python_with_src(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False", "building the parser imported torch"


def test_import_genlab_is_light_and_train_is_a_plain_function_after_the_trainer_is_imported():
    code = ("import sys, genlab; assert 'torch' not in sys.modules, 'torch imported'; "
            "import genlab.training.trainer, types; assert isinstance(genlab.train, types.FunctionType), 'not a plain function'; "
            # torch._dynamo costs ~2 s of every CLI start; only compiling (or a sparse model) may pull it in
            "assert 'torch._dynamo' not in sys.modules, 'dynamo imported'; print(genlab.load_run.__module__)")
    r = _python_with_src(code)
    assert r.returncode == 0 and r.stdout.strip() == "genlab.runs.api", r.stderr
