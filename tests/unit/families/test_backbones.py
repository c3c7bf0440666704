"""Image backbones (dit, dit_incontext pre/post-LN, mmdit, the DiT+MMDiT hybrid) x attention x options: shapes,
gradients, exact FLOPs against torch.utils.flop_counter, training on digits, Mix-FFN and long skips against
references, parameter matching, and one-line errors for combinations that cannot work."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import genlab.nn.attention as attention_kernels
from genlab.config.tree import ModelConfig, load_config
from genlab.core.errors import GenlabError
from genlab.families.models import model_registry
from genlab.lab.match import match_params, param_count, reference_params
from genlab.nn.mlp import MixFFN, TokenGrid

SPEC = {"kind": "image", "image_size": 8, "channels": 3, "num_classes": 5}
TINY = dict(dim=32, depth=3, heads=2, size="tiny")  # depth 3: one long skip (block 0 -> block 2)
# (registry entry, extra options): every backbone the issue lists
BACKBONES = {"dit": {}, "incontext_pre": {"name": "dit_incontext"},
             "incontext_post": {"name": "dit_incontext", "ln_placement": "post"},
             "mmdit": {"name": "mmdit"}, "hybrid": {"name": "mmdit", "dual_blocks": 1}}
ATTENTIONS = ["sdpa", "math", "sigmoid", "differential", "linear"]  # flex: forward only on CPU (test below)
OPTIONS = list(itertools.product([False, True], ["sincos2d", "rope2d"], ["gelu", "swiglu", "mixffn"], [False, True]))


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (conftest)


def model_cfg(backbone, **kw):
    opts = {"name": "dit", **BACKBONES[backbone]}
    return ModelConfig(**{**TINY, **opts, **kw})


def build(cfg, seed=0):
    torch.manual_seed(seed)
    return model_registry.get(cfg.name)(cfg, SPEC)


def inputs(B=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, 3, 8, 8, generator=g), torch.rand(B, generator=g), torch.randint(0, 6, (B,), generator=g))


def _check_shapes_and_gradients(backbone, attention, qk_norm, pos, mlp, skips):
    m = build(model_cfg(backbone, attention=attention, qk_norm=qk_norm, pos_emb=pos, mlp=mlp, long_skips=skips))
    with torch.no_grad():  # off the zero init (adaLN-Zero, zero heads), or no gradient reaches the blocks
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    out = m(*inputs())
    assert out.shape == (2, 3, 8, 8)
    out.square().mean().backward()
    dead = [n for n, p in m.named_parameters()
            if p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0]
    assert not dead, (attention, qk_norm, pos, mlp, skips, dead)


@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_every_option_combination_has_shapes_and_finite_gradients(backbone):
    """qk_norm x (sincos2d | rope2d) x (gelu | swiglu | mixffn) x long_skips: all 24 per backbone (softmax)."""
    for opts in OPTIONS:
        _check_shapes_and_gradients(backbone, "sdpa", *opts)


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_every_attention_in_every_backbone_has_shapes_and_finite_gradients(backbone, attention):
    """Each backbone x attention pair with 6 of the 24 option sets, rotated so every pair meets every value of every
    option (the full 5 x 5 x 24 product costs minutes on the shared CPU)."""
    k = ATTENTIONS.index(attention) + 5 * list(BACKBONES).index(backbone)
    for opts in [OPTIONS[(k + 5 * j) % 24] for j in range(6)]:  # each value of each option at least once
        _check_shapes_and_gradients(backbone, attention, *opts)


@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_state_dict_round_trip_with_all_options(backbone):
    cfg = model_cfg(backbone, attention="differential", qk_norm=True, pos_emb="rope2d", mlp="mixffn", long_skips=True)
    a, b = build(cfg, seed=0), build(cfg, seed=1)
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.02 * torch.randn_like(p))
    b.load_state_dict(a.state_dict())
    x = inputs()
    with torch.no_grad():
        torch.testing.assert_close(b(*x), a(*x), rtol=0, atol=0)


@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_flex_forward_matches_sdpa(backbone):
    """FlexAttention has no CPU backward: its forward is held to SDPA's inside every backbone."""
    a = build(model_cfg(backbone, attention="flex"))
    b = build(model_cfg(backbone, attention="sdpa"))
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.02 * torch.randn_like(p))
        b.load_state_dict(a.state_dict())
        torch.testing.assert_close(a(*inputs()), b(*inputs()), rtol=1e-4, atol=1e-5)


