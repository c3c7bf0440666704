"""The cached-block sampler as a sampling option of flow runs (method.cache_blocks / method.cache_every): the method's
samples against the analysis's cached_blocks context (tested against plain blocks in test_analyze.py), `auto` read
from a run's analysis by genlab eval / sample, and bad values refused in one line before any work."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, cli_in_process
from conftest import ANALYZE_BACKBONES as BACKBONES
from conftest import ANALYZE_SPEC as SPEC
from conftest import analyze_model as _model
from conftest import analyze_sample as _sample

from genlab.sampling.block_cache import cached_blocks


def _with_cache(name, blocks, every=2):
    """A second flow method for _model(name)'s backbone, with method.cache_blocks set."""
    from genlab.config.tree import load_config
    from genlab.training.step import build_model_and_method
    name, *extra = name.split()
    cfg = load_config("digits_flow", TINY + ["model.depth=4", f"model.name={name}", *extra,
                                             f"method.cache_blocks={blocks}", f"method.cache_every={every}"])
    return build_model_and_method(cfg, SPEC)[1]


@pytest.mark.parametrize("name", BACKBONES)
def test_method_cache_blocks_samples_as_the_cached_blocks_context(name):
    """Heun, 3 steps: 6 network evaluations, so blocks 1 and 2 compute on 3 of them and reuse on the other 3."""
    model, plain = _model(name)
    cached = _with_cache(name, "2,1")
    assert cached.cache_blocks == [1, 2]
    ref = _sample(plain, model)
    with cached_blocks(model, [1, 2], every=2) as counts:
        want = _sample(plain, model)
    assert counts["reused"] == 2 * 3 and counts["computed"] == 2 * 3
    got = _sample(cached, model)
    assert torch.equal(got, want) and not torch.allclose(got, ref, atol=1e-4)
    assert all("forward" not in vars(b) for b in model.blocks)  # the blocks are restored after each call
    assert torch.equal(_sample(plain, model), ref)


def test_blocks_compiled_in_place_sample_cached_without_recompiling():
    """train.compile=blocks compiles each block in place; the cache's bookkeeping (which evaluation reuses, the saved
    residuals) must stay outside the compiled call, or dynamo guards on it and recompiles at every evaluation. Eager
    backend: dynamo's guards and graphs without inductor's compile time."""
    from torch._dynamo.utils import counters
    model, plain = _model("dit")
    cached = _with_cache("dit", "1,2")
    want = _sample(cached, model)
    torch._dynamo.reset()
    counters.clear()
    for b in model.blocks:
        b.compile(backend="eager")
    warm = _sample(plain, model)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1  # the blocks did run compiled
    for _ in range(3):
        with cached_blocks(model, [1, 2], every=2) as counts:
            got = _sample(plain, model)
        assert counts["reused"] == 2 * 3 and counts["computed"] == 2 * 3
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # dynamo's graph: float32 reordering only
        torch.testing.assert_close(_sample(cached, model), want, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs  # no evaluation compiled anything new
    assert not torch.allclose(warm, want, atol=1e-4)  # the cache did change the samples
    assert all("forward" not in vars(b) and b._compiled_call_impl is not None for b in model.blocks)
    torch._dynamo.reset()


def test_method_cache_schedule_samples_as_the_scheduled_context_and_checks_its_evaluation_count():
    """Heun, 3 steps = 6 evaluations: the plan '6/1:1,2;3:0,3' (reuse at two correctors) against the analysis's
    context with that schedule; at
    4 steps (8 evaluations) the plan would reuse at the wrong evaluations, so sampling is refused."""
    from genlab.core.errors import GenlabError
    model, plain = _model("dit")
    plan = {1: frozenset({1, 2}), 3: frozenset({0, 3})}
    with cached_blocks(model, [], schedule=plan, period=6) as counts:
        want = _sample(plain, model)
    assert counts["reused"] == 4
    from genlab.config.tree import load_config
    from genlab.training.step import build_model_and_method
    cfg = load_config("digits_flow", TINY + ["model.depth=4"])
    cfg.method.cache_schedule = "6/3:3,0;1:2,1"  # as genlab eval / sample set it on a trained run's config
    cached = build_model_and_method(cfg, SPEC)[1]
    assert cached.cache_schedule == (6, plan)
    got = _sample(cached, model)
    assert torch.equal(got, want) and not torch.allclose(got, _sample(plain, model), atol=1e-4)
    with pytest.raises(GenlabError, match="a plan for 6 network evaluations per sample, and sampler heun at 4 steps "
                                          "makes 8"):
        _sample(cached, model, steps=4)
    assert all("forward" not in vars(b) for b in model.blocks)


def test_a_cache_every_past_the_evaluations_reuses_from_the_first_call_on():
    model, plain = _model("dit")
    with cached_blocks(model, [0, 3], every=99):
        want = _sample(plain, model)
    assert torch.equal(_sample(_with_cache("dit", "0,3", every=99), model), want)
    assert not torch.equal(want, _sample(_with_cache("dit", "0,3", every=2), model))


@pytest.mark.parametrize("value,expect", [
    ("9", "method.cache_blocks=9: block 9 out of range; this model has blocks 0..3"),
    ("two", "method.cache_blocks must be comma-separated block indices >= 0"),
    ("-1", "method.cache_blocks must be comma-separated block indices >= 0"),
    ("auto", "method.cache_blocks=auto takes the blocks `genlab analyze RUN --what cache` picked"),
    ("schedule=auto", "method.cache_schedule is a sampling plan measured on a trained run"),
    ("schedule=6/1:2", "method.cache_schedule is a sampling plan measured on a trained run"),
])
def test_bad_cache_blocks_are_refused_before_training(tmp_path, capfd, value, expect):
    """`schedule=X` is method.cache_schedule=X; a leading block list also sets method.cache_blocks."""
    blocks, _, schedule = value.rpartition("schedule=") if "schedule=" in value else (value, "", "")
    keys = ([f"method.cache_blocks={blocks.strip()}"] if blocks.strip() else []) + \
        ([f"method.cache_schedule={schedule}"] if schedule else [])
    r = cli_in_process(capfd, "train", "digits_flow", "model.depth=4", *keys,
                       f"train.out_dir={tmp_path}", "train.name=bad")
    assert r.returncode == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "bad").exists()


