"""`genlab export RUN --out DIR`: a self-describing folder (config.toml, model.safetensors, genlab.json, README.md)
that `genlab sample DIR` and `genlab.load_run(DIR)` load and sample from exactly as from the run."""
from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
import torch
from conftest import cli_in_process, tiny_config

import genlab
from genlab.cli import main


class Payload:
    """What a malicious file carries: unpickling it calls os.system."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory):
    """A tiny flow run on digits (EMA on) and its exported folder."""
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("flow")
    Trainer(tiny_config(out, "train.name=run", "train.steps=4", "log.ckpt_every=0", "eval.num_samples=0",
                        "log.sample_every=0")).fit()
    assert main(["export", str(out / "run"), "--out", str(out / "export")]) == 0
    return out / "run", out / "export"


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A tiny char-level GPT (text_ar: head tied to the embedding) and its exported folder."""
    out = tmp_path_factory.mktemp("gpt")
    lm = ["model.dim=32", "model.depth=1", "model.heads=2", "data.seq_len=16", "train.batch_size=8", "log.progress=false",
          "log.tensorboard=false", "eval.num_samples=0", "train.steps=2", f"train.out_dir={out}", "train.name=run"]
    assert main(["train", "text_ar", *lm]) == 0
    assert main(["export", str(out / "run"), "--out", str(out / "export")]) == 0
    return out / "run", out / "export"


def _files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_the_folder_holds_config_weights_card_and_meta(flow_run):
    from genlab.config.tree import load_config, to_dict
    from genlab.runtime.checkpoint import config_of, load_checkpoint
    run, exp = flow_run
    assert sorted(_files(exp)) == ["README.md", "config.toml", "genlab.json", "model.safetensors"]
    assert not list(exp.parent.glob("*.partial"))
    src = load_checkpoint(run)
    meta = json.loads((exp / "genlab.json").read_text())
    assert meta["format"] == "genlab-export" and meta["weights"] == "ema" and meta["step"] == src["step"] == 4
    # config.toml is the run's full config, loadable by genlab's own loader (`genlab train DIR/config.toml`)
    assert to_dict(load_config(str(exp / "config.toml"))) == to_dict(config_of(src))
    loaded = load_checkpoint(exp)
    assert loaded["model"].keys() == src["ema"].keys()
    for k, v in src["ema"].items():
        assert torch.equal(loaded["model"][k], v), k


def test_the_folder_samples_identically_to_the_run(flow_run, tmp_path, capfd):
    run, exp = flow_run
    a, b = genlab.load_run(run, device="cpu"), genlab.load_run(exp, device="cpu")
    assert b.step == a.step and b.config.model.name == "dit"
    assert torch.equal(b.sample(n=6, seed=3, steps=4), a.sample(n=6, seed=3, steps=4))
    for src, png in ((run, "a.png"), (exp, "b.png")):
        r = cli_in_process(capfd, "sample", src, "--n", "4", "--seed", "5", "--steps", "3", "--device", "cpu",
                           "--out", tmp_path / png)
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


def test_no_ema_exports_the_raw_weights(flow_run, tmp_path):
    from genlab.runtime.checkpoint import load_checkpoint
    run, _ = flow_run
    assert main(["export", str(run), "--out", str(tmp_path / "raw"), "--no-ema"]) == 0
    src, got = load_checkpoint(run), load_checkpoint(tmp_path / "raw")
    assert json.loads((tmp_path / "raw" / "genlab.json").read_text())["weights"] == "model"
    assert any(not torch.equal(src["model"][k], src["ema"][k]) for k in src["model"])  # the test can tell them apart
    for k, v in src["model"].items():
        assert torch.equal(got["model"][k], v), k


