"""The trainer: overfitting, exact resume, divergence handling, Ctrl-C, bad resumes."""
import errno
import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import REPO, TINY, cli_in_process, straight_and_resumed, tiny_config

from genlab.core.errors import GenlabError, RunFailed
from conftest import plain_context
from genlab.families.image_flow.flow import FlowMatching
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.metrics import read_metrics
from genlab.training.trainer import NonFiniteLoss, Trainer, build_model_and_method


def losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir) if "loss" in r]


@pytest.mark.slow  # end to end: tens of seconds on 2 cores; the full suite runs it
def test_overfits_a_fixed_batch(tmp_path):
    """Same images, noise and t every step: the flow loss must go to (almost) zero."""
    cfg = tiny_config(tmp_path, "model.dim=64")
    from genlab.data import build_dataset
    data = build_dataset(cfg.data)
    model, method = build_model_and_method(cfg, data.spec)
    batch = {"image": torch.from_numpy(data.images[:8].copy()).permute(0, 3, 1, 2).float() / 127.5 - 1,
             "label": torch.from_numpy(data.labels[:8].copy())}
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    first = None
    for _ in range(300):
        loss, _ = method.loss(model, batch, plain_context(torch.Generator().manual_seed(0)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 0.02 * first


def test_resume_continues_exactly(tmp_path):
    """Interrupted at step 12 and resumed == uninterrupted: data order, EMA, optimizer, LR, RNG."""
    common = ["train.steps=30", "log.every=1", "log.ckpt_every=0", "optim.warmup_steps=10", "train.ema_decay=0.9"]
    _, a, b = straight_and_resumed(tmp_path, 12, *common)
    assert losses(tmp_path / "part") == losses(tmp_path / "full")
    for key in ("model", "ema"):
        for k in a[key]:
            assert torch.equal(a[key][k], b[key][k]), f"{key}.{k} differs after resume"
    assert a["loader"] == b["loader"]


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    real_loss = FlowMatching.loss
    calls = {"n": 0}

    def poisoned(self, model, batch, gen):
        calls["n"] += 1
        loss, extra = real_loss(self, model, batch, gen)
        return (loss * float("nan") if calls["n"] > 10 else loss), extra

    monkeypatch.setattr(FlowMatching, "loss", poisoned)
    t = Trainer(tiny_config(tmp_path, "train.steps=40", "log.every=5", "log.ckpt_every=5", "train.name=nan"))
    with pytest.raises(NonFiniteLoss, match="non-finite"):
        t.fit()
    kept = [p.name for p in ckpt.list_checkpoints(tmp_path / "nan")]
    assert kept[-1] == "step_00000010.pt"
    state = ckpt.load_checkpoint(tmp_path / "nan")
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert json.loads((tmp_path / "nan" / "summary.json").read_text())["status"] == "diverged"


def test_skip_nonfinite_skips_and_counts(tmp_path, monkeypatch):
    real_loss = FlowMatching.loss
    calls = {"n": 0}

    def poisoned(self, model, batch, gen):
        calls["n"] += 1
        loss, extra = real_loss(self, model, batch, gen)
        return (loss * float("inf") if calls["n"] in (4, 7) else loss), extra

    monkeypatch.setattr(FlowMatching, "loss", poisoned)
    t0 = time.perf_counter()
    s = Trainer(tiny_config(tmp_path, "train.steps=10", "log.every=5", "train.skip_nonfinite=true", "train.name=skip")).fit()
    assert s["status"] == "finished"
    # first_step_s: from the trainer's construction to the end of step 1 (data, model, compile, that step)
    assert 0 < s["first_step_s"] < time.perf_counter() - t0
    state = ckpt.load_checkpoint(tmp_path / "skip")
    assert state["nonfinite_skipped"] == 2
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_resume_with_a_different_model_shape_fails_cleanly(tmp_path):
    Trainer(tiny_config(tmp_path, "train.steps=3", "train.name=a")).fit()
    before = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    cfg = tiny_config(tmp_path, "train.steps=6", "model.dim=48", "train.name=a")
    with pytest.raises(GenlabError, match="model differs"):
        Trainer(cfg, resume=str(tmp_path / "a")).fit()
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == before


def test_a_run_whose_setup_fails_leaves_no_folder(tmp_path, monkeypatch):
    # the config could not be written (tomli_w missing on a GPU image did this): no empty run folder may remain,
    # or the next `genlab train` of that name refuses with "already exists"
    import genlab.training.trainer as trainer_mod

    def no_tomli_w(d):
        raise ModuleNotFoundError("No module named 'tomli_w'")

    monkeypatch.setattr(trainer_mod, "dumps_toml", no_tomli_w)
    with pytest.raises(GenlabError, match="tomli_w"):
        Trainer(tiny_config(tmp_path, "train.steps=2", "train.name=a")).fit()
    assert not (tmp_path / "a").exists()
    monkeypatch.undo()

    def broken_log(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(trainer_mod, "MetricsLog", broken_log)  # fails after the folder and its config.toml exist
    with pytest.raises(GenlabError, match="disk full"):
        Trainer(tiny_config(tmp_path, "train.steps=2", "train.name=a")).fit()
    assert not (tmp_path / "a").exists()
    monkeypatch.undo()

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer_mod, "MetricsLog", full_disk)  # the machine's failure, not bad input: exit 1
    with pytest.raises(RunFailed, match="No space left"):
        Trainer(tiny_config(tmp_path, "train.steps=2", "train.name=a")).fit()
    assert not (tmp_path / "a").exists()
    monkeypatch.undo()
    assert Trainer(tiny_config(tmp_path, "train.steps=2", "train.name=a")).fit()["status"] == "finished"


def test_a_full_disk_outside_training_exits_1_not_the_bad_input_code(monkeypatch, capfd):
    from conftest import cli_in_process

    import genlab.config.doc as config_doc

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(config_doc, "annotated_toml", full_disk)
    r = cli_in_process(capfd, "config", "digits_flow")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "genlab: failed: OSError: [Errno 28] No space left on device"


def test_existing_run_folder_is_not_overwritten(tmp_path):
    Trainer(tiny_config(tmp_path, "train.steps=2", "train.name=a")).fit()
    with pytest.raises(GenlabError, match="already exists"):
        Trainer(tiny_config(tmp_path, "train.steps=2", "train.name=a")).fit()


@pytest.mark.slow  # end to end through the CLI in subprocesses
def test_ctrl_c_saves_a_checkpoint(tmp_path):
    import os
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "genlab", "train", *TINY, "train.steps=100000", "log.every=1",
                             f"train.out_dir={tmp_path}", "train.name=sig"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "sig" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err  # interrupted, checkpoint saved: requeue with --resume
    summary = json.loads((tmp_path / "sig" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    state = ckpt.load_checkpoint(tmp_path / "sig")
    assert state["step"] == summary["step"] >= 3


def folder_digest(folder) -> dict:
    """Every path under a folder with its bytes' hash (folders as None): any write shows."""
    import hashlib
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def test_a_finished_run_is_never_modified_and_extending_it_appends(tmp_path, capfd):
    """Resuming a finished run once re-evaluated it, rewrote its checkpoint, appended duplicate eval records and
    nulled its summary's loss: now it is refused in one line unless it extends the run from its last checkpoint."""
    Trainer(tiny_config(tmp_path, "train.name=done", "train.steps=6", "log.every=2", "log.ckpt_every=2",
                        "optim.warmup_steps=2", "eval.num_samples=20")).fit()
    run = tmp_path / "done"
    before, log_before = folder_digest(run), (run / "metrics.jsonl").read_text()
    first = json.loads((run / "summary.json").read_text())
    older = run / "checkpoints" / "step_00000004.pt"  # extending from it would log steps 5 and 6 again
    for args in ([run], [run, "train.steps=6"], [run, "train.steps=4"], [older, "train.steps=9"]):
        r = cli_in_process(capfd, "train", "--resume", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "train.steps=N" in lines[0], (args, r.stderr[-2000:])
        assert folder_digest(run) == before, args
    r = cli_in_process(capfd, "train", "--resume", str(run), "train.steps=10")
    assert r.returncode == 0, r.stderr[-2000:]
    log = (run / "metrics.jsonl").read_text()
    assert log.startswith(log_before)  # appended, nothing rewritten
    recs = read_metrics(run)
    assert [x["step"] for x in recs if "loss" in x] == [2, 4, 6, 8, 10]
    keyed = [(x["step"], tuple(sorted(x))) for x in recs]
    assert len(keyed) == len(set(keyed))  # no record twice
    assert [x["step"] for x in recs if "eval/sample_accuracy" in x] == [6, 10]
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "finished" and s["step"] == 10
    assert all(s[k] is not None for k in ("loss", "samples_per_s", "step_time"))
    assert s["wall_time"] > first["wall_time"]  # the whole run's: the extension's seconds added


def test_the_run_folder_of_a_dcp_checkpoint_is_two_levels_up_although_it_is_a_folder(tmp_path):
    """`--resume RUN/checkpoints/step_N.dcp` once made the checkpoint folder the run folder (metrics written inside it)."""
    from genlab.runtime.checkpoint import run_dir_of
    run = tmp_path / "run"
    dcp = run / "checkpoints" / "step_00000003.dcp"
    dcp.mkdir(parents=True)
    (dcp / ".metadata").write_bytes(b"")
    (run / "checkpoints" / "step_00000004.pt").write_bytes(b"")
    assert run_dir_of(dcp) == run
    assert run_dir_of(run / "checkpoints" / "step_00000004.pt") == run
    assert run_dir_of(run) == run
