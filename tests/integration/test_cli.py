"""The command line end to end on a tiny config, and every bad input: one line, exit 2, nothing created."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY, cli_in_process, run_cli

from genlab.config.tree import load_config
from genlab.core.errors import GenlabError


def _one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("genlab: error:"), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("override,needles", [
    ("model.depht=3", ["unknown config key 'model.depht'", "depth"]),
    ("modle.depth=3", ["unknown config section 'modle'", "model"]),
    ("train.steps=ten", ["train.steps", "expects int"]),
    ("train.compile=fast", ["unknown compile 'fast'", "model", "off"]),
    ("model.name=unet", ["unknown model 'unet'", "dit"]),
    ("method.sampler=rk45", ["unknown sampler 'rk45'", "euler", "heun"]),
    ("train.precision=fp64", ["unknown precision 'fp64'", "bf16"]),
    ("data.name=images", ["data.path"]),
])
def test_bad_config_fails_with_one_line_and_creates_nothing(tmp_path, capfd, override, needles):
    # in-process (the CLI's main with this argv); test_unknown_preset_and_missing_dataset runs a real `python -m genlab`
    r = cli_in_process(capfd, "train", f"train.out_dir={tmp_path / 'runs'}", override, cwd=tmp_path)
    _one_line_error(r, *needles)
    assert not (tmp_path / "runs").exists()


def test_unknown_preset_and_missing_dataset(tmp_path, capfd):
    r = run_cli("train", "no_such_preset", f"train.out_dir={tmp_path / 'runs'}", cwd=tmp_path)  # a real process: exit 2
    _one_line_error(r, "config 'no_such_preset' not found", "digits_flow")
    r = cli_in_process(capfd, "train", "data.name=images", f"data.path={tmp_path / 'missing'}", f"train.out_dir={tmp_path / 'runs'}")
    _one_line_error(r, "no dataset at")
    assert not (tmp_path / "runs").exists()


def test_misspelt_preset_gets_a_did_you_mean(capfd):
    with pytest.raises(GenlabError, match=r"config 'mnist_flw' not found \(did you mean 'mnist_flow'\?\); presets: .*digits_flow"):
        load_config("mnist_flw")
    _one_line_error(cli_in_process(capfd, "config", "digit_flow"), "(did you mean 'digits_flow'?)")


def test_config_layers_and_types():
    cfg = load_config(None, ["model.depth=12", "optim.lr=3e-4", "optim.betas=[0.9,0.95]", "log.tensorboard=false"])
    assert cfg.model.depth == 12 and cfg.optim.lr == 3e-4 and cfg.optim.betas == (0.9, 0.95)
    assert cfg.log.tensorboard is False and cfg.preset == "digits_flow"
    with pytest.raises(GenlabError, match="divisible"):
        load_config(None, ["train.batch_size=10", "train.grad_accum=3"])


def test_list_prints_every_registry(capfd):
    r = cli_in_process(capfd, "list")  # test_install runs `genlab list` as a process
    assert r.returncode == 0
    from genlab.core.registry import all_registries
    for kind, reg in all_registries().items():
        assert f"{kind}:" in r.stdout
        for name in reg.names():
            assert f"  {name}" in r.stdout
    assert "digits_flow" in r.stdout


@pytest.mark.slow
def test_cli_end_to_end_train_sample_eval_resume(tmp_path, capfd):
    args = [*TINY, "train.steps=30", "log.every=10", "log.ckpt_every=20", f"train.out_dir={tmp_path}", "train.name=e2e",
            "log.tensorboard=true"]
    r = run_cli("train", *args, cwd=tmp_path)  # a real `python -m genlab train`; the later commands run in-process
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "e2e"
    assert "sample accuracy:" in r.stdout and "feature FD" in r.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and 0.0 <= summary["sample_accuracy"] <= 1.0
    assert f"{100 * summary['sample_accuracy']:.1f}%" in r.stdout
    for f in ("samples.png", "metrics.jsonl", "config.toml"):
        assert (run / f).exists(), f
    assert list(run.glob("events.out.tfevents.*")) or list(run.rglob("events.out.tfevents.*"))
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in recs if "loss" in x]
    assert steps == [10, 20, 30]
    for key in ("loss", "grad_norm", "lr", "step_time", "samples_per_s", "flops_per_step", "data_wait_frac"):
        assert key in recs[0]
    # the grid has one row per class (10 digits) and eval.grid_per_class=2 columns of 8x8 images,
    # 1-pixel gaps, upscaled 8x
    from PIL import Image
    assert Image.open(run / "samples.png").size == ((2 * 9 + 1) * 8, (10 * 9 + 1) * 8)
    # resolved config reloads to the same values
    import tomllib
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["train"]["steps"] == 30 and saved["model"]["dim"] == 32

    out = tmp_path / "grid.png"
    r = cli_in_process(capfd, "sample", str(run), "--n", "8", "--steps", "3", "--cfg", "2.0", "--class", "3", "--out", str(out))
    assert r.returncode == 0 and out.exists(), r.stderr[-2000:]
    r = cli_in_process(capfd, "sample", str(run), "--n", "8", "--class", "11", "--out", str(tmp_path / "bad.png"))
    _one_line_error(r, "--class 11")
    assert not (tmp_path / "bad.png").exists()

    r = cli_in_process(capfd, "eval", str(run), "eval.num_samples=20", "eval.sample_steps=3")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert {"sample_accuracy", "feature_fd", "step"} <= set(res) and res["step"] == 30

    # resume with more steps continues from step 30 and appends to the same metrics
    r = cli_in_process(capfd, "train", "--resume", str(run), "train.steps=40")
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in recs if "loss" in x][-1] == 40
    r = cli_in_process(capfd, "train", "--resume", str(tmp_path / "nope"))
    _one_line_error(r)


def test_frechet_distance_matches_gaussian_closed_form():
    from genlab.eval.frechet import frechet_distance
    rng = np.random.default_rng(0)
    d, n = 4, 400_000
    a = rng.standard_normal((d, d))
    s2 = a @ a.T / d + 0.5 * np.eye(d)
    mu2 = np.array([1.0, -0.5, 0.0, 2.0])
    f1 = rng.standard_normal((n, d))
    f2 = rng.multivariate_normal(mu2, s2, size=n)
    # closed form with S1 = I: ||mu||^2 + tr(I) + tr(S2) - 2 tr(S2^{1/2})
    w = np.linalg.eigvalsh(s2)
    exact = (mu2 ** 2).sum() + d + w.sum() - 2 * np.sqrt(w).sum()
    assert abs(frechet_distance(f1, f2) - exact) < 0.02 * exact
    assert abs(frechet_distance(f1, f1)) < 1e-8


@pytest.mark.slow
def test_sample_accuracy_of_real_images_is_high_and_of_noise_is_chance():
    """The metric itself: real digits labelled correctly score high, shuffled labels near chance."""
    from genlab.data.datasets import load_digits_uint8
    from genlab.data.pixels import to_model
    from genlab.eval.classifier import get_classifier, predict
    data = load_digits_uint8()
    net, val_acc = get_classifier(data, epochs=30)
    assert val_acc > 0.9
    x = to_model(torch.from_numpy(np.asarray(data.images)))
    pred = predict(net, x).argmax(-1).numpy()
    assert (pred == data.labels).mean() > 0.9
    shuffled = np.random.default_rng(0).permutation(data.labels)
    assert (pred == shuffled).mean() < 0.2


def test_eval_under_bf16_autocast(tmp_path):
    """The trainer evaluates inside its precision's autocast (bf16 on GPU): features must still reach numpy."""
    from genlab.training.trainer import Trainer
    cfg = load_config(None, TINY + ["train.steps=2", f"train.out_dir={tmp_path}", "train.name=bf16",
                                    "eval.num_samples=20", "eval.sample_steps=2"])
    tr = Trainer(cfg)
    tr._setup()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        res = tr.evaluate()
    assert 0 <= res["sample_accuracy"] <= 1 and np.isfinite(res["feature_fd"])