def test_a_tied_gpt_stores_the_tie_once_and_loads_it_back_tied(gpt_run):
    from safetensors import safe_open
    run, exp = gpt_run
    with safe_open(str(exp / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert "tok_emb.weight" in stored and "head.weight" not in stored
    a, b = genlab.load_run(run, device="cpu"), genlab.load_run(exp, device="cpu")
    assert b.model.head.weight is b.model.tok_emb.weight
    assert b.model.head.weight.data_ptr() == b.model.tok_emb.weight.data_ptr()
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(b.model) == count(a.model) == json.loads((exp / "genlab.json").read_text())["parameters"]
    x = torch.randint(0, b.spec["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(b.model(x), a.model(x))
    assert b.sample(n=2, seed=1, text=True) == a.sample(n=2, seed=1, text=True)


def test_an_existing_folder_is_refused_without_force_and_unchanged(flow_run, tmp_path, capfd):
    run, exp = flow_run
    mine = tmp_path / "export"
    shutil.copytree(exp, mine)
    before = _files(mine)
    r = cli_in_process(capfd, "export", run, "--out", mine, "--no-ema")
    assert r.returncode == 2 and "--force" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _files(mine) == before
    other = tmp_path / "notes"  # not an export: --force does not delete it
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    r = cli_in_process(capfd, "export", run, "--out", other, "--force")
    assert r.returncode == 2 and "not a genlab export folder" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert _files(other) == {"keep.txt": b"mine"}
    r = cli_in_process(capfd, "export", run, "--out", mine, "--no-ema", "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads((mine / "genlab.json").read_text())["weights"] == "model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "notes"]  # no .partial / .old left


def test_the_card_has_hub_metadata_the_runs_metrics_and_command(flow_run):
    yaml = pytest.importorskip("yaml")
    run, exp = flow_run
    card = (exp / "README.md").read_text()
    assert card.startswith("---\n")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "genlab" and {"genlab", "flow", "dit"} <= set(front["tags"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["loss"] is not None
    for key in ("loss", "samples_per_s", "step_time"):
        assert f"| {key} | {summary[key]:.6g} |" in card
    assert "genlab train digits_flow " in card and "train.steps=4" in card and "train.out_dir" not in card
    assert "parameters: " in card and "digits" in card and "steps: 4" in card
    assert "genlab sample ." in card and 'genlab.load_run(".")' in card and "hf upload " in card


def test_the_card_parses_as_a_hub_model_card(flow_run):
    hub = pytest.importorskip("huggingface_hub")
    card = hub.ModelCard((flow_run[1] / "README.md").read_text())
    assert card.data.library_name == "genlab" and "genlab" in card.data.tags


def _one_line_error(capfd, folder, tmp_path, want):
    r = cli_in_process(capfd, "sample", folder, "--n", "2", "--device", "cpu", "--out", tmp_path / "g.png")
    assert r.returncode == 2 and want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "g.png").exists()


def test_a_changed_or_missing_weights_file_is_a_one_line_error(flow_run, tmp_path, capfd):
    _, exp = flow_run
    d = tmp_path / "x"
    shutil.copytree(exp, d)
    w = d / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit of a weight: still a valid file, but not the exported one
    w.write_bytes(bytes(data))
    _one_line_error(capfd, d, tmp_path, "does not match the sha256")
    meta = json.loads((d / "genlab.json").read_text())
    meta.pop("sha256")  # without the checksum, a cut file is still caught by the safetensors reader
    (d / "genlab.json").write_text(json.dumps(meta))
    w.write_bytes(bytes(data[: len(data) // 2]))
    _one_line_error(capfd, d, tmp_path, "cannot read")
    w.unlink()
    _one_line_error(capfd, d, tmp_path, "model.safetensors is missing")


def test_weights_with_an_unexpected_or_missing_key_are_refused_in_one_line(flow_run, tmp_path, capfd):
    from safetensors.torch import load_file, save_file
    _, exp = flow_run
    for change in ("extra", "missing"):
        d = tmp_path / change
        shutil.copytree(exp, d)
        t = load_file(str(d / "model.safetensors"))
        if change == "extra":
            t["stray.weight"] = torch.zeros(2)
        else:
            t.pop(sorted(t)[0])
        save_file(t, str(d / "model.safetensors"))
        meta = json.loads((d / "genlab.json").read_text())
        meta.pop("sha256")
        (d / "genlab.json").write_text(json.dumps(meta))
        _one_line_error(capfd, d, tmp_path, "the model differs from the checkpoint")


def test_a_pickle_in_the_folder_is_never_unpickled(flow_run, tmp_path, capfd):
    run, exp = flow_run
    marker = tmp_path / "pwned"
    d = tmp_path / "x"
    shutil.copytree(exp, d)
    for name in ("model.pt", "pytorch_model.bin", "checkpoints/step_00000009.pt"):
        (d / name).parent.mkdir(exist_ok=True)
        (d / name).write_bytes(pickle.dumps(Payload(marker)))
    got = genlab.load_run(d, device="cpu")
    assert torch.equal(got.sample(n=2, seed=0, steps=2), genlab.load_run(run, device="cpu").sample(n=2, seed=0, steps=2))
    (d / "model.safetensors").unlink()  # the folder's weights gone: an error, never a fall-back to the pickles
    _one_line_error(capfd, d, tmp_path, "model.safetensors is missing")
    assert not marker.exists()


def test_resuming_an_export_is_refused_in_one_line(flow_run, capfd):
    r = cli_in_process(capfd, "train", "--resume", flow_run[1])
    assert r.returncode == 2 and "is an export" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_commands_that_take_a_run_take_the_folder(flow_run, tmp_path, capfd):
    from genlab.runtime.checkpoint import config_of, load_checkpoint
    from genlab.training.step import build_model_and_method, init_weights_from
    run, exp = flow_run
    d = tmp_path / "export"
    shutil.copytree(exp, d)
    src = load_checkpoint(run)
    model, _ = build_model_and_method(config_of(src), src["data_spec"])
    init_weights_from(model, str(d))  # train.init_from=DIR
    assert all(torch.equal(model.state_dict()[k], v) for k, v in src["ema"].items())
    r = cli_in_process(capfd, "quantize", d, "--to", "int8")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "export_int8").is_dir()  # next to the folder, not above it
