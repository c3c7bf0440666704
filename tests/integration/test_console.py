"""Console output: a status line every log.every steps, progress for eval and sampling, no bar spam off a terminal."""
from __future__ import annotations

import io
import re

import pytest
from conftest import TINY, cli_in_process, run_cli

from genlab.core import progress


@pytest.mark.slow
def test_train_off_a_terminal_prints_status_lines_and_eval_and_sampling_progress(tmp_path, capfd):
    over = [o for o in TINY if not o.startswith("log.progress")] + [
        f"train.out_dir={tmp_path}", "train.steps=10", "log.every=5", "eval.classifier_epochs=2"]
    r = run_cli("train", *over, timeout=600)  # stdout and stderr are pipes, as under nohup or CI
    assert r.returncode == 0, r.stderr[-2000:]
    status = [l for l in r.stdout.splitlines() if l.startswith("step ")]
    assert [l.split()[1] for l in status] == ["5/10", "10/10"]
    assert re.fullmatch(r"step 5/10  loss \d+\.\d{4}  lr \d\.\d\de-\d\d  \d+ samples/s  ETA \d+s", status[0]), status[0]
    assert "\r" not in r.stdout + r.stderr  # no carriage-return progress bar in a log file
    assert re.search(r"^eval: sampling 50 images: 50/50 img in \d+\.\d s$", r.stderr, re.M), r.stderr
    assert re.search(r"^preview: sampling \d+ images: ", r.stderr, re.M)

    run_dir = next(tmp_path.glob("digits_flow-*"))
    # in-process: the captured stdout/stderr are not a terminal either
    s = cli_in_process(capfd, "sample", str(run_dir), "--n", "8", "--steps", "3", "--out", str(tmp_path / "g.png"))
    assert s.returncode == 0 and "wrote" in s.stdout, s.stderr
    assert re.search(r"^sampling 8 images: 3/3 step in \d+\.\d s$", s.stderr, re.M), s.stderr  # heun: per ODE step


def test_progress_is_silent_when_switched_off_and_a_bar_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    pipe, tty = io.StringIO(), Tty()
    with progress.enabled(False):
        with progress.Task("quiet", total=3, stream=pipe) as t:
            t.update(3)
    assert pipe.getvalue() == ""
    with progress.Task("loud", total=3, stream=pipe) as t:
        t.update(3)
    assert re.fullmatch(r"loud: 3/3 it in \d+\.\d s\n", pipe.getvalue())
    with progress.Task("bar", total=3, stream=tty) as t:
        t.update(3)
    assert "\r" in tty.getvalue() and tty.getvalue().rstrip().endswith("s")  # tqdm drew on the terminal


def test_status_line_names_step_loss_lr_throughput_and_eta():
    rec = {"step": 100, "loss": 0.51234, "lr": 1e-3, "samples_per_s": 912.4, "tokens_per_s": None}
    assert progress.status_line(rec, 800, 65.2) == "step 100/800  loss 0.5123  lr 1.00e-03  912 samples/s  ETA 1m05s"
    assert progress.fmt_duration(3725) == "1h02m" and progress.fmt_duration(9.6) == "10s"


def _quiet_run(tmp_path, *extra):
    """A tiny digits run with log.progress=false (TINY), no evaluation: seconds."""
    return [*TINY, f"train.out_dir={tmp_path}", "train.name=q", "train.steps=10", "log.every=5", "log.ckpt_every=0",
            "eval.num_samples=0", "log.sample_every=0", *extra]


def test_progress_false_still_prints_the_start_line_and_the_summary(tmp_path, capfd):
    r = cli_in_process(capfd, "train", *_quiet_run(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == f"run: {tmp_path / 'q'}  steps: 0 -> 10  batch: 16  device: cpu", r.stdout
    assert not [l for l in lines if l.startswith("step ")]  # the per-log.every status lines stay off
    assert any(l.startswith(f"run: {tmp_path / 'q'}  status: finished  steps: 10") for l in lines), r.stdout
    assert "GPU recipe" not in r.stderr  # 10 tiny steps: no slow-CPU warning


def test_a_slow_cpu_run_warns_before_training_and_reports_after_step_one(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(progress, "CPU_FLOPS_PER_THREAD", 1e3)  # as if this tiny model were a GPU recipe
    r = cli_in_process(capfd, "train", *_quiet_run(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    warn = [l for l in r.stderr.splitlines() if "GPU recipe" in l]
    assert len(warn) == 1 and re.match(r"genlab: warning: training on the CPU: [\d,]+ GFLOP per step, so 10 steps "
                                       r"take at least ~\S+ ", warn[0]), r.stderr
    status = [l for l in r.stdout.splitlines() if l.startswith("step ")]
    assert [l.split()[1] for l in status] == ["1/10"], r.stdout  # at once; log.progress=false keeps the rest off
    assert re.fullmatch(r"step 1/10  loss \d+\.\d{4}  lr \S+  \d+ samples/s  ETA \S+", status[0]), status[0]
    import json
    steps = [json.loads(l)["step"] for l in (tmp_path / "q" / "metrics.jsonl").read_text().splitlines()]
    assert steps[:3] == [1, 5, 10]


def test_cpu_slow_warning_fires_for_a_gpu_recipe_and_not_for_the_cpu_presets():
    # train FLOPs per step of the presets (model.flops_per_sample x 3 x batch): gpt2_124m 14.0 T, digits_flow 5.1 G
    gpt2 = progress.cpu_slow_warning(14.0e12, 1000, threads=2)
    assert gpt2 is not None and "14,000 GFLOP per step, so 1000 steps take at least ~38h53m" in gpt2
    assert progress.cpu_slow_warning(5.12e9, 800, threads=2) is None
    assert progress.cpu_slow_warning(5.12e9, 800_000, threads=2) is not None  # far more steps: warned too
