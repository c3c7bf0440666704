"""`train.graph_step` (the whole step captured as one CUDA graph, training/graph_step.py). On the CPU: what it refuses
(one line, exit 2, nothing written), its eager warm-up steps against the plain step, and the optimizer made
capturable after a resume. The capture and replay against eager steps run on the GPU (tests/integration/test_gpu.py)."""
from __future__ import annotations

import pytest
import torch
from conftest import cli_in_process, tiny_config

from genlab.core.errors import GenlabError
from genlab.training.graph_step import WARMUP_STEPS, make_capturable


@pytest.mark.parametrize("overrides,expect", [
    (["train.compile_mode=reduce-overhead", "train.compile=model"], "train.compile_mode=reduce-overhead"),
    (["train.compile_optimizer=true"], "train.compile_optimizer=True"),
    (["train.grad_accum=2"], "train.grad_accum=2"),
    (["train.skip_nonfinite=true"], "train.skip_nonfinite=True"),
    (["train.precision=fp16"], "train.precision=fp16"),
    (["optim.name=sgd"], "optim.name=sgd"),
    (["train.activation_checkpointing=full"], "train.activation_checkpointing=full"),
    (["train.seeds=0,1"], "batched seeds"),
    (["method.timestep_sampler=adaptive"], "method.timestep_sampler=adaptive"),
])
def test_graph_step_refuses_what_a_capture_cannot_hold(tmp_path, monkeypatch, overrides, expect):
    """As if on a CUDA machine (the CPU refusal comes first otherwise): each unsupported option is named."""
    import genlab.config.check as cc
    monkeypatch.setattr(cc, "_trains_on_cpu", lambda device: False)
    with pytest.raises(GenlabError, match="graph_step") as e:
        tiny_config(tmp_path, "train.graph_step=true", *overrides)
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_graph_step_refuses_a_method_that_does_not_declare_it(tmp_path, monkeypatch):
    import genlab.config.check as cc
    monkeypatch.setattr(cc, "_trains_on_cpu", lambda device: False)
    with pytest.raises(GenlabError, match=r"method maskdit \(methods that do: .*flow"):
        tiny_config(tmp_path, "train.graph_step=true", "method.name=maskdit", "model.name=maskdit")


def test_graph_step_on_the_cpu_is_one_line_and_writes_nothing(tmp_path, capfd):
    r = cli_in_process(capfd, "train", "digits_flow", "train.graph_step=true", "train.steps=2",
                       f"train.out_dir={tmp_path}", "train.name=g")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "CUDA graphs need a CUDA device" in r.stderr, r.stderr
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("method", [(), ("method.name=repa", "method.repa_hidden=32", "method.repa_lr=3e-3")],
                         ids=["flow", "repa"])
def test_graph_steps_warm_up_equals_the_plain_step(tmp_path, one_thread, method):
    """The captured region is GraphedStep._body, a step of its own (LR and EMA weight from device tensors, clip,
    optimizer, EMA): its eager warm-up steps must leave the same weights, EMA and losses as TrainStep's plain step.
    repa: the projector is a param group of the model's optimizer with its own LR (lr_scale), trained in the step too."""
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.trainer import Trainer
    common = (f"train.steps={WARMUP_STEPS}", "train.ema_decay=0.9", "train.ema_warmup=true", "optim.grad_clip=0.05",
              f"log.ckpt_every={WARMUP_STEPS}", "log.every=1", "eval.num_samples=0", "train.device=cpu", *method)
    plain = Trainer(tiny_config(tmp_path, *common, "train.name=plain"))
    plain.fit()
    cfg = tiny_config(tmp_path, *common, "train.name=graphed")
    cfg.train.graph_step = "true"  # past the CUDA-only check: only the warm-up runs, which is eager
    graphed = Trainer(cfg)
    graphed.fit()
    g = graphed.steps.graphed
    assert g is not None and g.eager_steps == WARMUP_STEPS and g.graph is None
    a, b = ckpt.load_checkpoint(tmp_path / "plain"), ckpt.load_checkpoint(tmp_path / "graphed")
    parts = [(a[p], b[p], p) for p in ("model", "ema")]
    parts += [(a["extras"][n], b["extras"][n], n) for n in a.get("extras", {})]
    assert method == () or "projector" in a["extras"]
    for ref, got, part in parts:
        for k, v in ref.items():
            torch.testing.assert_close(got[k], v, rtol=1e-6, atol=1e-7, msg=f"{part}.{k}")
    import json
    losses = [[json.loads(line)["loss"] for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()
               if '"loss"' in line] for n in ("plain", "graphed")]
    assert len(losses[0]) == WARMUP_STEPS and losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_make_capturable_puts_lr_and_step_counts_on_the_device_after_a_resume():
    """A resumed state dict brings float LRs and host step counts back; the capture needs both on the device."""
    w = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.AdamW([w], lr=1e-3)
    w.grad = torch.ones(3)
    opt.step()
    opt.load_state_dict(opt.state_dict())
    make_capturable(opt, torch.device("cpu"))
    g = opt.param_groups[0]
    assert torch.is_tensor(g["lr"]) and g["lr"].item() == pytest.approx(1e-3) and g["capturable"] is True
    assert opt.state[w]["step"].dtype == torch.float32