@pytest.fixture(scope="module")
def analysed_run(tmp_path_factory):
    """A tiny trained run and its cached-sampler analysis (12 samples, 3 Heun steps); trained long enough that its
    blocks are no longer adaLN-Zero's identity, so caching them changes the samples."""
    from genlab.config.tree import load_config
    from genlab.lab.analyze.run import analyze_run
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("cached_run")
    Trainer(load_config("digits_flow", TINY + ["model.depth=4", "train.steps=60", f"train.out_dir={out}", "train.name=r",
                                               "eval.num_samples=0", "log.sample_every=0", "log.ckpt_every=0"])).fit()
    analyze_run(out / "r", what="cache", overrides=["eval.num_samples=12", "eval.sample_steps=3"], cache_blocks="half")
    return out / "r"


EVAL_ARGS = ("eval.num_samples=12", "eval.sample_steps=3", "eval.metrics=accuracy,fd")  # as the fixture analysed


def _eval_reproduces(capfd, run, override, scores) -> dict:
    """`genlab eval RUN <override>` on the analysis's samples (the evaluation's fixed seed) scores what the analysis
    scored for that cache (`scores`: its record); returns the evaluation's JSON."""
    r = cli_in_process(capfd, "eval", run, *EVAL_ARGS, override)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["feature_fd"] == pytest.approx(scores["feature_fd"], rel=1e-6)
    assert got["sample_accuracy"] == pytest.approx(scores["sample_accuracy"])
    return got


def test_eval_with_the_analysed_blocks_scores_what_the_analysis_scored(analysed_run, capfd):
    """`genlab eval RUN method.cache_blocks=auto` takes the analysis's blocks and, on the same samples (the evaluation's
    fixed seed), reproduces the analysis's cached-sampler FD and accuracy; the run's config is not changed."""
    res = json.loads((analysed_run / "analysis" / "analysis.json").read_text())["cache"]
    got = _eval_reproduces(capfd, analysed_run, "method.cache_blocks=auto", res)
    plain = json.loads(cli_in_process(capfd, "eval", analysed_run, *EVAL_ARGS).stdout)
    assert plain["feature_fd"] != pytest.approx(got["feature_fd"], rel=1e-6)


def test_sample_with_auto_draws_what_the_picked_indices_draw(analysed_run, tmp_path, capfd):
    blocks = json.loads((analysed_run / "analysis" / "analysis.json").read_text())["cache"]["blocks"]
    outs = {}
    for name, value in (("auto", "auto"), ("idx", ",".join(map(str, blocks))), ("plain", "")):
        outs[name] = tmp_path / f"{name}.png"
        r = cli_in_process(capfd, "sample", analysed_run, f"method.cache_blocks={value}", "--n", "8", "--steps", "3",
                           "--out", outs[name], "--device", "cpu")
        assert r.returncode == 0, r.stderr
    assert outs["auto"].read_bytes() == outs["idx"].read_bytes() != outs["plain"].read_bytes()