def test_overrides_may_follow_options():
    """`section.key=value` after an option still counts as an override (argparse alone would reject it)."""
    from genlab.cli import parse_args
    a = parse_args(["eval", "RUN", "--metrics", "fd", "eval.num_samples=9", "eval.pr_k=2"])
    assert a.run == "RUN" and a.metrics == "fd" and a.overrides == ["eval.num_samples=9", "eval.pr_k=2"]
    a = parse_args(["train", "mnist_flow", "--resume", "runs/r", "train.steps=3"])
    assert a.items == ["mnist_flow", "train.steps=3"] and a.resume == ["runs/r"]
    for bad in (["eval", "RUN", "--metrics", "fd", "--bogus"], ["eval", "RUN", "--metrics", "fd", "stray"], ["list", "a=b"]):
        with pytest.raises(SystemExit) as e:  # anything else is still argparse's usage error, exit 2
            parse_args(bad)
        assert e.value.code == 2


def test_list_describes_every_preset_and_sweep_in_one_whole_sentence_without_internal_wording(capfd):
    from conftest import cli_in_process
    r = cli_in_process(capfd, "list")
    assert r.returncode == 0
    lines = r.stdout[r.stdout.index("presets:"):].splitlines()
    entries = [ln.strip() for ln in lines if ln.startswith("  ")]
    assert len(entries) > 30
    for e in entries:
        name, _, text = e.partition(" ")
        text = text.strip()
        assert text.endswith("."), (name, text)            # a whole sentence, not a line cut mid-way
        for internal in ("issue", "seed's", "users' log"):
            assert internal not in text, (name, text)
