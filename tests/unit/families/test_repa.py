"""REPA's alignment term and its encoders: the loss is 0 for aligned features, gradients reach only the model and the
projector, the in-project MAE encoder trains and feeds REPA (`run:`), timm weights load safely and their patch tokens
(prefix tokens dropped) land on the DiT's grid."""
from __future__ import annotations

import json
import pickle
import sys
import types

import pytest
import torch
import torch.nn as nn
from conftest import patch_everywhere, tiny_config

from genlab.core.errors import GenlabError
from conftest import plain_context
from genlab.families.image_flow.repa import aligned_block, alignment_loss
from genlab.families.image_flow.repa_encoders import load_weights, to_grid
from genlab.training.step import build_model_and_method
from genlab.training.trainer import Trainer

DIGITS = {"kind": "image", "channels": 1, "image_size": 8, "num_classes": 10, "batch_keys": ("image", "label")}
REPA = ["method.name=repa", "method.repa_hidden=16", "model.depth=3"]
MAE = ["method.name=mae_encoder", "model.name=maskdit", "model.decoder_depth=1", "log.ckpt_every=0",
       "eval.num_samples=0", "log.every=1"]


def records(run, key):
    return [r[key] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if key in r]


def test_alignment_loss_is_zero_for_identical_features_and_two_for_opposite():
    z = torch.randn(4, 16, 32, dtype=torch.float64)
    assert alignment_loss(z, z).item() == pytest.approx(0, abs=1e-6)  # float32 cosine: ~1e-7 per token
    assert alignment_loss(3 * z, z).item() == pytest.approx(0, abs=1e-6)  # cosine: scale-free
    assert alignment_loss(-z, z).item() == pytest.approx(2, abs=1e-6)
    ref = 1 - (z / z.norm(dim=-1, keepdim=True) * z.roll(1, 0) / z.roll(1, 0).norm(dim=-1, keepdim=True)).sum(-1).mean()
    assert alignment_loss(z, z.roll(1, 0)).item() == pytest.approx(ref.item(), abs=1e-6)


def test_aligned_block_defaults_to_a_third_of_the_depth():
    assert [aligned_block(0, d) for d in (2, 12, 28)] == [1, 4, 9]
    assert aligned_block(5, 12) == 5


def test_repa_gradients_reach_only_the_model_and_the_projector(tmp_path):
    torch.manual_seed(0)
    cfg = tiny_config(tmp_path, *REPA)
    model, method = build_model_and_method(cfg, DIGITS)
    enc, proj = method.encoder, method.projector
    assert all(p.requires_grad for p in enc.parameters())  # not frozen here: the loss itself must keep grads out
    g = torch.Generator().manual_seed(0)
    batch = {"image": torch.rand(8, 1, 8, 8, generator=g) * 2 - 1, "label": torch.randint(0, 10, (8,), generator=g)}
    loss, metrics = method.loss(model, batch, plain_context(g, extras={"encoder": enc, "projector": proj}))
    loss.backward()
    assert all(p.grad is None for p in enc.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in proj.parameters())
    aligned = model.blocks[method.block - 1]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in aligned.parameters())
    assert metrics["repa_align"].item() == pytest.approx((loss - metrics["flow_loss"]).item() / method.weight, rel=1e-5)


def test_classifier_encoder_is_trained_on_the_runs_device(tmp_path, monkeypatch):
    # it once trained on the CPU whatever train.device said: > 8 min for a Fashion-MNIST run on a GPU machine
    import genlab.eval.classifier as classifier
    import genlab.runtime.parallel as parallel
    from genlab.families.image_flow.repa_encoders import build_classifier
    asked, used = [], []
    patch_everywhere(monkeypatch, parallel, "resolve_device", lambda name, rank=0: asked.append(name) or torch.device("meta"))

    def fake_get_classifier(data, device="cpu", epochs=30):
        used.append(device)
        return classifier.SmallConvNet(1, 10), 0.99
    patch_everywhere(monkeypatch, classifier, "get_classifier", fake_get_classifier)
    import genlab.data
    patch_everywhere(monkeypatch, genlab.data, "build_dataset", lambda dcfg: None)
    cfg = tiny_config(tmp_path, *REPA, "method.repa_encoder=classifier", "train.device=cuda:1")
    enc = build_classifier("", cfg, DIGITS, 2)
    assert asked == ["cuda:1"] and used == [torch.device("meta")]
    assert enc(torch.zeros(2, 1, 8, 8)).shape == (2, 4, 128)  # and the frozen trunk is handed over on the CPU


def test_repa_loss_with_an_identity_projector_onto_its_own_block_is_the_flow_loss(tmp_path):
    """Encoder = the aligned block's own tokens, projector = identity: the alignment term is exactly 0."""
    cfg = tiny_config(tmp_path, *REPA, "method.repa_weight=1")
    model, method = build_model_and_method(cfg, DIGITS)
    seen = []
    model.blocks[method.block - 1].register_forward_hook(lambda m, a, out: seen.append(out.detach()))

    class OwnTokens(nn.Module):
        def forward(self, x):
            return seen[-1]
    g = torch.Generator().manual_seed(0)
    batch = {"image": torch.rand(4, 1, 8, 8, generator=g) * 2 - 1, "label": torch.zeros(4, dtype=torch.long)}
    loss, metrics = method.loss(model, batch, plain_context(g, extras={"encoder": OwnTokens(), "projector": nn.Identity()}))
    assert metrics["repa_align"].item() == pytest.approx(0, abs=1e-6)
    assert loss.item() == pytest.approx(metrics["flow_loss"].item(), abs=1e-6)