def test_eval_with_the_analysed_schedule_scores_what_the_analysis_scored(analysed_run, capfd, tmp_path):
    """`method.cache_schedule=auto` takes the analysis's step-aware schedule and reproduces its scores on the same
    samples; sampled with another number of evaluations than the analysis's, it is refused in one line, before any
    file is written."""
    res = json.loads((analysed_run / "analysis" / "analysis.json").read_text())
    sc = res["cache"]["scheduled"]
    assert res["sampler"] == "heun" and res["sample_steps"] == 3 and sc["evaluations"] == 6 and sc["reuse"]
    _eval_reproduces(capfd, analysed_run, "method.cache_schedule=auto", sc)
    r = cli_in_process(capfd, "eval", analysed_run, "eval.num_samples=12", "eval.sample_steps=4",
                       "method.cache_schedule=auto")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "a plan for 6 network evaluations per sample, and sampler heun at 4 steps makes 8: sample with heun at 3 " \
        "steps (genlab sample --steps 3, genlab eval eval.sample_steps=3)" in r.stderr
    r = cli_in_process(capfd, "eval", analysed_run, *EVAL_ARGS, "eval.nfe_list=2,4", "method.cache_schedule=auto")
    assert r.returncode == 2 and "eval.nfe_list samples at several NFEs" in r.stderr, r.stderr
    out = tmp_path / "s.png"
    r = cli_in_process(capfd, "sample", analysed_run, "method.cache_schedule=auto", "--steps", "5", "--out", out,
                       "--device", "cpu")
    assert r.returncode == 2 and "sampler heun at 5 steps makes 10" in r.stderr and not out.exists(), r.stderr


@pytest.mark.parametrize("value,expect", [
    ("6/1:9", "method.cache_schedule=6/1:9: block 9 out of range; this model has blocks 0..3"),
    ("6/6:1", "method.cache_schedule must be 'P/k:b,b;k:b'"),
    ("6/0:1", "method.cache_schedule must be 'P/k:b,b;k:b'"),
    ("6/1:", "method.cache_schedule must be 'P/k:b,b;k:b'"),
    ("six/1:2", "method.cache_schedule must be 'P/k:b,b;k:b'"),
    ("6", "method.cache_schedule must be 'P/k:b,b;k:b'"),
])
def test_bad_cache_schedules_are_refused_before_sampling(analysed_run, capfd, value, expect):
    r = cli_in_process(capfd, "eval", analysed_run, *EVAL_ARGS, f"method.cache_schedule={value}")
    assert r.returncode == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = cli_in_process(capfd, "eval", analysed_run, *EVAL_ARGS, "method.cache_schedule=6/1:2", "method.cache_blocks=1")
    assert r.returncode == 2 and "two ways to cache blocks; set one of them" in r.stderr, r.stderr


def test_auto_without_an_analysis_is_one_line_and_writes_nothing(tmp_path, capfd):
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer
    Trainer(load_config("digits_flow", TINY + ["model.depth=4", "train.steps=2", f"train.out_dir={tmp_path}",
                                               "train.name=r", "eval.num_samples=0", "log.sample_every=0"])).fit()
    out = tmp_path / "s.png"
    r = cli_in_process(capfd, "sample", tmp_path / "r", "method.cache_blocks=auto", "--out", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "genlab analyze RUN --what cache" in r.stderr, r.stderr
    assert not out.exists()
    r = cli_in_process(capfd, "sample", tmp_path / "r", "method.cache_schedule=auto", "--out", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "genlab analyze RUN --what cache" in r.stderr, r.stderr
    assert not out.exists()
    r = cli_in_process(capfd, "sample", tmp_path / "r", "model.depth=2", "--out", out)
    assert r.returncode == 2 and "not allowed here" in r.stderr and not out.exists()
    r = cli_in_process(capfd, "sample", tmp_path / "r", "eval.num_samples=9", "--out", out)
    assert r.returncode == 2 and "genlab sample reads no eval.* key" in r.stderr and not out.exists()


def test_a_run_trained_with_cached_blocks_evaluates_with_them(tmp_path, one_thread):
    """The trainer's own evaluations sample through the method: a run configured with cached blocks scores them.
    20 steps move adaLN-Zero's gates off zero (Adam: ~lr a step), so caching blocks changes the samples."""
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer
    common = TINY + ["model.depth=4", "train.steps=20", f"train.out_dir={tmp_path}", "eval.num_samples=12",
                     "eval.sample_steps=3", "eval.metrics=accuracy,fd", "log.sample_every=0", "log.ckpt_every=0"]
    fd = {}
    for name, extra in (("plain", []), ("cached", ["method.cache_blocks=1,2"])):
        t = Trainer(load_config("digits_flow", common + [f"train.name={name}", *extra]))
        fd[name] = t.fit()["feature_fd"]
    assert fd["cached"] == fd["cached"] and fd["cached"] != pytest.approx(fd["plain"], rel=1e-6)
