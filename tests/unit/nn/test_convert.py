"""Model converters: BitLinear against a hand-written reference, float8 through the registry, converters
re-applied when a run is loaded; train.init_from and method.teacher load other runs' weights."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import tiny_config

from genlab.core.errors import GenlabError
from genlab.runtime import checkpoint as ckpt
from genlab.training.trainer import Trainer

SHORT = ["train.steps=3", "log.every=1", "log.ckpt_every=0", "eval.num_samples=0", "optim.warmup_steps=1"]


def test_bitlinear_matches_the_b158_reference():
    from genlab.nn.bitlinear import to_bitlinear
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    W, b = lin.weight.detach().clone(), lin.bias.detach().clone()
    x = torch.randn(5, 16) * 3
    # reference, written out: absmean ternary weights, per-token absmax int8 activations
    s_w = W.abs().mean()
    w_q = torch.clamp(torch.round(W / s_w), -1, 1)
    s_x = 127.0 / x.abs().max(dim=1, keepdim=True).values
    x_q = torch.clamp(torch.round(x * s_x), -128, 127)
    want = (x_q @ w_q.T) / s_x * s_w + b
    bl = to_bitlinear(lin)
    xg = x.clone().requires_grad_(True)
    got = bl(xg)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert set(w_q.unique().tolist()) <= {-1.0, 0.0, 1.0}
    # straight-through estimator: the gradients of a plain linear evaluated at the quantised values
    g = torch.randn_like(got)
    got.backward(g)
    torch.testing.assert_close(bl.weight.grad, g.T @ (x_q / s_x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xg.grad, g @ (w_q * s_w), rtol=1e-5, atol=1e-5)


def test_bitlinear_converts_block_linears_only_and_keeps_state_dict_keys():
    from genlab.families.image_flow.dit import DiT, DiTSpec
    from genlab.nn.convert import apply_converters
    m = DiT(DiTSpec(image_size=8, channels=1, num_classes=10, dim=32, depth=2, heads=2))
    keys = list(m.state_dict())
    apply_converters(m, ["bitlinear"], "cpu")
    assert sum(type(x).__name__ == "BitLinear" for x in m.modules()) == 4 * 2  # qkv, proj, fc1, fc2 per block; not ada, embeddings, final
    assert list(m.state_dict()) == keys


def test_float8_converter_refuses_a_cpu_run_before_building_anything(tmp_path):
    cfg = tiny_config(tmp_path, "train.convert=[\"float8\"]", "train.name=f8", *SHORT)
    with pytest.raises(GenlabError, match="float8"):
        Trainer(cfg).fit()
    assert not (tmp_path / "f8").exists()


def test_float8_precision_names_are_aliases_of_the_converter():
    from genlab.config.tree import load_config
    from genlab.nn.convert import converters_of
    assert converters_of(load_config(None, ["train.precision=float8_rowwise"])) == ["float8_rowwise"]
    assert converters_of(load_config(None, ["train.convert=float8", "train.precision=float8_tensorwise"])) == ["float8"]


@pytest.mark.slow
def test_a_run_trained_converted_is_loaded_converted(tmp_path):
    from genlab.runs.load import load_run, sample_to_file
    Trainer(tiny_config(tmp_path, "train.convert=bitlinear", "train.name=bit", *SHORT)).fit()
    _, model, _, _, _ = load_run(tmp_path / "bit", device="cpu")
    assert sum(type(m).__name__ == "BitLinear" for m in model.modules()) == 4 * 2
    assert sample_to_file(tmp_path / "bit", n=4, steps=2, device="cpu", out=tmp_path / "s.png").exists()


def test_init_from_copies_weights_only_and_checks_shapes(tmp_path):
    Trainer(tiny_config(tmp_path, "train.name=a", *SHORT)).fit()
    src = ckpt.load_checkpoint(tmp_path / "a")
    t = Trainer(tiny_config(tmp_path, "train.name=b", f"train.init_from={tmp_path / 'a'}", *SHORT))
    t._setup()
    for k, v in src["model"].items():
        assert torch.equal(t.model.state_dict()[k], v)
    assert t.step == 0  # weights only: no step, optimizer or loader state
    bad = Trainer(tiny_config(tmp_path, "train.name=c", "model.dim=64", f"train.init_from={tmp_path / 'a'}", *SHORT))
    with pytest.raises(GenlabError, match="cannot initialise from"):
        bad.fit()


def test_init_from_an_exported_safetensors_file(tmp_path):
    from genlab.runtime.dcp import export_safetensors
    Trainer(tiny_config(tmp_path, "train.name=a", *SHORT)).fit()
    state = ckpt.load_checkpoint(tmp_path / "a")
    out = export_safetensors(state, tmp_path / "model.safetensors", ema=False)
    t = Trainer(tiny_config(tmp_path, "train.name=b", f"train.init_from={out}", *SHORT))
    t._setup()
    for k, v in state["model"].items():
        assert torch.equal(t.model.state_dict()[k], v)


def test_teacher_is_built_from_its_own_saved_config_and_frozen(tmp_path):
    from genlab.families.few_step.base import build_teacher, teacher_state
    Trainer(tiny_config(tmp_path, "train.name=t", "model.dim=48", "model.heads=3", *SHORT)).fit()
    teacher = build_teacher(teacher_state(str(tmp_path / "t")))
    ema = ckpt.load_checkpoint(tmp_path / "t")["ema"]
    assert teacher.spec.dim == 48 and not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    for k, v in ema.items():
        assert torch.equal(teacher.state_dict()[k], v)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert F.mse_loss(teacher(x, torch.rand(2), torch.zeros(2, dtype=torch.long)), x).isfinite()
    with pytest.raises(GenlabError, match="method.teacher"):
        teacher_state("")
