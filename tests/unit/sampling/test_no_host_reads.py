"""Issue 54's "no host sync in a sampling step", checked on the CPU for every image method (generated from the method
registry), GPT sampling and world rollouts (each world objective): a sample drawn with every way of reading a tensor
back to the host forbidden (on CUDA each of them waits for the device). The GPU test (test_sampling_overlap.py)
counts the real synchronisations for the flow method.
mdlm is not here: its ancestral sampler asks whether a step revealed a token, on purpose, to reuse the logits of
steps that reveal nothing (one forward pass instead of one per step when steps > tokens)."""
from __future__ import annotations

import pytest
import torch
from conftest import ANALYZE_SPEC, TINY, forbid_host_reads

from genlab.config.tree import load_config
from genlab.core.registry import load_entries
from genlab.families.base import method_registry
from genlab.families.image_flow import flow
from genlab.training.step import build_model_and_method

load_entries()
IMAGE_METHODS = sorted(n for n in method_registry.names() if method_registry.get(n).model_families == ("image",)
                       and callable(getattr(method_registry.get(n), "sample", None)))


@pytest.mark.parametrize("interval", ["0,1", "0.3,0.7"])
@pytest.mark.parametrize("method", IMAGE_METHODS)
def test_an_image_sample_reads_nothing_back_from_the_device(method, interval, monkeypatch):
    extra = ["model.name=maskdit"] if method == "maskdit" else []
    cfg = load_config("digits_flow", TINY + [f"method.name={method}", f"method.cfg_interval={interval}", *extra])
    model, m = build_model_and_method(cfg, ANALYZE_SPEC)
    labels, gen = torch.arange(4) % 4, torch.Generator().manual_seed(0)
    real_plan = flow.guidance_plan

    def host_plan(*args):  # reads are allowed here: time_grid(steps, "cpu", ...) is a host tensor on any device
        with monkeypatch.context() as inner:
            forbid_host_reads(inner, allow=True)
            return real_plan(*args)
    with monkeypatch.context() as mp:
        mp.setattr(flow, "guidance_plan", host_plan)
        forbid_host_reads(mp)
        x = m.sample(model.eval(), labels, steps=3, cfg_scale=2.0, generator=gen, device="cpu")
    assert x.shape[0] == 4 and torch.isfinite(x).all()


def _forbidding_reads(monkeypatch, fn):
    with monkeypatch.context() as mp:
        forbid_host_reads(mp)
        return fn()


def test_gpt_sampling_reads_nothing_back_from_the_device(monkeypatch):
    cfg = load_config("shakespeare_char_ar", TINY + ["data.seq_len=32"])
    model, m = build_model_and_method(cfg, {"kind": "tokens", "vocab_size": 65, "seq_len": 32})
    ids = _forbidding_reads(monkeypatch, lambda: m.draw(model.eval(), 2, generator=torch.Generator().manual_seed(0),
                                                        device="cpu", length=12))
    assert ids.shape == (2, 12)


@pytest.mark.parametrize("objective", ["flow", "edm", "l1"])
def test_a_world_rollout_reads_nothing_back_from_the_device(objective, tmp_path, monkeypatch):
    from genlab.data import build_dataset
    from genlab.data.episodes import write_episodes
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (60, 16, 16, 3), generator=g, dtype=torch.uint8).numpy()
    actions = torch.randint(0, 3, (60,), generator=g).numpy()
    path = write_episodes(tmp_path / "toy", frames, actions, starts=[0, 30],
                          meta={"num_actions": 3, "action_meanings": ["NOOP", "LEFT", "RIGHT"]})
    cfg = load_config("pong_world_tiny", TINY + [f"data.path={path}", "data.context_frames=2", "data.horizon=3",
                                                 "model.patch_size=4", f"method.objective={objective}"])
    model, m = build_model_and_method(cfg, build_dataset(cfg.data).spec)
    context, acts = torch.rand(2, 2, 3, 16, 16, generator=g) * 2 - 1, torch.randint(0, 3, (2, 6), generator=g)
    out = _forbidding_reads(monkeypatch, lambda: m.rollout(model.eval(), context, acts, generator=g))
    assert out.shape == (2, 5, 3, 16, 16)
