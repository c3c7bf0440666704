"""Loading files never runs code: payload checkpoints, DCP metadata and CIFAR-10 batches are refused
(exit 2, the payload's marker file never appears); real checkpoints of every family resume exactly."""
import os
import pickle

import pytest
import torch

from conftest import TINY
from genlab.cli import main
from genlab.config import load_config
from genlab.train import checkpoint as ckpt
from genlab.train.metrics import read_metrics
from genlab.train.trainer import Trainer


class Payload:
    """What a malicious file carries: unpickling it calls os.system."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _refused(capsys, argv, marker):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "refused" in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not marker.exists(), "the payload ran"
    return err


def _payload_run(tmp_path, marker):
    run = tmp_path / "runs" / "x"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"model": {}, "config": {"x": Payload(marker)}, "step": 1}, run / "checkpoints" / "step_00000001.pt")
    return run


@pytest.mark.parametrize("cmd", ["sample", "eval", "resume"])
def test_payload_checkpoint_is_refused_unexecuted(tmp_path, capsys, cmd):
    marker = tmp_path / "pwned"
    run = _payload_run(tmp_path, marker)
    argv = {"sample": ["sample", str(run), "--n", "4"], "eval": ["eval", str(run)],
            "resume": ["train", "--resume", str(run)]}[cmd]
    before = sorted(p.name for p in run.rglob("*"))
    _refused(capsys, argv, marker)
    assert sorted(p.name for p in run.rglob("*")) == before


def test_payload_dcp_metadata_is_refused_unexecuted(tmp_path, capsys):
    marker = tmp_path / "pwned"
    d = tmp_path / "runs" / "x" / "checkpoints" / "step_00000001.dcp"
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"")
    torch.save({"step": 1, "x": Payload(marker)}, d / "meta.pt")
    _refused(capsys, ["sample", str(d), "--n", "4"], marker)


def test_payload_cifar_batch_is_refused_unexecuted(tmp_path, capsys):
    marker = tmp_path / "pwned"
    base = tmp_path / "src" / "cifar-10-batches-py"
    base.mkdir(parents=True)
    for i in range(1, 6):
        (base / f"data_batch_{i}").write_bytes(pickle.dumps({b"data": Payload(marker), b"labels": [0]}))
    (base / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"a"]}))
    err = _refused(capsys, ["data", "prepare", "cifar10", "--src", str(tmp_path / "src"), "--out", str(tmp_path / "out"),
                            "--no-verify"], marker)
    assert "posix.system" in err or "os.system" in err
    assert not (tmp_path / "out").exists()


def test_checkpoints_hold_only_plain_data(tmp_path):
    """A real checkpoint loads with weights_only=True (what load_checkpoint uses)."""
    Trainer(load_config("digits_flow", TINY + [f"train.out_dir={tmp_path}", "train.name=a", "train.steps=2"])).fit()
    state = torch.load(ckpt.list_checkpoints(tmp_path / "a")[-1], weights_only=True)
    assert isinstance(state["config"], dict) and torch.is_tensor(state["torch_rng"]) and torch.is_tensor(state["gen"])


LM_TINY = ["model.dim=32", "model.depth=1", "model.heads=2", "data.seq_len=16", "train.batch_size=8",
           "log.progress=false", "log.tensorboard=false", "optim.warmup_steps=2", "eval.num_samples=0",
           "log.every=1", "log.ckpt_every=0", "method.sample_len=8"]


@pytest.mark.parametrize("preset", ["text_ar", "text_mdlm"])
def test_language_model_checkpoints_resume_exactly(tmp_path, preset):
    """Interrupted at step 3 and resumed == uninterrupted, for the token families too."""
    def cfg(name):
        return load_config(preset, LM_TINY + [f"train.out_dir={tmp_path}", "train.steps=6", f"train.name={name}"])
    Trainer(cfg("full")).fit()
    part = Trainer(cfg("part"))
    part.stop_after = 3
    assert part.fit()["status"] == "interrupted"
    Trainer(cfg("part"), resume=str(tmp_path / "part")).fit()
    loss = [[r["loss"] for r in read_metrics(tmp_path / n) if "loss" in r] for n in ("full", "part")]
    assert loss[0] == loss[1] and len(loss[0]) == 6
    a, b = ckpt.load_checkpoint(tmp_path / "full"), ckpt.load_checkpoint(tmp_path / "part")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
