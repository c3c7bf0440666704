"""`genlab eval` / `sample` / `analyze` sample a run in its training precision, as the trainer's own evaluations
do (a bf16 run under bf16 autocast, a float32 run without): the same numbers as training-time evaluation."""
from __future__ import annotations

import pytest
import torch
from conftest import patch_everywhere, tiny_config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("prec")
    for p in ("bf16", "fp32"):
        Trainer(tiny_config(out, f"train.precision={p}", "train.device=cpu", "train.steps=2", f"train.name={p}",
                            "eval.num_samples=0", "log.sample_every=0", "log.ckpt_every=2")).fit()
    return out


def _autocast_seen(monkeypatch, target, attr, result=None):
    seen = []

    def spy(*a, **k):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return result if result is not None else ({} if attr == "evaluate" else None)
    patch_everywhere(monkeypatch, target, attr, spy)  # also where a module imported it by name
    return seen


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp32", None)])
def test_eval_of_a_run_samples_in_its_training_precision(runs, monkeypatch, precision, dtype):
    from genlab.families.image_flow.flow import FlowMatching
    from genlab.runs.load import evaluate_run
    seen = _autocast_seen(monkeypatch, FlowMatching, "evaluate")
    evaluate_run(runs / precision, overrides=["eval.num_samples=4"], device="cpu")
    assert seen == [dtype]
    assert not torch.is_autocast_enabled("cpu")  # and nothing leaks out


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp32", None)])
def test_sample_and_analyze_sample_in_the_training_precision(runs, monkeypatch, tmp_path, precision, dtype):
    from genlab.families.image_flow import render
    from genlab.lab.analyze import run as analyze_mod
    from genlab.runs.load import sample_to_file
    seen = _autocast_seen(monkeypatch, render, "sample_to_file")
    sample_to_file(runs / precision, n=2, out=tmp_path / "g.png", device="cpu")
    drawn = _autocast_seen(monkeypatch, analyze_mod, "generate")  # the name analyze binds (eval.image_quality's)
    from genlab.runs.load import load_run
    cfg, model, method, dev, _ = load_run(runs / precision, "cpu")
    from types import SimpleNamespace
    data = SimpleNamespace(spec={"num_classes": 4})
    analyze_mod.Sampler(cfg, method, model, data, dev, runs / precision).draw("t", torch.zeros(2, dtype=torch.long))
    from genlab.families.image_flow.flow import FlowMatching
    from genlab.runs.api import load_run as api_load_run
    api = _autocast_seen(monkeypatch, FlowMatching, "draw", torch.zeros(2, 1, 8, 8))  # Run.sample: as genlab sample
    api_load_run(runs / precision, "cpu").sample(n=2)
    assert seen == [dtype] and drawn == [dtype] and api == [dtype]


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp32", None)])
def test_the_quantization_gap_evaluates_float_and_quantized_in_the_training_precision(runs, monkeypatch, precision,
                                                                                        dtype):
    """Both sides of the gap as `genlab eval` scores the run and its `genlab quantize` copy."""
    pytest.importorskip("torchao")
    from genlab.families.image_flow.flow import FlowMatching
    from genlab.runs.quant_gap import quant_gap
    seen = _autocast_seen(monkeypatch, FlowMatching, "evaluate", {"feature_fd": 1.0})
    quant_gap(runs / precision, formats=("int8",), device="cpu")
    assert seen == [dtype, dtype]  # one checkpoint: float, then int8
    assert not torch.is_autocast_enabled("cpu")
