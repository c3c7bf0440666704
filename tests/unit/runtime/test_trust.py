"""Trust: checks that fire before work, runs that diverge say so, files written whole, exports that load back."""
import os

import pytest
import torch
from conftest import TINY

from genlab.cli import main
from genlab.config.tree import load_config
from genlab.core.errors import GenlabError
from genlab.training.trainer import NonFiniteLoss, Trainer


@pytest.mark.parametrize("override", ["optim.lr=inf", "optim.lr=-inf", "train.ema_decay=nan", "method.time_shift=inf"])
def test_infinite_and_nan_numbers_are_refused(override):
    with pytest.raises(GenlabError, match="must be a finite number"):
        load_config(None, [override])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only resolution of train.device=auto")
def test_attention_without_cpu_backward_is_refused_when_auto_means_cpu():
    with pytest.raises(GenlabError, match="model.attention=flex has no backward pass on the CPU"):
        load_config(None, ["model.attention=flex"])


def test_non_finite_weights_after_the_last_update_end_as_diverged(tmp_path, monkeypatch):
    cfg = load_config("digits_flow", TINY + [f"train.out_dir={tmp_path}", "train.name=nan", "train.steps=2",
                                             "eval.num_samples=0", "log.every=1", "log.ckpt_every=0"])
    t = Trainer(cfg)
    step = Trainer._train_step

    def poisoned(self):
        out = step(self)
        if self.step == cfg.train.steps - 1:  # the last update leaves a weight non-finite (its loss was finite)
            with torch.no_grad():
                next(self.base.parameters()).fill_(float("nan"))
        return out
    monkeypatch.setattr(Trainer, "_train_step", poisoned)
    with pytest.raises(NonFiniteLoss, match="non-finite weights"):
        t.fit()
    import json
    assert json.loads((tmp_path / "nan" / "summary.json").read_text())["status"] == "diverged"
    assert not list((tmp_path / "nan").glob("checkpoints/step_*.pt"))  # no checkpoint of NaN weights
    assert not list((tmp_path / "nan").glob(".*.tmp"))


def test_a_gpt_with_tied_weights_exports_and_samples_back(tmp_path, capsys):
    lm = ["model.dim=32", "model.depth=1", "model.heads=2", "data.seq_len=16", "train.batch_size=8", "log.progress=false",
          "log.tensorboard=false", "eval.num_samples=0", "train.steps=2", f"train.out_dir={tmp_path}", "train.name=g"]
    assert main(["train", "text_ar", *lm]) == 0
    out = tmp_path / "model.safetensors"
    assert main(["export", str(tmp_path / "g"), "--out", str(out)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert main(["sample", str(out), "--n", "2", "--out", str(tmp_path / "s.txt")]) == 0
    from genlab.runtime.checkpoint import load_checkpoint
    a, b = load_checkpoint(tmp_path / "g"), load_checkpoint(out)
    for k, v in (a["ema"] or a["model"]).items():
        assert torch.equal(b["model"][k], v), k


def test_a_missing_val_path_is_refused_before_training(tmp_path, capsys):
    rc = main(["train", *TINY, f"eval.val_path={tmp_path / 'nope'}", f"train.out_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "eval.val_path" in err and "is not a folder made by `genlab data prepare`" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run folder left


def test_a_malformed_world_horizon_list_is_refused_before_training():
    with pytest.raises(GenlabError, match="eval.world_horizons must be comma-separated integers"):
        load_config("pong_world_tiny", ["eval.world_horizons=16,x"])


@pytest.mark.slow  # end to end through the CLI in subprocesses
def test_two_trains_with_one_name_at_once_run_exactly_one(tmp_path):
    import subprocess
    import sys

    from conftest import REPO
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    argv = [sys.executable, "-m", "genlab", "train", *TINY, "optim.warmup_steps=1", "train.steps=2", "eval.num_samples=0",
            f"train.out_dir={tmp_path}", "train.name=same"]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    loser = next(err for rc, err in results if rc == 2)
    assert "already exists" in loser or "just created by another genlab train" in loser, loser
    assert (tmp_path / "same" / "summary.json").exists()


def test_a_resume_of_a_run_another_process_trains_is_refused_before_it_writes(tmp_path, capfd):
    """Two processes resuming one run would interleave its metrics and overwrite each other's checkpoints: while a
    process holds the run folder's lock, `genlab train --resume` says so in one line, exit 2, and writes nothing."""
    import fcntl
    import json

    from conftest import cli_in_process
    run = tmp_path / "r"
    Trainer(load_config("digits_flow", TINY + ["train.steps=2", "eval.num_samples=0", f"train.out_dir={tmp_path}",
                                               "train.name=r", "log.sample_every=0"])).fit()
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    with open(run / ".lock", "a+") as held:  # stands for the training process
        fcntl.flock(held, fcntl.LOCK_EX)
        held.seek(0)
        held.truncate()
        held.write("777")
        held.flush()
        r = cli_in_process(capfd, "train", "--resume", run, "train.steps=4")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "is being trained by another genlab process (pid 777)" in r.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"} == files
    r = cli_in_process(capfd, "train", "--resume", run, "train.steps=4")  # released: the resume goes on
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "summary.json").read_text())["step"] == 4


def test_a_resume_that_fails_in_setup_lets_the_next_resume_in(tmp_path, monkeypatch):
    import genlab.training.trainer as trainer_mod
    common = TINY + ["eval.num_samples=0", f"train.out_dir={tmp_path}", "train.name=r", "log.sample_every=0"]
    Trainer(load_config("digits_flow", common + ["train.steps=2"])).fit()

    def broken_log(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(trainer_mod, "MetricsLog", broken_log)  # after the lock, before the first step
    failed = Trainer(load_config("digits_flow", common + ["train.steps=4"]), resume=str(tmp_path / "r"))
    with pytest.raises(GenlabError, match="disk full"):
        failed.fit()
    monkeypatch.undo()
    assert Trainer(load_config("digits_flow", common + ["train.steps=4"]), resume=str(tmp_path / "r")).fit()["step"] == 4


def test_the_run_config_shows_what_the_components_read_and_loads_back(tmp_path):
    import tomllib

    from genlab.config.tree import from_dict, to_dict
    cfg = load_config("digits_flow", TINY + [f"train.out_dir={tmp_path}", "train.name=c", "train.steps=1",
                                             "eval.num_samples=0"])
    Trainer(cfg).fit()
    saved = tomllib.loads((tmp_path / "c" / "config.toml").read_text())
    assert "num_classes" not in saved["data"] and "vocab_size" not in saved["model"]  # digits/dit do not read them
    assert "patch_size" in saved["model"] and "time_shift" in saved["method"]
    assert to_dict(from_dict(saved)) == to_dict(cfg)


def test_a_sparse_stride_as_long_as_the_sequence_is_refused():
    with pytest.raises(GenlabError, match=r"model.sparse_stride \(256\) must be shorter than the sequence \(256 tokens\)"):
        load_config("sparse_tiny_cpu", ["model.sparse_stride=256", "data.name=text", "data.seq_len=256",
                                        "method.name=autoregressive", "model.sparse_embed=auto"])
    with pytest.raises(GenlabError, match=r"must be shorter than the sequence \(64 tokens\)"):
        load_config(None, ["model.name=sparse_transformer", "method.name=image_ar", "model.sparse_stride=64",
                           "model.size=tiny"])