# -- FLOPs -------------------------------------------------------------------------------------------------------
# FlopCounterMode counts matmuls (mm/addmm/bmm, SDPA when it dispatches to a counted kernel) and convolutions; it does
# not count element-wise work (norms, softmax, sigmoid, GELU/SiLU, modulation, RoPE, residual adds, the linear
# attention's cumsum) or the differential lambda's 1-D dot products, and neither do the analytic counts. CPU SDPA's
# fused kernel is invisible to it, so SDPA (also inside differential attention) is routed through `math`, the same
# formula in counted matmuls; FlexAttention cannot run under the counter on CPU at all (its count is softmax's).
# Tolerance: none, the counts must be equal.
@pytest.mark.parametrize("attention", ["sdpa", "sigmoid", "differential", "linear"])
@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_analytic_flops_match_flop_counter(backbone, attention, monkeypatch):
    monkeypatch.setattr(attention_kernels, "sdpa_attention", attention_kernels.math_attention)
    name = "math" if attention == "sdpa" else attention
    for mlp, skips in [("gelu", False), ("mixffn", True), ("swiglu", True)]:
        m = build(model_cfg(backbone, attention=name, mlp=mlp, long_skips=skips, depth=4))
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            m(*inputs(B=3))
        assert fc.get_total_flops() == 3 * m.flops_per_sample(), (mlp, skips)


def test_linear_attention_flops_grow_linearly_and_differential_costs_one_and_a_half_softmax():
    f = {n: attention_kernels.attention_flops(n, 4096, 4096, 12, 64) for n in ("sdpa", "linear", "differential")}
    assert f["differential"] == 1.5 * f["sdpa"]  # two maps at half width, two weighted sums at full width
    assert attention_kernels.attention_flops("linear", 8192, 8192, 12, 64) == 2 * f["linear"]
    assert attention_kernels.attention_flops("sdpa", 8192, 8192, 12, 64) == 4 * f["sdpa"]


# -- behaviour against references ---------------------------------------------------------------------------------
def test_mixffn_matches_its_convolutional_form():
    """1x1 conv (SiLU) -> 3x3 depthwise -> GLU -> 1x1 conv on the image layout, in float64."""
    torch.manual_seed(0)
    ffn = MixFFN(6, 5).double()
    B, gh, gw = 2, 3, 4
    img = torch.randn(B, 6, gh, gw, dtype=torch.float64)
    h = F.silu(F.conv2d(img, ffn.fc1.weight[:, :, None, None], ffn.fc1.bias))
    h = F.conv2d(h, ffn.dw.weight, ffn.dw.bias, padding=1, groups=10)
    a, gate = h.chunk(2, dim=1)
    ref = F.conv2d(a * F.silu(gate), ffn.fc2.weight[:, :, None, None], ffn.fc2.bias)
    tokens = img.flatten(2).transpose(1, 2)
    out = ffn(tokens, grid=TokenGrid(0, gh, gw))
    torch.testing.assert_close(out, ref.flatten(2).transpose(1, 2))
    # two conditioning tokens in front: the grid's tokens are unchanged, the prefix takes the pointwise path only
    prefix = torch.randn(B, 2, 6, dtype=torch.float64)
    both = ffn(torch.cat([prefix, tokens], 1), grid=TokenGrid(2, gh, gw))
    torch.testing.assert_close(both[:, 2:], out)
    pre = F.silu(ffn.fc1(prefix))
    torch.testing.assert_close(both[:, :2], ffn.fc2(pre[..., :5] * F.silu(pre[..., 5:])))
    with pytest.raises(GenlabError, match="grid"):
        ffn(tokens)


@pytest.mark.parametrize("backbone", list(BACKBONES))
def test_long_skips_start_as_the_plain_backbone(backbone):
    """The skip projections start as [I | 0]: with the same block weights, the output equals the model without skips."""
    plain, skip = build(model_cfg(backbone, depth=5)), build(model_cfg(backbone, depth=5, long_skips=True))
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.02 * torch.randn_like(p))
    missing, _ = skip.load_state_dict(plain.state_dict(), strict=False)
    assert missing and all("skips.proj" in k for k in missing)
    assert {k.split(".")[-2] for k in missing if k.startswith("skips.")} == {"3", "4"}  # blocks 3, 4 <- 1, 0
    with torch.no_grad():
        torch.testing.assert_close(skip(*inputs()), plain(*inputs()))


