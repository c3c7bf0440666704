"""The method spine: extra modules (frozen and trainable) train, checkpoint and resume exactly; batch keys are
checked before any work; per-optimizer losses reach only their own parameters."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from conftest import straight_and_resumed, tiny_config

from genlab.core.errors import GenlabError
from genlab.training.trainer import Trainer

REPA = ["method.name=repa", "method.repa_hidden=32", "method.repa_block=1", "model.dim=32", "train.steps=6",
        "log.every=1", "log.ckpt_every=0", "train.ema_decay=0.9", "eval.num_samples=0", "optim.warmup_steps=2"]


def losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


@pytest.mark.slow
def test_repa_trains_checkpoints_and_resumes_exactly(tmp_path):
    _, a, b = straight_and_resumed(tmp_path, 3, *REPA)
    assert losses(tmp_path / "part") == losses(tmp_path / "full")
    for key in ("model", "ema"):
        for k in a[key]:
            assert torch.equal(a[key][k], b[key][k]), f"{key}.{k} differs after resume"
    for name in ("projector", "encoder"):
        for k, v in a["extras"][name].items():
            assert torch.equal(v, b["extras"][name][k]), f"extra {name}.{k} differs after resume"
    # the model's optimizer carries the projector as its own param group, moments included
    assert len(a["optimizer"]["param_groups"]) == 3 and len(a["optimizer"]["state"]) == len(b["optimizer"]["state"])


def test_repa_freezes_the_encoder_and_trains_the_projector(tmp_path):
    t = Trainer(tiny_config(tmp_path, *REPA, "train.steps=3", "train.name=f"))
    t.fit()
    st = t.steps
    enc, proj = st.extra_modules["encoder"], st.extra_modules["projector"]
    assert not enc.training and not any(p.requires_grad for p in enc.parameters())
    assert all(p.requires_grad for p in proj.parameters())
    torch.manual_seed(0)  # the same build from the same seed: the encoder is unchanged, the projector moved
    init = Trainer(tiny_config(tmp_path, *REPA, "train.steps=3", "train.name=g"))
    init._setup()
    for k, v in enc.state_dict().items():
        assert torch.equal(v, init.steps.extra_modules["encoder"].state_dict()[k])
    assert any(not torch.equal(v, init.steps.extra_modules["projector"].state_dict()[k]) for k, v in proj.state_dict().items())
    # FLOPs: projector forward+backward (3x) and encoder forward (1x) on top of the model's
    assert st.flops_per_sample == 3 * st.model.flops_per_sample() + 3 * proj.flops_per_sample() + enc.flops_per_sample()


def test_method_reading_a_key_the_dataset_lacks_fails_before_training(tmp_path):
    from genlab.families.base import Method, check_batch_keys

    class NeedsFrames(Method):
        batch_keys = ("frames", "actions")
    with pytest.raises(GenlabError, match="frames, actions.*image, label"):
        check_batch_keys(NeedsFrames(), {"batch_keys": ("image", "label")}, "world")


class _TwoPlayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.g, self.d = nn.Linear(3, 3), nn.Linear(3, 1)


def test_each_loss_reaches_only_its_own_optimizers_parameters(tmp_path):
    """A generator/discriminator pair: the 'model' loss runs through the discriminator, yet only the
    discriminator's own loss may write its gradients (autograd.backward(..., inputs=...))."""
    from genlab.training.step import TrainStep
    t = Trainer(tiny_config(tmp_path, "train.name=x", "train.steps=1", "optim.grad_clip=0"))
    t._setup()
    st: TrainStep = t.steps
    m = _TwoPlayer()
    st.params = {"model": list(m.g.parameters()), "disc": list(m.d.parameters())}
    st.optimizers = {"model": None, "disc": None}
    x = torch.randn(4, 3)
    fake = m.g(x)
    losses = {"model": -m.d(fake).mean(), "disc": m.d(fake.detach()).mean() - m.d(x).mean()}
    st._backward(losses)
    want_d = torch.autograd.grad(m.d(fake.detach()).mean() - m.d(x).mean(), list(m.d.parameters()))
    for p, g in zip(m.d.parameters(), want_d):
        torch.testing.assert_close(p.grad, g)
    want_g = torch.autograd.grad(-m.d(m.g(x)).mean(), list(m.g.parameters()))
    for p, g in zip(m.g.parameters(), want_g):
        torch.testing.assert_close(p.grad, g)