# -- train.graph_step=auto (the default): decided per run, kept in config.toml ---------------------------------------
@pytest.mark.parametrize("overrides,graph,said", [
    ([], "true", "the whole step runs as one CUDA graph"),
    (["optim.name=sgd"], "false", "the plain step (does not support optim.name=sgd)"),
    (["method.timestep_sampler=adaptive"], "false", "does not support method.timestep_sampler=adaptive"),
    (["method.name=maskdit", "model.name=maskdit"], "false", "does not support method maskdit"),
    (["train.seeds=0,1"], "false", "batched seeds"),
])
def test_auto_takes_the_graph_wherever_the_run_supports_it(tmp_path, monkeypatch, overrides, graph, said):
    """As if on a CUDA machine: auto becomes true, or false with one line naming what the capture cannot hold (the
    same check as train.graph_step=true, which would refuse these configs before any work)."""
    import genlab.config.check as cc
    from genlab.training.graph_step import decide
    monkeypatch.setattr(cc, "_trains_on_cpu", lambda device: False)
    cfg = tiny_config(tmp_path, *overrides)
    assert cfg.train.graph_step == "auto"  # the default
    on, note = decide(cfg, world=1)
    assert on == (graph == "true") and note.startswith("train.graph_step=auto: ") and said in note, note
    assert "\n" not in note and "supported:" not in note
    assert cfg.train.graph_step == "auto"  # the config keeps auto: a resume elsewhere decides for its machine


def test_auto_is_the_plain_step_on_several_processes_and_silent_on_the_cpu(tmp_path, monkeypatch):
    import genlab.config.check as cc
    from genlab.training.graph_step import decide
    assert decide(tiny_config(tmp_path, "train.device=cpu"), world=1) == (False, None)
    monkeypatch.setattr(cc, "_trains_on_cpu", lambda device: False)
    on, note = decide(tiny_config(tmp_path), world=2)
    assert not on and "2 processes" in note
    # an explicit choice is taken as it is, without a note (true was checked with the config)
    assert decide(tiny_config(tmp_path, "train.graph_step=false"), world=1) == (False, None)
    assert decide(tiny_config(tmp_path, "train.graph_step=true"), world=1) == (True, None)


def test_a_run_says_autos_decision_and_keeps_the_note_in_its_config(tmp_path, monkeypatch, one_thread, capfd):
    """The trainer prints the decision and keeps the note at the top of config.toml; on a pretend-CUDA machine the
    GraphedStep is built (its eager warm-up steps run here, on the CPU); a resume on the CPU takes the plain step."""
    import genlab.config.check as cc
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer
    plain = Trainer(tiny_config(tmp_path, "train.steps=2", "eval.num_samples=0", "train.name=cpu"))
    plain.fit()
    assert plain.steps.graphed is None and "graph_step" not in capfd.readouterr().err
    text = (tmp_path / "cpu" / "config.toml").read_text()
    assert 'graph_step = "auto"' in text and "# note" not in text
    monkeypatch.setattr(cc, "_trains_on_cpu", lambda device: False)
    t = Trainer(tiny_config(tmp_path, f"train.steps={WARMUP_STEPS}", "eval.num_samples=0", "train.name=auto"))
    t.fit()
    assert t.steps.graphed is not None and t.steps.graphed.eager_steps == WARMUP_STEPS
    assert "genlab: note: train.graph_step=auto: the whole step runs as one CUDA graph" in capfd.readouterr().err
    text = (tmp_path / "auto" / "config.toml").read_text()
    assert text.startswith("# note: train.graph_step=auto: the whole step") and 'graph_step = "auto"' in text
    assert load_config(str(tmp_path / "auto" / "config.toml")).train.graph_step == "auto"
    monkeypatch.undo()  # back on the CPU: the resume decides for this machine
    r = Trainer(tiny_config(tmp_path, f"train.steps={WARMUP_STEPS + 1}", "eval.num_samples=0", "train.name=auto"),
                resume=str(tmp_path / "auto"))
    assert r.fit()["status"] == "finished" and r.steps.graphed is None


def test_graph_step_keeps_loading_the_bool_of_older_configs(tmp_path):
    """Runs saved before auto hold `graph_step = false` (a TOML bool): they load, sample and resume as before."""
    from genlab.config.tree import load_config
    from genlab.config.tree import Config, apply_dict
    for value, want in ((True, "true"), (False, "false")):  # a TOML bool, as tomllib reads it
        assert apply_dict(Config(), {"train": {"graph_step": value}}).train.graph_step == want
    with pytest.raises(GenlabError, match="expects str"):  # a free text key still refuses a bool
        apply_dict(Config(), {"train": {"name": True}})
    p = tmp_path / "old.toml"
    p.write_text('preset = "digits_flow"\n[train]\ngraph_step = false\n')
    assert load_config(str(p)).train.graph_step == "false"
    with pytest.raises(GenlabError, match=r"train.graph_step.*auto.*true.*false"):
        tiny_config(tmp_path, "train.graph_step=maybe")