def test_mmdit_dual_blocks_equal_to_depth_is_pure_mmdit_and_hybrid_has_single_blocks():
    pure, full = build(model_cfg("mmdit")), build(model_cfg("mmdit", dual_blocks=3))
    assert [type(b).__name__ for b in pure.blocks] == ["JointBlock"] * 3
    pure.load_state_dict(full.state_dict())
    hybrid = build(model_cfg("hybrid"))
    assert [type(b).__name__ for b in hybrid.blocks] == ["JointBlock", "DiTBlock", "DiTBlock"]
    assert not hasattr(pure.blocks[-1].ctx, "mlp") and hasattr(pure.blocks[0].ctx, "mlp")  # SD3's last block


def test_mmdit_takes_a_sequence_of_condition_embeddings():
    from genlab.families.image_flow.dit import spec_from_config
    from genlab.families.image_flow.mmdit import MMDiT
    m = MMDiT(spec_from_config(model_cfg("mmdit", attention="math"), SPEC, context_dim=12))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    x, t, y = inputs()
    ctx = torch.randn(2, 7, 12)
    out = m(x, t, y, context=ctx)
    assert out.shape == x.shape
    ctx2 = ctx.clone()
    ctx2[:, 3] += 1.0
    assert not torch.allclose(m(x, t, y, context=ctx2), out)  # the image attends to every condition token
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        m(x, t, y, context=ctx)
    assert fc.get_total_flops() == 2 * m.flops_per_sample(context_len=7)


def test_incontext_conditioning_tokens_are_cut_before_the_head():
    m = build(model_cfg("incontext_pre"))
    seen = {}
    m.head.register_forward_hook(lambda mod, inp, out: seen.update(tokens=inp[0].shape[1]))
    m(*inputs())
    assert seen["tokens"] == m.num_tokens == 16


# -- training ----------------------------------------------------------------------------------------------------
# Every backbone and every trainable CPU attention at least once; 100 AdamW steps (lr 3e-3, batch 64) of a
# dim-32, depth-2 model. The held-out flow loss starts at 1.75 (zero velocity) and a per-pixel constant cannot get
# below ~1.4; measured after 100 steps: 0.63-0.75. Threshold 0.85.
TRAIN_CASES = [("dit", "sdpa", {}), ("incontext_pre", "sigmoid", {}), ("incontext_post", "differential", {}),
               ("mmdit", "linear", {"mlp": "mixffn"}), ("hybrid", "math", {}), ("dit", "linear", {"long_skips": True})]


