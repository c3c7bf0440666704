"""The stall sentinel on the logs of real runs: eighteen GPU runs of the shipped Tiny Shakespeare recipes (issue 55;
docs/benchmarks.md: Every seed learns), replayed through the watcher with the trainer's defaults. It fires on the two
MDLM runs with learned positions that never left the unigram plateau, fires and clears on the one that left it late,
and stays silent on every run that learned (MDLM with learned or rotary positions, autoregressive)."""
import json

import pytest

from conftest import TESTS
from genlab.config.keys import Config
from genlab.families.baselines import Baseline
from genlab.training.stall import StallWatcher

LOGS = json.loads((TESTS / "fixtures" / "stall_logs_h200.json").read_text())


def replay(run: str) -> tuple[dict, list[str]]:
    base = LOGS["baselines"]
    # the values the methods' trivial_baselines give on the prepared chars (the last test)
    val = "val_loss" if run.startswith("ar-") else "nelbo_loss"
    lines = [Baseline("loss", base["unigram_nats"], "unigram"), Baseline(val, base["unigram_nats"], "unigram")]
    said, log = [], Config().log  # the shipped defaults: log.stall_after, log.stall_margin
    watcher = StallWatcher(lines, LOGS["steps"], log.stall_after, log.stall_margin, say=said.append)
    evals = {step: (name, value) for step, name, value in LOGS["runs"][run]["eval"]}
    for step, loss in LOGS["runs"][run]["log"]:
        watcher.check(step, {"loss": loss})
        if step in evals:
            watcher.check(step, {evals[step][0]: evals[step][1]}, "evaluation")
    return watcher.summary(), said


@pytest.mark.parametrize("run", ["mdlm-s1", "mdlm-s4"])
def test_the_runs_that_stayed_on_the_plateau_end_stalled(run):
    summary, said = replay(run)
    assert summary["stalled"] is True and summary["stall"]["since_step"] == 1250  # the first check after 25% of 5000
    assert said[0].startswith("stalled: training loss")


def test_the_run_that_left_the_plateau_late_fires_then_clears():
    summary, said = replay("mdlm-s5")
    assert summary["stalled"] is False and summary["stall"]["since_step"] == 1250 and summary["stall"]["left_at"] == 1750
    assert [s.split(":")[0] for s in said] == ["stalled", "no longer stalled"]


@pytest.mark.parametrize("run", [f"{lab}-s{s}" for lab in ("mdlmrope", "ar") for s in range(6)] + ["mdlm-s0", "mdlm-s2", "mdlm-s3"])
def test_the_runs_that_learned_stay_silent(run):
    summary, said = replay(run)
    assert summary == {"stalled": False} and said == []


def test_the_baselines_are_what_the_methods_compute_on_the_prepared_chars(tmp_path, capfd):
    """The replayed baselines are the methods' own trivial_baselines on Tiny Shakespeare prepared as the runs had it."""
    from conftest import SHARED_DATA, cli_in_process
    from genlab.config.tree import load_config
    from genlab.data import build_dataset
    from genlab.families.base import method_registry
    src = SHARED_DATA / "text" / "tinyshakespeare.txt"
    if not src.exists():
        pytest.skip("../shared/data/text/tinyshakespeare.txt is absent")
    r = cli_in_process(capfd, "data", "prepare", "text", "--src", str(src), "--tokenizer", "char", "--out", str(tmp_path / "chars"))
    assert r.returncode == 0, r.stderr
    for preset, key in (("shakespeare_char_mdlm", "unigram_nats"), ("shakespeare_char_ar", "unigram_nats")):
        cfg = load_config(preset, [f"data.path={tmp_path / 'chars'}"])
        data = build_dataset(cfg.data)
        lines = method_registry.get(cfg.method.name)(cfg, data.spec).trivial_baselines(data, None)
        assert lines[0].metric == "loss" and lines[0].value == pytest.approx(LOGS["baselines"][key], rel=1e-9)
