"""`genlab sample` of text runs: samples printed with the file's path, --length, defaults in --help."""
from __future__ import annotations

import pytest
from conftest import cli_in_process

LM = ["model.dim=32", "model.depth=2", "model.heads=2", "data.seq_len=32", "train.batch_size=8", "train.steps=2",
      "log.progress=false", "log.tensorboard=false", "log.ckpt_every=0", "eval.num_samples=0", "log.sample_every=0",
      "method.sample_len=24"]


@pytest.fixture(scope="module")
def text_runs(tmp_path_factory):
    """Two-step autoregressive and mdlm runs on the embedded corpus (seconds)."""
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("text_runs")
    for preset, name in (("text_ar", "ar"), ("text_mdlm", "md")):
        Trainer(load_config(preset, LM + [f"train.out_dir={out}", f"train.name={name}"])).fit()
    return out


@pytest.mark.parametrize("run", ["ar", "md"])
def test_sample_prints_the_first_texts_and_the_file_and_takes_a_length(text_runs, tmp_path, capfd, run):
    out = tmp_path / "s.txt"
    r = cli_in_process(capfd, "sample", str(text_runs / run), "--n", "5", "--length", "12", "--steps", "4",
                       "--out", str(out))
    assert r.returncode == 0, r.stderr
    from genlab.families.lm.common import read_samples
    texts = read_samples(out)
    assert len(texts) == 5 and {len(t) for t in texts} == {12}  # char tokenizer: 12 tokens are 12 characters
    shown = "".join(f"===== sample {i} =====\n{t}\n" for i, t in enumerate(texts[:3]))
    assert r.stdout == shown + f"wrote {out} (5 samples; the first 3 above)\n"


def test_sample_length_defaults_to_method_sample_len(text_runs, tmp_path, capfd):
    r = cli_in_process(capfd, "sample", str(text_runs / "ar"), "--n", "2", "--out", str(tmp_path / "d.txt"))
    assert r.returncode == 0, r.stderr
    from genlab.families.lm.common import read_samples
    assert [len(t) for t in read_samples(tmp_path / "d.txt")] == [24, 24]
    # autoregressive: the context slides, so a length past data.seq_len (32) is fine
    r = cli_in_process(capfd, "sample", str(text_runs / "ar"), "--n", "1", "--length", "40", "--out", str(tmp_path / "l.txt"))
    assert r.returncode == 0 and len(read_samples(tmp_path / "l.txt")[0]) == 40, r.stderr


@pytest.mark.parametrize("run,length,expect", [
    ("ar", "0", "--length must be >= 1, got 0"),
    ("md", "-3", "--length must be >= 1, got -3"),
    ("md", "33", "sample length must be 1..32 for mdlm"),
    ("digits", "10", "--length is for text runs (methods autoregressive, mdlm); this run's method is flow"),
])
def test_sample_bad_length_is_one_line_and_writes_nothing(text_runs, tmp_path, capfd, run, length, expect):
    if run == "digits":
        from conftest import TINY

        from genlab.config.tree import load_config
        from genlab.training.trainer import Trainer
        Trainer(load_config("digits_flow", TINY + [f"train.out_dir={tmp_path}", "train.name=digits", "train.steps=1",
                                                   "eval.num_samples=0", "log.sample_every=0"])).fit()
        path = tmp_path / run
    else:
        path = text_runs / run
    out = tmp_path / "bad.txt"
    r = cli_in_process(capfd, "sample", str(path), "--length", length, "--out", str(out))
    assert r.returncode == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists() and not out.with_suffix(".png").exists()


def test_sample_help_shows_defaults(capfd):
    r = cli_in_process(capfd, "sample", "--help")
    assert r.returncode == 0
    flat = " ".join(r.stdout.split())
    for s in ("(default: 64)", "--length LENGTH", "(default: the run's method.sample_len, else data.seq_len)",
              "(default: 0)", "(default: auto)", "(default: the run's method.sample_steps)"):
        assert s in flat, s


@pytest.mark.parametrize("cmd", [["sample"], ["eval"], ["train", "--resume"]])
def test_a_run_path_that_does_not_exist_is_reported_as_missing(tmp_path, capfd, cmd):
    r = cli_in_process(capfd, *cmd, str(tmp_path / "no_such_run"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"genlab: error: '{tmp_path / 'no_such_run'}' does not exist; give a run folder, "
                                             "a checkpoint file (step_N.pt) or an exported folder"]
