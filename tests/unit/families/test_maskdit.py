"""MaskDiT (families/image_flow/maskdit.py: the method and its backbone): the encoder sees exactly the requested share of each sample's
tokens, the diffusion loss reads only those, the fine-tune stage and sampling see every token, a tiny model learns,
runs resume exactly, bad settings fail in one line before any work."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, cli_in_process, straight_and_resumed, tiny_config
from torch.utils.flop_counter import FlopCounterMode

from genlab.config.tree import load_config
from conftest import plain_context
from genlab.families.image_flow.dit import depatchify, patchify
from genlab.families.image_flow.maskdit import draw_keep, kept_tokens
from genlab.training.trainer import Trainer

MASK = ["method.name=maskdit", "model.name=maskdit", "model.decoder_depth=1", "model.decoder_dim=16", "eval.num_samples=0",
        "log.ckpt_every=0", "log.sample_every=0"]
SPEC = {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 10, "batch_keys": ("image", "label")}


def build(tmp_path, *overrides):
    from genlab.training.step import build_model_and_method
    torch.manual_seed(0)
    return build_model_and_method(tiny_config(tmp_path, *MASK, *overrides), SPEC)


def batch(B=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {"image": torch.randn(B, 1, 8, 8, generator=g), "label": torch.randint(0, 10, (B,), generator=g)}


def encoder_tokens(model):
    """Token counts entering the first encoder block, per forward."""
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    return seen


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.7, 0.9])
def test_keeps_exactly_the_requested_share_of_tokens_per_sample(ratio):
    N, B = 49, 64
    K = kept_tokens(N, ratio)
    assert K == int(N * (1 - ratio))
    keep = draw_keep(B, N, K, torch.Generator().manual_seed(0), "cpu")
    assert keep.shape == (B, K)
    for row in keep:  # K distinct, sorted, in range
        assert row.unique().numel() == K and bool((row.diff() > 0).all()) and 0 <= int(row.min()) and int(row.max()) < N
    if 0 < K < N:  # the subsets differ between samples: drawn per sample, not once per batch
        assert len({tuple(r.tolist()) for r in keep}) > B // 2


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_the_encoder_sees_only_the_kept_tokens_in_training(tmp_path, ratio):
    model, method = build(tmp_path, f"method.mask_ratio={ratio}")
    seen = encoder_tokens(model)
    loss, metrics = method.loss(model, batch(), plain_context(torch.Generator().manual_seed(0), 0, 10))
    assert seen == [int(16 * (1 - ratio))] and float(metrics["visible"]) == int(16 * (1 - ratio)) / 16


def _perturb_dropped(model, amount):
    """The model, with `amount` added to its output on the patches the keep indices drop (and the keep seen)."""
    kept = []

    def wrapped(x, t, y, keep=None):
        v = model(x, t, y, keep=keep)
        kept.append(keep)
        pv = patchify(v, 2)
        dropped = torch.ones(pv.shape[:2], dtype=torch.bool).scatter_(1, keep, False)
        pv = pv + amount * dropped.unsqueeze(-1)
        return depatchify(pv, 2, 1, 8, 8)
    wrapped.null_class = model.null_class
    return wrapped, kept


def test_diffusion_loss_ignores_the_dropped_tokens(tmp_path):
    model, method = build(tmp_path)
    ctx = lambda: plain_context(torch.Generator().manual_seed(3), 0, 10)  # the same t, noise and keep each call
    with torch.no_grad():
        _, ref = method.loss(_perturb_dropped(model, 0.0)[0], batch(), ctx())
        _, far = method.loss(_perturb_dropped(model, 1e3)[0], batch(), ctx())
    assert torch.equal(ref["flow_loss"], far["flow_loss"])  # bit for bit: the dropped patches are never read
    assert far["mae_loss"] > ref["mae_loss"] + 1e5         # while the MAE term reads exactly those


def test_diffusion_loss_ignores_the_target_at_dropped_tokens(tmp_path):
    model, method = build(tmp_path)
    g = torch.Generator().manual_seed(0)
    data, noise = torch.randn(4, 1, 8, 8, generator=g), torch.randn(4, 1, 8, 8, generator=g)
    v, t = torch.randn(4, 1, 8, 8, generator=g), torch.rand(4, generator=g)
    keep = draw_keep(4, 16, 8, g, "cpu")
    dropped = torch.ones(4, 16, dtype=torch.bool).scatter_(1, keep, False)
    bump = depatchify(torch.randn(4, 16, 4, generator=g) * dropped.unsqueeze(-1), 2, 1, 8, 8)
    x_t = (1 - t.view(-1, 1, 1, 1)) * noise + t.view(-1, 1, 1, 1) * data
    flow, _ = method.masked_losses(v, data, noise, x_t, t, keep)
    flow_b, _ = method.masked_losses(v, data + bump, noise, x_t, t, keep)
    assert torch.equal(flow, flow_b)
    # the reference: the mean squared velocity error over the kept patches, in float64
    err = (patchify(v.double(), 2) - patchify((data - noise).double(), 2)).square().mean(-1)
    torch.testing.assert_close(flow.double(), err[~dropped].mean(), rtol=1e-6, atol=0)
    flow_c, _ = method.masked_losses(v, data + depatchify(patchify(bump, 2).roll(1, 1), 2, 1, 8, 8), noise, x_t, t, keep)
    assert not torch.equal(flow, flow_c)  # a change on kept patches does move it


def test_fine_tune_stage_and_sampling_see_every_token(tmp_path):
    model, method = build(tmp_path, "method.unmask_steps=3")
    seen = encoder_tokens(model)
    gen = torch.Generator().manual_seed(0)
    for step in range(10):
        _, metrics = method.loss(model, batch(), plain_context(gen, step, 10))
    assert seen == [8] * 7 + [16] * 3
    assert float(metrics["mae_loss"]) == 0 and float(metrics["visible"]) == 1
    seen.clear()
    method.sample(model.eval(), torch.arange(3), steps=2, sampler="euler", generator=torch.Generator().manual_seed(0))
    assert seen == [16, 16]


def test_unmasked_maskdit_equals_a_flow_step(tmp_path):
    """mask_ratio 0: the loss is flow matching's on the same draws (the MAE term has no token to read)."""
    from genlab.families.image_flow.flow import FlowMatching
    model, method = build(tmp_path, "method.mask_ratio=0")
    a, _ = method.loss(model, batch(), plain_context(torch.Generator().manual_seed(5), 0, 10))
    b, _ = FlowMatching.loss(method, model, batch(), plain_context(torch.Generator().manual_seed(5), 0, 10))
    assert torch.equal(a, b)


