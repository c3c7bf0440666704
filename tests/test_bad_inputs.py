"""Bad inputs across train, sample, eval, data prepare, sweep and bench: each is exit code 2 with one
stderr line naming the offending key or file, no traceback, and nothing created or changed on disk."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, TINY
from genlab.cli import main
from genlab.config import load_config
from genlab.train import checkpoint as ckpt
from genlab.train.trainer import Trainer

T = ["train", *TINY, "train.steps=2", "eval.num_samples=0"]
TEXT = ["train", "text_ar", "model.dim=32", "model.depth=1", "model.heads=2", "train.steps=2"]

# (id, argv with {run}/{tmp} placeholders, text the message must contain)
CASES = [
    ("negative lr", T + ["optim.lr=-1"], "optim.lr"),
    ("lr not a number", T + ["optim.lr=fast"], "optim.lr"),
    ("lr nan", T + ["optim.lr=nan"], "optim.lr"),
    ("zero steps", T + ["train.steps=0"], "train.steps"),
    ("fractional batch", T + ["train.batch_size=1.5"], "train.batch_size"),
    ("patch does not divide image", T + ["model.patch_size=3"], "model.patch_size"),
    ("heads do not divide dim", T + ["model.heads=3"], "model.heads"),
    ("batch not divisible by accum", T + ["train.grad_accum=3"], "train.grad_accum"),
    ("path given to digits", T + ["data.path={tmp}"], "data.path"),
    ("synthetic-only key with digits", T + ["data.image_size=16"], "data.image_size"),
    ("gpt-only key with dit", T + ["model.dropout=0.2"], "model.dropout"),
    ("dit-only key with gpt", TEXT + ["model.patch_size=4"], "model.patch_size"),
    ("flow on text", TEXT + ["method.name=flow"], "method.name"),
    ("mdlm on images", T + ["method.name=mdlm"], "method.name"),
    ("ar on a bidirectional gpt", TEXT + ["model.causal=false"], "model.causal"),
    ("unknown optimizer", T + ["optim.name=adamm"], "adamw"),
    ("misspelt optimizer", T + ["optim.name=shampo"], "shampoo"),
    ("fsdp with an optimizer that cannot shard", T + ["train.parallel=fsdp", "optim.name=shampoo"], "optim.name=shampoo"),
    ("muon scope with adamw", T + ["optim.muon_scope=all_2d"], "optim.muon_scope"),
    ("wsd decay fraction zero", T + ["optim.schedule=wsd", "optim.decay_frac=0"], "optim.decay_frac"),
    ("unknown key", T + ["optim.lrr=1"], "optim.lrr"),
    ("unknown section", T + ["optimm.lr=1"], "optimm"),
    ("bad choice", T + ["data.on_device=maybe"], "data.on_device"),
    ("ema decay of one", T + ["train.ema_decay=1"], "train.ema_decay"),
    ("one beta", T + ["optim.betas=[0.9]"], "optim.betas"),
    ("beta above one", T + ["optim.betas=[0.9,1.5]"], "optim.betas"),
    ("images without a path", T + ["data.name=images"], "data.path"),
    ("images from a missing folder", T + ["data.name=images", "data.path={tmp}/nowhere"], "nowhere"),
    ("unknown device", T + ["train.device=tpu"], "train.device"),
    ("unknown model size", T + ["model.size=huge"], "model.size"),
    ("unknown preset", ["train", "no_such_preset"], "no_such_preset"),
    ("invalid toml file", ["train", "{tmp}/bad.toml"], "bad.toml"),
    ("log every zero", T + ["log.every=0"], "log.every"),
    ("ac_every without every_k", T + ["train.ac_every=3"], "train.ac_every"),
    ("synthetic tokens without vocab", TEXT + ["data.name=synthetic_tokens"], "data.vocab_size"),
    ("bad T_list", ["train", "text_mdlm", "eval.T_list=a,b"], "eval.T_list"),
    ("float8 on cpu", T + ["train.precision=float8_rowwise", "train.device=cpu"], "train.precision"),
    ("negative ce_chunk", TEXT + ["model.ce_chunk=-1"], "model.ce_chunk"),
    ("resume a missing run", ["train", "--resume", "{tmp}/missing"], "missing"),
    ("resume with a different model", ["train", "--resume", "{run}", "model.dim=48"], "model differs"),
    ("resume with a preset", ["train", "digits_flow", "--resume", "{run}"], "--resume"),
    ("sample zero", ["sample", "{run}", "--n", "0"], "--n"),
    ("sample zero steps", ["sample", "{run}", "--steps", "0"], "--steps"),
    ("sample negative cfg", ["sample", "{run}", "--cfg", "-1"], "--cfg"),
    ("sample unknown sampler", ["sample", "{run}", "--sampler", "rk45"], "rk45"),
    ("sample class out of range", ["sample", "{run}", "--class", "99"], "--class"),
    ("sample a missing run", ["sample", "{tmp}/missing"], "missing"),
    ("sample a run without checkpoints", ["sample", "{tmp}/empty_run"], "empty_run"),
    ("sample a truncated checkpoint", ["sample", "{tmp}/truncated.pt"], "truncated.pt"),
    ("sample a corrupt checkpoint", ["sample", "{tmp}/corrupt.pt"], "corrupt.pt"),
    ("sample a checkpoint of the wrong model", ["sample", "{tmp}/wrong_model.pt"], "model differs"),
    ("eval negative samples", ["eval", "{run}", "eval.num_samples=-5"], "eval.num_samples"),
    ("eval overrides the model", ["eval", "{run}", "model.dim=8"], "model.dim"),
    ("eval overrides a training-time method key", ["eval", "{run}", "method.timestep_sampler=uniform"], "method.timestep_sampler"),
    ("eval bad guidance interval", ["eval", "{run}", "method.cfg_interval=0.9,0.1"], "cfg_interval"),
    ("eval a missing run", ["eval", "{tmp}/missing"], "missing"),
    ("unknown eval metric", T + ["eval.metrics=accuracy,fidd"], "fidd"),
    ("empty eval metrics", T + ["eval.metrics=,"], "eval.metrics"),
    ("fid without weights before training", [*T[:-1], "eval.num_samples=10", "eval.metrics=fid"], "pt_inception-2015-12-05"),
    ("lpips without weights before training", [*T[:-1], "eval.num_samples=10", "eval.metrics=accuracy,lpips"], "alexnet-owt"),
    ("fid weights path missing", [*T[:-1], "eval.num_samples=10", "eval.metrics=fid", "eval.fid_weights={tmp}/none.pth"], "none.pth"),
    ("pr with fewer samples than k", [*T[:-1], "eval.num_samples=3", "eval.metrics=pr"], "eval.num_samples"),
    ("eval unknown metric", ["eval", "{run}", "eval.num_samples=10", "--metrics", "acc"], "valid choices"),
    ("eval fid without weights", ["eval", "{run}", "eval.num_samples=10", "--metrics", "fd,fid"], "pt_inception-2015-12-05"),
    ("eval lpips without weights", ["eval", "{run}", "eval.num_samples=10", "eval.lpips_net=vgg", "--metrics", "lpips"], "vgg16-397923af"),
    ("prepare mnist without files", ["data", "prepare", "mnist", "--src", "{tmp}/empty_run", "--out", "{tmp}/o"], "train-images"),
    ("prepare a corrupt cifar batch", ["data", "prepare", "cifar10", "--src", "{tmp}/cifar", "--out", "{tmp}/o", "--no-verify"], "data_batch_1"),
    ("prepare an unknown kind", ["data", "prepare", "imagenet", "--out", "{tmp}/o"], "imagenet"),
    ("prepare cifar val split", ["data", "prepare", "cifar10", "--src", "{tmp}/cifar", "--out", "{tmp}/o", "--split", "val"], "--split"),
    ("prepare text from a missing file", ["data", "prepare", "text", "--src", "{tmp}/none.txt", "--out", "{tmp}/o"], "none.txt"),
    ("sweep a missing file", ["sweep", "{tmp}/none.toml"], "none.toml"),
    ("sweep with an unknown key", ["sweep", "{tmp}/sweep_badkey.toml"], "optim.lrr"),
    ("sweep with an out-of-range value", ["sweep", "{tmp}/sweep_badlr.toml"], "optim.lr"),
    ("bench zero steps", ["bench", *TINY, "--steps", "0"], "--steps"),
    ("bench negative lr", ["bench", *TINY, "optim.lr=-1"], "optim.lr"),
    ("bench heads do not divide dim", ["bench", *TINY, "model.heads=3"], "model.heads"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tiny run plus the broken files the cases point at."""
    tmp = tmp_path_factory.mktemp("bad")
    Trainer(load_config("digits_flow", TINY + [f"train.out_dir={tmp}", "train.name=run", "train.steps=2",
                                                "eval.num_samples=0"])).fit()
    good = ckpt.list_checkpoints(tmp / "run")[-1].read_bytes()
    (tmp / "truncated.pt").write_bytes(good[: len(good) // 2])
    (tmp / "corrupt.pt").write_bytes(os.urandom(4096))
    import torch
    state = torch.load(ckpt.list_checkpoints(tmp / "run")[-1], weights_only=True)
    state["config"]["model"]["dim"] = 64  # the saved config no longer matches the weights
    torch.save(state, tmp / "wrong_model.pt")
    (tmp / "empty_run").mkdir()
    (tmp / "bad.toml").write_text("[optim\nlr = 1")
    (tmp / "cifar" / "cifar-10-batches-py").mkdir(parents=True)
    import pickle
    (tmp / "cifar" / "cifar-10-batches-py" / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"a"]}))
    for i in range(1, 6):
        (tmp / "cifar" / "cifar-10-batches-py" / f"data_batch_{i}").write_bytes(b"\x80\x04garbage")
    base = 'name = "s"\nsteps = 2\nlauncher = "cpu"\n[base]\npreset = "digits_flow"\n[[axis]]\n'
    (tmp / "sweep_badkey.toml").write_text(base + 'key = "optim.lrr"\nvalues = [1e-3]\n')
    (tmp / "sweep_badlr.toml").write_text(base + 'key = "optim.lr"\nvalues = [1e-3, -1.0]\n')
    return tmp


def snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("argv,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(world, argv, needle, capsys, monkeypatch):
    monkeypatch.chdir(world)  # default out dirs (runs/, sweeps/) land here, inside the snapshot
    argv = [a.replace("{tmp}", str(world)).replace("{run}", str(world / "run")) for a in argv]
    if argv[0] == "train" and "--resume" not in argv:
        argv.append(f"train.out_dir={world}/runs")
    before = snapshot(world)
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    assert snapshot(world) == before, "a bad input created or changed files"


def test_there_are_at_least_40_cases():
    assert len(CASES) >= 40


def test_subprocess_gives_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    r = subprocess.run([sys.executable, "-m", "genlab", "train", "text_ar", "method.name=flow", f"train.out_dir={tmp_path}"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "method.name=flow" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())


def test_unexpected_setup_exception_is_one_line_and_leaves_no_run(tmp_path, capsys, monkeypatch):
    import genlab.train.step as st  # the trainer (and bench) build the model in train/step.py

    def broken(*a, **k):
        raise RuntimeError("boom in the builder\nsecond line")
    monkeypatch.setattr(st, "build_model_and_method", broken)
    rc = main(T + [f"train.out_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "RuntimeError: boom in the builder" in err, err
    assert not any(tmp_path.iterdir())
    monkeypatch.setenv("GENLAB_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(T + [f"train.out_dir={tmp_path}"])


def test_run_that_fails_midway_says_failed_and_keeps_its_checkpoint(tmp_path, capsys, monkeypatch):
    from genlab.methods.flow import FlowMatching
    real, calls = FlowMatching.loss, {"n": 0}

    def fails_later(self, model, batch, gen):
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return real(self, model, batch, gen)
    monkeypatch.setattr(FlowMatching, "loss", fails_later)
    rc = main(T[:-2] + ["train.steps=10", "log.ckpt_every=2", "log.every=1", f"train.out_dir={tmp_path}", "train.name=f"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "out of memory" in err and len(err.splitlines()) == 1, err
    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["status"] == "failed" and "out of memory" in summary["error"] and summary["step"] == 4
    state = ckpt.load_checkpoint(tmp_path / "f")
    assert state["step"] == 4