@pytest.mark.slow
@pytest.mark.parametrize("backbone,attention,extra", TRAIN_CASES)
def test_trains_on_digits(backbone, attention, extra):
    from genlab.data import build_dataset
    from conftest import plain_context
    from genlab.training.trainer import build_model_and_method
    opts = {**BACKBONES[backbone], "attention": attention, "dim": 32, "depth": 2, "heads": 2, **extra}
    cfg = load_config("digits_flow", [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in opts.items()])
    data = build_dataset(cfg.data)
    torch.manual_seed(0)
    model, method = build_model_and_method(cfg, data.spec)
    imgs = torch.from_numpy(data.images.copy()).permute(0, 3, 1, 2).float() / 127.5 - 1
    labels = torch.from_numpy(data.labels.copy())
    held = {"image": imgs[-256:], "label": labels[-256:]}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        idx = torch.randint(0, len(imgs) - 256, (64,), generator=g)
        loss, _ = method.loss(model, {"image": imgs[idx], "label": labels[idx]}, plain_context(g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = method.loss(model, held, plain_context(torch.Generator().manual_seed(123)))[0].item()
    assert final < 0.85


def test_genlab_train_runs_the_hybrid_with_linear_attention_and_mixffn(tmp_path):
    import genlab
    cfg = genlab.load_config("digits_flow", ["model.name=mmdit", "model.dual_blocks=1", "model.attention=linear",
                                             "model.mlp=mixffn", "model.long_skips=true", "model.dim=32",
                                             "model.depth=2", "model.heads=2", "train.steps=4", "train.batch_size=16",
                                             "log.every=2", "log.tensorboard=false", "log.progress=false",
                                             "eval.num_samples=0", f"train.out_dir={tmp_path}"])
    summary = genlab.train(cfg)
    assert summary["status"] == "finished" and summary["step"] == 4 and 0 < summary["loss"] < 5, summary
    run = genlab.load_run(summary["run_dir"], device="cpu")
    assert type(run.model).__name__ == "MMDiT" and run.model.dual == 1


# -- invalid combinations: one line before anything is built ------------------------------------------------------
@pytest.mark.parametrize("overrides,needle", [
    (["model.name=dit_incontext", "model.attention=differential", "model.dim=30", "model.heads=2"], "divisible by 2"),
    (["model.name=mmdit", "model.pos_emb=rope2d", "model.dim=24", "model.heads=4"], "rope2d"),
    (["model.name=mmdit", "model.dual_blocks=9", "model.depth=4"], "dual_blocks"),
    (["model.name=dit", "model.dual_blocks=2"], "dual_blocks"),
    (["model.name=mmdit", "model.ln_placement=post"], "ln_placement"),
    (["model.name=mmdit", "model.attention=flex", "train.device=cpu"], "no backward"),
])
def test_invalid_combinations_fail_in_config_validation(overrides, needle):
    with pytest.raises(GenlabError) as e:
        load_config("digits_flow", overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_mixffn_is_refused_where_there_is_no_grid():
    with pytest.raises(GenlabError) as e:
        load_config("shakespeare_char_ar", ["model.mlp=mixffn"])
    assert "grid" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(GenlabError, match="long_skips"):
        load_config("shakespeare_char_ar", ["model.long_skips=true"])
    with pytest.raises(GenlabError, match="mmdit"):  # a language-model method with an image backbone
        load_config("shakespeare_char_ar", ["model.name=mmdit"])


# -- parameter matching ------------------------------------------------------------------------------------------
MNIST = {"kind": "image", "image_size": 28, "channels": 1, "num_classes": 10}


@pytest.mark.parametrize("backbone", list(BACKBONES))
@pytest.mark.parametrize("mlp", ["gelu", "mixffn"])
def test_match_params_hits_a_dit_s_reference_within_two_percent(backbone, mlp):
    ref = ModelConfig(size="S", patch_size=4)
    target = reference_params(ref, MNIST)
    cfg = ModelConfig(**{**BACKBONES[backbone], "name": BACKBONES[backbone].get("name", "dit")}, size="S", patch_size=4,
                      mlp=mlp, long_skips=backbone == "dit")
    m = match_params(cfg, MNIST, target)
    n = param_count(dataclasses.replace(cfg, **m), MNIST)
    assert abs(n - target) <= 0.02 * target, (m, n, target)
    assert m["depth"] == 12 and m["dim"] == 64 * m["heads"]  # depth and head width are kept


def test_match_params_refuses_what_it_cannot_reach():
    with pytest.raises(GenlabError, match="within"):
        match_params(ModelConfig(name="mmdit", dim=32, depth=2, heads=2, mlp="swiglu"), SPEC, 40_000, tol=0.001)


# -- the shipped matched-parameter sweeps ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,variants", [("architectures", 6), ("attention", 6)])
def test_shipped_sweeps_parse_and_every_variant_matches_dit_s(name, variants):
    from genlab.lab.sweep.spec import load_sweep
    sw = load_sweep(name)
    assert len(sw.variants) == variants
    target = reference_params(ModelConfig(size="S", patch_size=4), MNIST)
    for v in sw.variants:
        cfg = load_config(sw.preset, v.overrides)
        assert cfg.train.steps == sw.steps and cfg.data.name == "images"
        n = param_count(cfg.model, MNIST)
        assert abs(n - target) <= 0.02 * target, (v.name, n, target)


def test_matched_params_axis_needs_the_data_shape(tmp_path):
    from genlab.lab.sweep.spec import load_sweep
    p = tmp_path / "s.toml"
    p.write_text('name = "m"\n[base]\npreset = "digits_flow"\n[[axis]]\ntype = "matched_params"\n'
                 'variants = [{ name = "mmdit", overrides = ["model.name=mmdit"] }]\n')
    with pytest.raises(GenlabError, match="data = "):
        load_sweep(p)


def test_sweep_report_counts_parameters_of_every_image_backbone(tmp_path):
    from genlab.config.tree import dumps_toml, to_dict
    from genlab.lab.sweep.report import param_count as report_count
    cfg = load_config("digits_flow", ["model.name=mmdit", "model.dual_blocks=1", "model.mlp=mixffn"])
    (tmp_path / "config.toml").write_text(dumps_toml(to_dict(cfg)))
    digits = {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 10}
    assert report_count(tmp_path) == param_count(cfg.model, digits)
    with torch.device("meta"):
        assert report_count(tmp_path) == sum(p.numel() for p in model_registry.get("mmdit")(cfg.model, digits).parameters())