@pytest.mark.parametrize("opts", [[], ["model.depth=3", "model.long_skips=true", "model.mlp=swiglu", "model.qk_norm=true",
                                        "model.pos_emb=learned", "model.decoder_dim=0"]])
def test_a_masked_forward_trains_every_parameter(tmp_path, opts):
    model, _ = build(tmp_path, *opts)
    with torch.no_grad():  # off the zero init (adaLN-Zero, zero heads), or no gradient reaches the blocks
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    keep = draw_keep(3, 16, 8, torch.Generator().manual_seed(0), "cpu")
    model(batch(3)["image"], torch.rand(3), torch.arange(3), keep=keep).square().mean().backward()
    dead = [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert not dead and all(torch.isfinite(p.grad).all() for p in model.parameters()), dead


@pytest.mark.parametrize("opts", [[], ["model.depth=3", "model.long_skips=true", "model.mlp=swiglu"]])
def test_masked_flops_match_the_flop_counter(tmp_path, opts):
    model, _ = build(tmp_path, *opts)
    x, t, y = batch(3)["image"], torch.rand(3), torch.arange(3)
    keep = draw_keep(3, 16, 8, torch.Generator().manual_seed(0), "cpu")
    for k, n in ((keep, 8), (None, None)):
        with FlopCounterMode(display=False) as fc, torch.no_grad(), torch.nn.attention.sdpa_kernel(
                torch.nn.attention.SDPBackend.MATH):
            model(x, t, y, keep=k)
        assert fc.get_total_flops() == 3 * model.flops_per_sample(n)
    assert model.flops_per_sample(8) < model.flops_per_sample()


def losses(run, key="loss"):
    return [json.loads(line)[key] for line in (run / "metrics.jsonl").read_text().splitlines() if f'"{key}"' in line]


def test_loss_falls_on_a_tiny_model(tmp_path, one_thread):
    """60 steps of batch 64 on the digits (CPU, seconds): the visible-token flow loss drops ~25% (first vs last 10
    steps); 15% leaves room for the batch noise."""
    Trainer(tiny_config(tmp_path, *MASK, "train.steps=60", "train.batch_size=64", "log.every=1", "train.name=m",
                        "train.ema_decay=0")).fit()
    f = losses(tmp_path / "m", "flow_loss")
    assert len(f) == 60 and sum(f[-10:]) / 10 < 0.85 * sum(f[:10]) / 10, f


def test_trains_through_both_stages_checkpoints_and_resumes_exactly(tmp_path, one_thread):
    over = [*MASK, "method.unmask_steps=2", "train.steps=6", "log.every=1", "train.ema_decay=0.9", "optim.warmup_steps=2"]
    _, a, b = straight_and_resumed(tmp_path, 3, *over)
    assert losses(tmp_path / "part") == losses(tmp_path / "full")
    assert losses(tmp_path / "full", "visible")[-2:] == [1.0, 1.0] and losses(tmp_path / "full", "visible")[0] == 0.5
    for key in ("model", "ema"):
        for k in a[key]:
            assert torch.equal(a[key][k], b[key][k]), f"{key}.{k} differs after resume"


@pytest.mark.parametrize("override,needle", [
    ("method.mask_ratio=1.0", "method.mask_ratio"), ("method.mask_ratio=-0.1", "method.mask_ratio"),
    ("model.decoder_depth=0", "model.decoder_depth"), ("method.unmask_steps=99", "method.unmask_steps"),
    ("model.pos_emb=rope2d", "rope2d"), ("model.mlp=mixffn", "mixffn"), ("model.decoder_dim=18", "decoder_dim"),
])
def test_bad_settings_fail_in_one_line_before_any_work(tmp_path, capfd, override, needle):
    r = cli_in_process(capfd, "train", "digits_flow", *TINY, *MASK, "optim.warmup_steps=2", "train.steps=5", f"train.out_dir={tmp_path}", override)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())


def test_maskdit_method_refuses_a_model_that_cannot_drop_tokens(tmp_path, capfd):
    r = cli_in_process(capfd, "train", "digits_flow", *TINY, "method.name=maskdit", f"train.out_dir={tmp_path}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "model.name=maskdit" in r.stderr, r.stderr


def test_preset_loads_and_has_both_stages():
    cfg = load_config("mnist_maskdit")
    assert cfg.method.name == "maskdit" and cfg.model.name == "maskdit"
    assert 0 < cfg.method.unmask_steps < cfg.train.steps and cfg.method.mask_ratio == 0.5 and cfg.method.mae_weight == 0.1


def test_the_trainer_counts_the_masked_stage_at_its_own_cost(tmp_path):
    """flops_per_step (and so MFU) uses the run's mean FLOPs: K encoder tokens for the masked steps, N for the rest."""
    t = Trainer(tiny_config(tmp_path, *MASK, "train.steps=10", "method.unmask_steps=4", "train.name=f"))
    t._setup()
    m = t.steps.model
    assert t.steps.flops_per_sample == 3 * (6 * m.flops_per_sample(8) + 4 * m.flops_per_sample()) // 10