class _Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.SiLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


def _register_adversarial():
    """Flow matching + a critic with its own optimizer (LADD-style): one loss per optimizer."""
    from genlab.families.base import Extra, method_registry
    from genlab.families.image_flow.flow import FlowMatching

    class Adversarial(FlowMatching):
        def __init__(self, cfg, spec):
            super().__init__(cfg, spec)
            self.critic = _Critic()

        def extra_modules(self):
            return {"critic": Extra(self.critic, trainable=True, optimizer="critic", lr=3e-4)}

        def loss(self, model, batch, ctx):
            flow, _ = super().loss(model, batch, ctx)
            critic = ctx.extras["critic"]
            t = torch.full((batch["image"].shape[0],), 0.5)
            fake = model(torch.randn(batch["image"].shape, generator=ctx.generator), t, batch["label"])
            g = -critic(fake).mean()
            d = critic(fake.detach()).mean() - critic(batch["image"]).mean()
            return {"model": flow + 0.01 * g, "critic": d}, {}

    if "test_adversarial" not in method_registry:
        method_registry.register("test_adversarial", "test only")(Adversarial)


@pytest.mark.slow
def test_a_method_with_its_own_optimizer_resumes_exactly(tmp_path):
    _register_adversarial()
    common = ["method.name=test_adversarial", "model.dim=32", "train.steps=5", "log.every=1", "log.ckpt_every=0",
              "eval.num_samples=0", "optim.warmup_steps=2", "train.grad_accum=2"]
    full, a, b = straight_and_resumed(tmp_path, 2, *common)
    assert set(full.steps.optimizers) == {"model", "critic"}
    # the critic's optimizer runs the schedule at its own LR (3e-4 / optim.lr)
    assert full.steps.optimizers["critic"].param_groups[0]["lr_scale"] == pytest.approx(3e-4 / full.cfg.optim.lr)
    assert losses(tmp_path / "part") == losses(tmp_path / "full")
    for k, v in a["extras"]["critic"].items():
        assert torch.equal(v, b["extras"]["critic"][k])
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k])
    sa, sb = a["extra_optimizers"]["critic"]["state"], b["extra_optimizers"]["critic"]["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa)


def test_repa_hook_fires_in_a_compiled_dit_after_another_dit_was_compiled(tmp_path, monkeypatch):
    """torch.compile shares compiled code between instances of a class and by default leaves forward hooks
    unguarded: a second compiled DiT skipped REPA's hook (on the GPU: 'pop from empty list' at step 0)."""
    from genlab.data import build_dataset
    from genlab.training.step import build_model_and_method
    cfg = tiny_config(tmp_path, *REPA, "train.compile=model")
    spec = build_dataset(cfg.data).spec
    first, _ = build_model_and_method(cfg, spec)
    second, method = build_model_and_method(cfg, spec)
    x, t, y = torch.randn(2, spec["channels"], spec["image_size"], spec["image_size"]), torch.rand(2), torch.zeros(2, dtype=torch.long)
    from genlab.runtime.switches import compile_model_by_name
    compile_ = torch.compile  # genlab's compile path, with dynamo's eager backend: the guards, not inductor's kernels
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compile_(m, backend="eager"))
    compile_model_by_name(first, cfg.train)(x, t, y)  # compiled without a hook, as another run in the process would
    method.tap.hook(second)
    out = compile_model_by_name(second, cfg.train)(x, t, y)
    assert len(method.tap.kept) == 1 and out.shape == x.shape
    assert method.tap.kept[0].shape[:2] == (2, (spec["image_size"] // cfg.model.patch_size) ** 2)
