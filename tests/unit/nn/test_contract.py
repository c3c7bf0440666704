"""Every registered model with every layer choice that fits it, on CPU: output shape, finite gradients, and a
state-dict round trip. A new model (with an `example` in its registry spec,
plus `layer_keys`, the model.* layer keys it reads, `grid_rank` when it reads model.pos_emb, and `option_cases`,
other model.* options to cover one at a time) or a new attention/mlp/norm/position entry is tested here without a
new test. A layer a model cannot use (an MLP that needs a patch grid in a model without one) must be refused with
a one-line GenlabError when the model is built."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from genlab.config.tree import ModelConfig
from genlab.core.errors import GenlabError
from genlab.families.models import model_registry
from genlab.nn.attention_spec import attention_registry
from genlab.nn.mlp import mlp_registry
from genlab.nn.norm import norm_registry
from genlab.nn.positions import fitting_positions

BASE = dict(dim=32, depth=3, heads=2, size="tiny")  # depth 3: one U-ViT long skip (block 0 -> block 2)


def cases():
    out = []
    for model, spec in model_registry.specs():
        rank = spec.grid_rank
        axes = {"attention": attention_registry.names(), "mlp": mlp_registry.names(), "norm": norm_registry.names(),
                "pos_emb": fitting_positions(rank) if rank else ["auto"]}
        out.append(pytest.param(model, "size", "tiny", id=f"{model}-defaults"))
        for key in spec.layer_keys:  # one axis at a time from the defaults: every choice, not every product
            out += [pytest.param(model, key, name, id=f"{model}-{key}={name}") for name in axes[key]]
        for key, values in ((spec.example.option_cases if spec.example else None) or {}).items():
            out += [pytest.param(model, key, v, id=f"{model}-{key}={v}") for v in values]
    return out


def _refused(model, key, name):
    """Layer choices the model cannot use: an MLP that convolves over the patch grid in a model without one."""
    rank = model_registry.spec(model).grid_rank
    return key == "mlp" and mlp_registry.spec(name).needs_grid and rank != 2


def build(model, key, name, seed):
    spec = model_registry.spec(model)
    if spec.example is None:
        pytest.fail(f"model {model} declares no `example` (registry.ModelExample) for the contract test")
    torch.manual_seed(seed)
    cfg = dataclasses.replace(ModelConfig(name=model, **BASE), **{key: name})
    return spec.builder(cfg, spec.example.spec), spec.example


def inputs(b, B=3):
    return b.inputs(b.spec, B, torch.Generator().manual_seed(1))


def _cpu_ok(key, name):
    if key == "attention":
        check = attention_registry.spec(name).check
        try:
            check and check(BASE["dim"] // BASE["heads"], "cpu")
        except GenlabError as e:
            pytest.skip(f"attention {name} cannot run on this machine: {e}")


@pytest.mark.parametrize("model,key,name", cases())
def test_model_with_layer_choice_keeps_the_contract(model, key, name):
    _cpu_ok(key, name)
    if _refused(model, key, name):
        with pytest.raises(GenlabError) as e:
            build(model, key, name, seed=0)
        assert "\n" not in str(e.value) and name in str(e.value)
        return
    m, b = build(model, key, name, seed=0)
    x = inputs(b)
    backward_ok = key != "attention" or attention_registry.spec(name).cpu_backward
    if not backward_ok:  # e.g. FlexAttention: no CPU backward in torch, so its forward is held to sdpa's
        ref, _ = build(model, key, "sdpa", seed=0)
        ref.load_state_dict(m.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(m.eval()(*x), ref.eval()(*x), rtol=1e-4, atol=1e-5)
        return
    with torch.no_grad():  # zero-initialised layers (adaLN-Zero) would stop every gradient behind them
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    out = m(*x)
    assert tuple(out.shape) == tuple(b.output_shape(b.spec, 3))
    out.float().square().mean().backward()
    named = [(n, p.grad) for n, p in m.named_parameters() if p.requires_grad]
    assert named and all(g is not None and torch.isfinite(g).all() for _, g in named)
    assert all(g.abs().sum() > 0 for n, g in named if n not in b.idle_params), [n for n, g in named if g.abs().sum() == 0]
    other, _ = build(model, key, name, seed=1)  # different init, then the saved state: identical outputs
    other.load_state_dict(m.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(other.eval()(*x), m.eval()(*x), rtol=0, atol=0)
