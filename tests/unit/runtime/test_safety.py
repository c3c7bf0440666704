"""Loading files never runs code: payload checkpoints, DCP metadata and CIFAR-10 batches are refused
(exit 2, the payload's marker file never appears); real checkpoints of every family resume exactly."""
import os
import pickle

import pytest
import torch
from conftest import TINY, stop_after

from genlab.cli import main
from genlab.config.tree import load_config
from genlab.runtime import checkpoint as ckpt
from genlab.runtime.metrics import read_metrics
from genlab.training.trainer import Trainer


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


def test_payload_dcp_meta_pt_is_refused_unexecuted(tmp_path, capsys):
    marker = tmp_path / "pwned"
    d = tmp_path / "runs" / "x" / "checkpoints" / "step_00000001.dcp"
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"")
    torch.save({"step": 1, "x": Payload(marker)}, d / "meta.pt")
    _refused(capsys, ["sample", str(d), "--n", "4"], marker)


@pytest.fixture(scope="module")
def dcp_run(tmp_path_factory):
    """A real single-process DCP checkpoint of a tiny digits run (the layout an FSDP run writes)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    root = tmp_path_factory.mktemp("dcp")
    Trainer(load_config("digits_flow", TINY + [f"train.out_dir={root}", "train.name=src", "train.steps=2",
                                               "eval.num_samples=0"])).fit()
    state = ckpt.load_checkpoint(root / "src")
    run = root / "dcprun"
    d = run / "checkpoints" / "step_00000002.dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": state["model"], "ema": state["ema"], "extra": {"lr": 0.5, "names": ["a", "b"]}},
                 checkpoint_id=str(d))
    meta = {k: v for k, v in state.items() if k not in ("model", "ema", "optimizer")}
    torch.save({**meta, "world": 1, "has_ema": True}, d / "meta.pt")
    return root, run, d, state


def _copy_run(dcp_run, tmp_path):
    import shutil
    _, run, d, _ = dcp_run
    shutil.copytree(run, tmp_path / "runs" / "x")
    return tmp_path / "runs" / "x", tmp_path / "runs" / "x" / "checkpoints" / d.name


def test_a_real_dcp_checkpoint_loads_through_the_restricted_reader(dcp_run):
    _, run, _, state = dcp_run
    loaded = ckpt.load_checkpoint(run)
    for k, v in state["model"].items():
        assert torch.equal(loaded["model"][k], v), k
    for k, v in state["ema"].items():
        assert torch.equal(loaded["ema"][k], v), k


def _load_argv(cmd, run, tmp_path):
    return {"sample": ["sample", str(run), "--n", "4", "--out", str(tmp_path / "g.png")],
            "eval": ["eval", str(run)],
            "resume": ["train", "--resume", str(run)],
            "export": ["export", str(run), "--out", str(tmp_path / "m.safetensors")],
            "play": ["play", str(run), "--port", "0"],
            "init_from": ["train", "digits_flow", *TINY, f"train.out_dir={tmp_path / 'new'}", "optim.warmup_steps=1", "train.steps=2",
                          f"train.init_from={run}"]}[cmd]


@pytest.mark.parametrize("cmd", ["sample", "eval", "resume", "export", "play", "init_from"])
def test_payload_dcp_metadata_is_refused_unexecuted_by_every_command(dcp_run, tmp_path, capsys, cmd):
    """A valid tensors-only meta.pt next to a crafted .metadata: DCP would unpickle it with plain pickle."""
    marker = tmp_path / "pwned"
    run, d = _copy_run(dcp_run, tmp_path)
    (d / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    before = sorted(str(p) for p in run.rglob("*"))
    err = _refused(capsys, _load_argv(cmd, run, tmp_path), marker)
    assert "posix.system" in err or "os.system" in err
    assert sorted(str(p) for p in run.rglob("*")) == before
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())


@pytest.mark.slow  # a CLI subprocess; the in-process refusal by every command stays fast
def test_payload_dcp_metadata_refusal_is_the_only_stderr_line_of_the_command(dcp_run, tmp_path):
    """In a real process: .metadata is checked before DCP sees the folder, so DCP's logger (silent under pytest's log
    capture) prints no traceback of a refused read before the one-line error."""
    from conftest import run_cli
    marker = tmp_path / "pwned"
    run, d = _copy_run(dcp_run, tmp_path)
    (d / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    r = run_cli("sample", str(run), "--n", "4", "--out", str(tmp_path / "g.png"), timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "refused" in r.stderr and "system" in r.stderr and not marker.exists()


def test_payload_in_a_dcp_non_tensor_entry_is_refused_unexecuted(dcp_run, tmp_path, capsys):
    """DCP loads non-tensor entries with torch.load(weights_only=False); genlab's planner does not."""
    import warnings

    import torch.distributed.checkpoint as dcp
    marker = tmp_path / "pwned"
    _, _, _, state = dcp_run
    run = tmp_path / "runs" / "x"
    d = run / "checkpoints" / "step_00000002.dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {**state["model"], "evil": Payload(marker)}}, checkpoint_id=str(d))
    meta = {k: v for k, v in state.items() if k not in ("model", "ema", "optimizer")}
    torch.save({**meta, "world": 1, "has_ema": False}, d / "meta.pt")
    assert not marker.exists()
    _refused(capsys, ["sample", str(run), "--n", "4", "--out", str(tmp_path / "g.png")], marker)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "foreign_class", "not_metadata"])
def test_damaged_dcp_metadata_is_one_line(dcp_run, tmp_path, capsys, damage):
    import collections
    run, d = _copy_run(dcp_run, tmp_path)
    good = (d / ".metadata").read_bytes()
    (d / ".metadata").write_bytes({"empty": b"", "truncated": good[: len(good) // 2], "garbage": b"\x00not a pickle",
                                   "foreign_class": pickle.dumps(collections.Counter("ab")),
                                   "not_metadata": pickle.dumps({"a": 1})}[damage])
    rc = main(["sample", str(run), "--n", "4", "--out", str(tmp_path / "g.png")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert ("refused" in err) if damage == "foreign_class" else ("cannot read DCP checkpoint" in err), err
    assert not (tmp_path / "g.png").exists()


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
    assert stop_after(Trainer(cfg("part")), 3).fit()["status"] == "interrupted"
    Trainer(cfg("part"), resume=str(tmp_path / "part")).fit()
    loss = [[r["loss"] for r in read_metrics(tmp_path / n) if "loss" in r] for n in ("full", "part")]
    assert loss[0] == loss[1] and len(loss[0]) == 6
    a, b = ckpt.load_checkpoint(tmp_path / "full"), ckpt.load_checkpoint(tmp_path / "part")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
