"""The stall sentinel's logic (training/stall.py): when it fires, what it prints, what summary.json gets."""
from genlab.families.baselines import Baseline
from genlab.training.stall import StallWatcher

UNIGRAM = Baseline("loss", 3.309, "unigram entropy of the training tokens")


def watcher(*baselines, total=5000, after=0.25, margin=0.05):
    lines = []
    return StallWatcher(baselines or [UNIGRAM], total, after, margin, lines.append), lines


def test_fires_once_after_the_share_and_records_both_numbers():
    w, lines = watcher()
    for step, loss in [(250, 3.333), (500, 3.306), (1000, 3.29)]:  # before 25% of 5000: silent
        w.check(step, {"loss": loss})
    assert lines == [] and w.summary() == {"stalled": False}
    for step, loss in [(1250, 3.29), (1500, 3.288), (5000, 3.284)]:
        w.check(step, {"loss": loss})
    assert lines == ["stalled: training loss 3.29 is within 5% of the unigram entropy of the training tokens (3.309) "
                     "at step 1250 of 5000"]
    assert w.summary() == {"stalled": True, "stall": {"metric": "loss", "value": 3.284, "baseline": 3.309,
                                                      "what": "unigram entropy of the training tokens", "since_step": 1250}}


def test_a_late_escape_says_so_and_ends_not_stalled():
    w, lines = watcher()
    for step, loss in [(1250, 3.30), (1500, 3.1), (1750, 2.6), (5000, 2.49)]:
        w.check(step, {"loss": loss})
    assert len(lines) == 2 and lines[1].startswith("no longer stalled: training loss 3.1 left the level")
    s = w.summary()
    assert s["stalled"] is False and s["stall"]["since_step"] == 1250 and s["stall"]["left_at"] == 1500


def test_learning_runs_stay_silent_and_the_margin_is_relative():
    w, lines = watcher()
    for step, loss in [(1250, 2.36), (2500, 3.309 * 0.95 - 1e-3), (5000, 1.8)]:
        w.check(step, {"loss": loss})
    assert lines == [] and w.summary() == {"stalled": False}
    w, lines = watcher()
    w.check(1250, {"loss": 3.309 * 0.95 + 1e-3})
    assert len(lines) == 1


def test_higher_is_better_metrics_and_an_absolute_margin():
    psnr = Baseline("tf_psnr", 30.0, "PSNR of copying the last context frame", higher_is_better=True)
    acc = Baseline("sample_accuracy", 0.1, "chance accuracy (1 / classes)", higher_is_better=True, scale=1.0)
    w, lines = watcher(psnr, acc, total=100)
    w.check(100, {"tf_psnr": 32.0, "sample_accuracy": 0.9}, "eval")  # 32 > 30 + 1.5 dB; 0.9 > 0.15
    assert lines == []
    w.check(100, {"tf_psnr": 31.4, "sample_accuracy": 0.14}, "eval")
    assert lines == ["stalled: eval tf_psnr 31.4 is within 5% of the PSNR of copying the last context frame (30) at step 100 of 100",
                     "stalled: eval sample_accuracy 0.14 is within 0.05 of the chance accuracy (1 / classes) (0.1) at step 100 of 100"]
    assert w.summary()["stall"]["metric"] == "tf_psnr"


def test_off_missing_and_non_numeric_values_are_ignored():
    w, lines = watcher(after=0)
    w.check(5000, {"loss": 3.4})
    assert lines == [] and w.summary() == {}
    w, lines = watcher()
    w.check(5000, {"loss": float("nan"), "val_loss": 3.4})
    w.check(5000, {"loss": True})
    assert lines == [] and w.summary() == {"stalled": False}