@pytest.mark.usefixtures("one_thread")
def test_mae_encoder_loss_falls_on_a_tiny_run(tmp_path):
    torch.manual_seed(0)
    Trainer(tiny_config(tmp_path, *MAE, "train.steps=60", "optim.lr=3e-3", "train.name=mae")).fit()
    loss = records(tmp_path / "mae", "loss")
    assert len(loss) == 60
    # norm-pix targets have unit variance: an untrained decoder starts near 1; 60 steps must clearly go below
    assert sum(loss[-10:]) / 10 < 0.9 * sum(loss[:5]) / 5


@pytest.mark.usefixtures("one_thread")
def test_repa_trains_aligned_to_an_in_project_mae_encoder_run(tmp_path):
    from genlab.runtime import checkpoint as ckpt
    Trainer(tiny_config(tmp_path, *MAE, "train.steps=3", "train.name=mae")).fit()
    t = Trainer(tiny_config(tmp_path, *REPA, f"method.repa_encoder=run:{tmp_path / 'mae'}", "train.steps=3",
                            "log.every=1", "eval.num_samples=0", "train.name=repa"))
    t.fit()
    align = records(tmp_path / "repa", "repa_align")
    assert len(align) == 3 and all(0 <= a <= 2 for a in align)
    state = ckpt.load_checkpoint(tmp_path / "mae")
    mae = state["ema"] if state.get("ema") is not None else state["model"]  # as a teacher: its EMA weights
    enc = t.steps.extra_modules["encoder"].net.state_dict()
    assert all(torch.equal(enc[k], v) for k, v in mae.items())  # the run's weights, frozen
    assert t.steps.extra_modules["encoder"].out_dim == 32  # the MAE's width (tiny: model.dim=32)


class Payload:
    def __reduce__(self):
        import os
        return (os.system, ("touch PWNED",))


def test_weights_file_with_a_pickle_payload_is_refused_unrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "w.pt"
    bad.write_bytes(pickle.dumps({"w": Payload()}))
    with pytest.raises(GenlabError, match="refused to load") as e:
        load_weights(bad, "method.repa_encoder=timm:x")
    assert "\n" not in str(e.value) and not (tmp_path / "PWNED").exists()
    torch.save({"state_dict": {"a": torch.ones(2)}}, tmp_path / "ok.pt")
    assert torch.equal(load_weights(tmp_path / "ok.pt", "x")["a"], torch.ones(2))
    from safetensors.torch import save_file
    save_file({"b": torch.zeros(3)}, str(tmp_path / "ok.safetensors"))
    assert torch.equal(load_weights(tmp_path / "ok.safetensors", "x")["b"], torch.zeros(3))
    with pytest.raises(GenlabError, match="no such weights file"):
        load_weights(tmp_path / "missing.pt", "x")


class FakeViT(nn.Module):
    """timm's ViT surface: forward_features -> [B, prefix + N, D], num_prefix_tokens, num_features, pretrained_cfg."""
    num_prefix_tokens, num_features, in_chans = 2, 6, 3
    pretrained_cfg = {"input_size": (3, 16, 16), "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)}

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 6, 4, 4)
        self.seen = []

    def forward_features(self, x):
        self.seen.append(x)
        t = self.patch(x).flatten(2).transpose(1, 2)  # 4 x 4 grid
        return torch.cat([torch.full_like(t[:, :2], 1e3), t], 1)  # prefix tokens that must not leak into features


def test_timm_encoder_drops_prefix_tokens_and_pools_onto_the_dit_grid(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from genlab.families.image_flow.repa_encoders import build_timm, check_encoder
    net = FakeViT()
    save_file(net.state_dict(), str(tmp_path / "vit.safetensors"))
    fake = types.SimpleNamespace(is_model=lambda n: n == "fake_vit", create_model=lambda n, pretrained: FakeViT())
    monkeypatch.setitem(sys.modules, "timm", fake)
    cfg = tiny_config(tmp_path, *REPA, "method.repa_encoder=timm:fake_vit",
                      f"method.repa_encoder_path={tmp_path / 'vit.safetensors'}")
    check_encoder(cfg)
    enc = build_timm("fake_vit", cfg, DIGITS, 2)
    x = torch.rand(3, 1, 8, 8) * 2 - 1
    f = enc(x)
    assert f.shape == (3, 4, 6) and enc.out_dim == 6
    seen = enc.net.seen[-1]  # gray to 3 channels, [0, 1], resized to 16 px, normalised by the pretrained_cfg's mean/std
    ref_in = (torch.nn.functional.interpolate(((x + 1) / 2).expand(-1, 3, -1, -1), size=(16, 16), mode="bicubic",
                                              align_corners=False) - 0.5) / 0.25
    torch.testing.assert_close(seen, ref_in)
    tokens = net.patch(ref_in).detach()  # the saved weights: 4 x 4 grid -> mean of each 2 x 2 block
    torch.testing.assert_close(f, to_grid(tokens, 2), atol=1e-5, rtol=1e-5)
    assert f.abs().max() < 1e2  # no prefix token (1e3) was pooled in


def test_timm_encoder_from_a_real_timm_model(tmp_path):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    from genlab.families.image_flow.repa_encoders import build_timm
    net = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    save_file(net.state_dict(), str(tmp_path / "vit.safetensors"))
    cfg = tiny_config(tmp_path, *REPA, "method.repa_encoder=timm:vit_tiny_patch16_224",
                      f"method.repa_encoder_path={tmp_path / 'vit.safetensors'}")
    enc = build_timm("vit_tiny_patch16_224", cfg, DIGITS, 4)
    assert enc(torch.zeros(2, 1, 8, 8)).shape == (2, 16, net.num_features)
