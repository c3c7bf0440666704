"""World-model family: collection, episode windows, context noise, closed loop, overfit, alignment, play."""
from __future__ import annotations

import json
import shutil
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from genlab.core.errors import GenlabError
from genlab.data.episodes import read_episodes, write_episodes

MEANINGS = ["NOOP", "LEFT", "RIGHT"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (conftest)


def toy_game(T=120, episodes=3, size=16, seed=0):
    """A deterministic game: a paddle at the bottom moves with the action (frame t+1 follows action t),
    a ball crosses the screen on its own. Frames uint8 [T, size, size, 3]."""
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, 3, T)
    starts = np.linspace(0, T, episodes + 1)[:-1].astype(np.int64)
    frames = np.full((T, size, size, 3), 30, np.uint8)
    x = 0
    for t in range(T):
        if t in starts:
            x = size // 2 - 2
        else:
            x = int(np.clip(x + (0, -2, 2)[actions[t - 1]], 0, size - 4))
        frames[t, size - 4:size - 1, x:x + 4] = (240, 240, 240)
        bx = (t * 3) % (size - 2)
        frames[t, 3:5, bx:bx + 2] = (220, 60, 60)
    return frames, actions, starts


@pytest.fixture
def toy_dir(tmp_path):
    frames, actions, starts = toy_game()
    return write_episodes(tmp_path / "toy", frames, actions, starts=starts,
                          meta={"num_actions": 3, "action_meanings": MEANINGS})


@pytest.fixture(scope="module")
def pong_dir(tmp_path_factory):
    pytest.importorskip("ale_py")
    pytest.importorskip("gymnasium")
    from genlab.families.world.collect import collect_atari
    out = tmp_path_factory.mktemp("pong") / "pong"
    collect_atari("Pong", 200, out, policy="random", size=32, workers=1, max_episode=100, log=lambda *a: None)
    return out


def world_cfg(tmp_path, data_path, *overrides):
    from genlab.config.tree import load_config
    base = [f"data.path={data_path}", "model.dim=32", "model.depth=2", "model.heads=2", "model.patch_size=4",
            "data.context_frames=2", "data.horizon=3", "data.heldout=0.34", "train.batch_size=16", "log.progress=false",
            "log.tensorboard=false", "log.ckpt_every=0", "eval.world_rollouts=4", "eval.world_horizons=4",
            "eval.batch_size=8", f"train.out_dir={tmp_path}", "optim.warmup_steps=5"]
    return load_config("pong_world_tiny", base + list(overrides))


def build(cfg, data_path):
    from genlab.data import build_dataset
    from genlab.training.trainer import build_model_and_method
    data = build_dataset(cfg.data)
    model, method = build_model_and_method(cfg, data.spec)
    return data, model, method


# -- data ----------------------------------------------------------------------------------------------
def test_collection_writes_aligned_frames_and_actions(pong_dir):
    """Replaying the recorded actions in a fresh emulator reproduces every recorded next frame."""
    import ale_py
    import gymnasium as gym

    from genlab.families.world.collect import resize_frame
    eps = read_episodes(pong_dir)
    assert eps.frames.shape == (200, 32, 32, 3) and eps.frames.dtype == np.uint8
    assert len(eps.actions) == len(eps.rewards) == len(eps.terminations) == 200
    assert eps.starts.tolist() == [0, 100]
    assert eps.meta["action_meanings"][:4] == ["NOOP", "FIRE", "RIGHT", "LEFT"]
    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", repeat_action_probability=0.0, frameskip=4)
    obs, _ = env.reset(seed=0)  # worker 0 of seed 0
    assert np.array_equal(resize_frame(obs, 32, 3), eps.frames[0])
    for t in range(99):
        obs, *_ = env.step(int(eps.actions[t]))
        assert np.array_equal(resize_frame(obs, 32, 3), eps.frames[t + 1]), f"frame {t + 1} is not the result of action {t}"
    from genlab.families.world.tools import alignment_check
    assert alignment_check(eps)["ok"]


def test_collect_rejects_unknown_policy(tmp_path):
    from genlab.families.world.collect import collect_atari
    with pytest.raises(GenlabError, match="valid choices: random, sticky, tracker"):
        collect_atari("Pong", 10, tmp_path / "x", policy="greedy")
    with pytest.raises(GenlabError, match="the tracker policy plays Pong, Breakout, not 'MsPacman'"):
        collect_atari("MsPacman", 10, tmp_path / "x", policy="tracker")
    with pytest.raises(GenlabError, match="--explore must be in"):
        collect_atari("Pong", 10, tmp_path / "x", policy="tracker", explore=1.0)
    assert not (tmp_path / "x").exists()


def test_tracker_moves_the_paddle_toward_the_ball():
    """Full-resolution frames drawn in the games' colours: the action that moves the paddle toward the ball; NOOP
    within the dead band; FIRE when no ball is in play (Pong's RIGHT moves its paddle up, LEFT down)."""
    from genlab.eval.objects import GAMES
    from genlab.families.world.collect import tracker_action
    pong, brk = ["NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"], ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def frame(game, ball, paddle):
        f = np.tile(np.array(GAMES[game]["background"], np.uint8), (210, 160, 1))
        name = "player" if game == "Pong" else "paddle"
        (px, py), (w, h) = paddle, ((4, 16) if game == "Pong" else (16, 4))
        f[py - h // 2:py + h // 2, px - w // 2:px + w // 2] = GAMES[game]["objects"][name][0]
        if ball is not None:
            f[ball[1]:ball[1] + 2, ball[0]:ball[0] + 2] = GAMES[game]["objects"]["ball"][0]
        return f
    act = lambda game, ball, paddle, m: m[tracker_action(frame(game, ball, paddle), game, m)]  # noqa: E731
    assert act("Pong", (80, 60), (141, 120), pong) == "RIGHT" and act("Pong", (80, 160), (141, 120), pong) == "LEFT"
    assert act("Pong", (80, 120), (141, 120), pong) == "NOOP" and act("Pong", None, (141, 120), pong) == "FIRE"
    assert act("Breakout", (30, 150), (100, 191), brk) == "LEFT" and act("Breakout", (130, 150), (60, 191), brk) == "RIGHT"
    assert act("Breakout", (100, 150), (100, 191), brk) == "NOOP" and act("Breakout", None, (100, 191), brk) == "FIRE"


@pytest.mark.slow  # two Atari collections: ~15 s on 2 cores
def test_the_tracker_plays_breakout_better_than_sticky_random(tmp_path):
    """Same frames, same seed: the tracker's data holds several times the broken bricks of sticky random play (4,000
    frames on 2026-11-28: 91 against 23), and every action still occurs."""
    pytest.importorskip("ale_py")
    pytest.importorskip("gymnasium")
    from genlab.data.episodes import read_episodes
    from genlab.families.world.collect import collect_atari
    eps = {p: read_episodes(collect_atari("Breakout", 1200, tmp_path / p, policy=p, size=16, workers=1, log=lambda *a: None))
           for p in ("sticky", "tracker")}
    hits = {p: int((e.rewards > 0).sum()) for p, e in eps.items()}
    assert hits["tracker"] >= 2 * max(hits["sticky"], 1), hits
    assert np.bincount(eps["tracker"].actions, minlength=4).min() > 50  # the explore stretches cover every action
    assert eps["tracker"].meta["policy"] == "tracker" and eps["tracker"].meta["explore"] == 0.25


def test_alignment_check_flags_shifted_action_file(toy_dir, tmp_path):
    from genlab.cli import main
    eps = read_episodes(toy_dir)
    np.save(tmp_path / "frames.npy", np.asarray(eps.frames))
    np.savetxt(tmp_path / "good.csv", eps.actions, fmt="%d")
    np.savetxt(tmp_path / "late.csv", np.roll(eps.actions, 1), fmt="%d")   # the classic off-by-one
    np.savetxt(tmp_path / "early.csv", np.roll(eps.actions, -1), fmt="%d")
    starts = tmp_path / "starts.txt"
    np.savetxt(starts, eps.starts, fmt="%d")
    args = ["data", "import", "episodes", "--frames", str(tmp_path / "frames.npy"), "--episode-starts", str(starts)]
    assert main(args + ["--actions", str(tmp_path / "good.csv"), "--out", str(tmp_path / "a")]) == 0
    from genlab.families.world.tools import alignment_check
    late = alignment_check(_with_actions(eps, np.roll(eps.actions, 1)))
    assert not late["ok"] and "late by 1" in late["message"]
    assert main(args + ["--actions", str(tmp_path / "late.csv"), "--out", str(tmp_path / "b")]) == 1
    early = alignment_check(_with_actions(eps, np.roll(eps.actions, -1)))
    assert not early["ok"] and "early by 1" in early["message"]
    noise = alignment_check(_with_actions(eps, np.random.default_rng(5).integers(0, 3, len(eps.actions))))
    assert not noise["ok"] and "predict nothing" in noise["message"]


def _with_actions(eps, actions):
    from genlab.data.episodes import Episodes
    return Episodes(eps.frames, actions, eps.rewards, eps.terminations, eps.starts, eps.meta)


def test_stats_report_histogram_coverage_and_contact_sheet(toy_dir, tmp_path, capsys):
    from genlab.families.world.tools import episode_stats
    eps = read_episodes(toy_dir)
    res = episode_stats(toy_dir, sheet=tmp_path / "sheet.png")
    assert res["frames"] == 120 and res["episodes"] == 3
    assert sum(res["action_counts"].values()) == 120
    assert res["action_counts"]["RIGHT"] == int((eps.actions == 2).sum())
    assert res["never_seen"] == []
    from PIL import Image
    assert Image.open(tmp_path / "sheet.png").size[0] > 0
    assert "action histogram" in capsys.readouterr().out


def test_window_sampling_never_crosses_episode_boundary(tmp_path):
    from genlab.data.windows import WindowLoader, valid_starts
    T, starts = 60, np.array([0, 7, 9, 30, 41])
    ep_of = np.searchsorted(starts, np.arange(T), side="right") - 1
    frames = np.broadcast_to(ep_of[:, None, None, None].astype(np.uint8), (T, 4, 4, 1)).copy()
    eps = read_episodes(write_episodes(tmp_path / "e", frames, np.arange(T) % 3, starts=starts, meta={"num_actions": 3}))
    W = 5
    brute = [s for s in range(T - W + 1) if len(set(ep_of[s:s + W])) == 1]
    assert valid_starts(eps.starts, T, W).tolist() == brute
    loader = WindowLoader(eps, W, batch_size=8, device="cpu", seed=1)
    seen = set()
    for _ in range(30):
        b = loader.next()
        ids = ((b["frames"][:, :, 0, 0, 0] + 1) * 127.5).round()  # episode id of every frame of every window
        assert (ids == ids[:, :1]).all()
        a = b["actions"]
        assert ((a[:, 1:] - a[:, :-1]) % 3 == 1).all()  # actions gathered with the same consecutive indices
        seen |= set(ids[:, 0].long().tolist())
    assert seen == {0, 2, 3, 4}  # episode 1 (2 frames) is shorter than a window


# -- method ----------------------------------------------------------------------------------------------
class Spy(torch.nn.Module):
    """Records every call; returns `fn(x_t, context)` so tests control what the 'model' generates."""

    def __init__(self, fn):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.fn, self.calls = fn, []

    def forward(self, x_t, t, context, actions, level):
        self.calls.append({"x": x_t.detach().clone(), "context": context.detach().clone(), "level": level.clone(),
                           "actions": actions.clone(), "grad": torch.is_grad_enabled()})
        return self.fn(x_t, context) + 0 * self.w


def test_context_noise_augmentation_touches_context_only(toy_dir, tmp_path):
    from genlab.families.base import StepContext
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=l1", "method.residual=false", "method.ctx_noise_max=0.5",
                    "method.closed_loop_start=1.0")
    _, _, method = build(cfg, toy_dir)
    B, L = 64, method.L
    frames = torch.full((B, L + method.H, 3, 16, 16), -0.5)
    frames[:, L] = 0.5  # the target
    clean = frames.clone()
    spy = Spy(lambda x, c: 0.5 - x)  # l1: the estimate is x + model(x) = 0.5, the clean target exactly
    ctx = StepContext(step=0, total_steps=10, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
                      precision="fp32", ema=None, extras={})
    loss, _ = method.loss(spy, {"frames": frames, "actions": torch.zeros(B, L + method.H, dtype=torch.long)}, ctx)
    assert loss.item() < 1e-6            # the target was not noised
    assert torch.equal(frames, clean)    # nor was the batch modified in place
    call = spy.calls[-1]
    level = call["level"]
    assert (level >= 0).all() and (level <= 0.5).all() and level.std() > 0.05
    resid = (call["context"] + 0.5).flatten(1)
    # the context carries Gaussian noise of exactly the level the model is told
    assert torch.allclose(resid.std(1), level, rtol=0.15, atol=0.01)


def test_closed_loop_rollouts_feed_back_generated_frames(toy_dir, tmp_path):
    from genlab.families.base import StepContext
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=l1", "method.residual=false", "method.ctx_noise_max=0",
                    "method.closed_loop_start=0", "data.horizon=4", "data.context_frames=3")
    _, _, method = build(cfg, toy_dir)
    B, L, H = 4, method.L, method.H
    frames = torch.full((B, L + H, 3, 16, 16), -0.5)
    frames[:, L:] = 0.9  # ground-truth future: must never reach the model as context
    g = 160 / 127.5 - 1  # a uint8 level, so quantised feedback keeps it
    spy = Spy(lambda x, c: g - x)  # every generated frame is g
    ctx = StepContext(step=99, total_steps=100, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
                      precision="fp32", ema=None, extras={})
    assert method.closed_loop_horizon(99, 100) == H
    method.choose_horizon = lambda step, total: 3  # roll out 2 frames, train on the 3rd
    method.loss(spy, {"frames": frames, "actions": torch.arange(L + H).expand(B, -1) % 3}, ctx)
    rollout_calls, train_call = spy.calls[:-1], spy.calls[-1]
    assert len(rollout_calls) == 2 and not any(c["grad"] for c in rollout_calls) and train_call["grad"]
    assert all((c["context"] != 0.9).all() for c in spy.calls)
    ctx_frames = train_call["context"][0, :, 0, 0, 0]
    assert torch.allclose(ctx_frames, torch.tensor([-0.5, g, g]))  # last real frame, then its own two frames
    assert train_call["actions"][0].tolist() == [2, 0, 1]  # actions 2..4 lead into frames 3..5 -> target is frame 5


@pytest.mark.parametrize("steps", [1, 3])
def test_flow_x_prediction_lands_on_the_network_frame_whatever_the_noise(toy_dir, tmp_path, steps):
    """Rollout noise (issue 15): with prediction=x the last Euler step lands exactly on the network's frame, so a
    network that outputs a zero residual copies the last frame for any noise; with v the same network leaves the
    initial noise in the frame. The training loss is the v-loss of the derived velocity: 0 for the oracle."""
    from genlab.families.base import StepContext
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=flow", "method.ctx_noise_max=0", "method.closed_loop_start=1.0",
                    "method.sample_temperature=1", "method.quantize_frames=false")
    assert cfg.method.prediction == "x"  # the default
    _, _, method = build(cfg, toy_dir)
    B, L = 4, method.L
    context = torch.rand(B, L, 3, 16, 16) * 2 - 1
    acts = torch.zeros(B, L, dtype=torch.long)
    zero = Spy(lambda x, c: torch.zeros_like(x))
    for seed in range(3):
        out = method.generate(zero, context, acts, steps, torch.Generator().manual_seed(seed))
        assert torch.allclose(out, context[:, -1], atol=1e-6)
    method.mcfg.prediction = "v"
    out = method.generate(zero, context, acts, steps, torch.Generator().manual_seed(0))
    assert (out - context[:, -1]).abs().mean() > 0.3  # the noise stays
    method.mcfg.prediction = "x"
    frames = torch.rand(B, L + method.H, 3, 16, 16) * 2 - 1
    oracle = Spy(lambda x, c: frames[:, L] - frames[:, L - 1])  # the true residual
    ctx = StepContext(step=0, total_steps=10, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
                      precision="fp32", ema=None, extras={})
    method.sample_t = lambda n, g, dev, cfg: torch.tensor([0.0, 0.5, 0.97, 1.0])[:n]  # t ~ 1 included
    loss, _ = method.loss(oracle, {"frames": frames, "actions": torch.zeros(B, L + method.H, dtype=torch.long)}, ctx)
    assert loss.item() < 1e-8


def test_quantized_frames_drop_sub_level_noise_in_rollouts(toy_dir, tmp_path):
    """method.quantize_frames: generated frames are put back on the uint8 grid of real frames, so a network whose
    residual is sub-level noise rolls out the last real frame exactly instead of a random walk."""
    from genlab.data.pixels import to_model
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=l1", "method.quantize_frames=true")
    _, _, method = build(cfg, toy_dir)
    B, L, K = 4, method.L, 12
    context = to_model(torch.randint(0, 256, (B, L, 16, 16, 3), dtype=torch.uint8))
    g = torch.Generator().manual_seed(0)
    jitter = Spy(lambda x, c: -x + 0.006 * torch.rand(x.shape, generator=g) - 0.003)  # l1: residual ~ U(+-0.003)
    acts = torch.zeros(B, L + K - 1, dtype=torch.long)
    out = method.rollout(jitter, context, acts)
    assert torch.equal(out, context[:, -1:].expand_as(out))
    assert torch.equal(((out + 1) * 127.5).round() / 127.5 - 1, out)  # on the grid
    method.mcfg.quantize_frames = False
    drift = (method.rollout(jitter, context, acts) - context[:, -1:]).pow(2).mean((0, 2, 3, 4)).sqrt()
    assert drift[-1] > 2.5 * drift[0] > 0  # without it the noise compounds: a random walk, ~sqrt(K)


def test_sample_temperature_scales_the_starting_noise(toy_dir, tmp_path):
    """method.sample_temperature: 1 draws a sample (the frame depends on the seed), 0 starts every frame from the noise
    mean, so rollouts are deterministic; a net that adds its input to the frame shows the scale exactly."""
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=l1", "method.residual=false", "method.quantize_frames=false")
    assert cfg.method.sample_temperature == 0 and cfg.method.quantize_frames is False
    _, _, method = build(cfg, toy_dir)
    B, L = 2, method.L
    context = torch.zeros(B, L, 3, 16, 16)
    acts = torch.zeros(B, L, dtype=torch.long)
    echo = Spy(lambda x, c: torch.zeros_like(x))  # l1: frame = noise + net(noise) = the scaled starting noise
    noise = lambda seed: torch.randn(context[:, -1].shape, generator=torch.Generator().manual_seed(seed))
    for temp in (0.0, 0.5, 1.0):
        method.mcfg.sample_temperature = temp
        outs = [method.generate(echo, context, acts, 1, torch.Generator().manual_seed(s)) for s in (0, 1)]
        assert torch.allclose(outs[0], (temp * noise(0)).clamp(-1, 1))
        assert torch.equal(outs[0], outs[1]) == (temp == 0)


def test_sample_context_noise_noises_the_context_and_tells_the_model(toy_dir, tmp_path):
    """method.sample_ctx_noise=s: the model sees the context plus Gaussian noise of std s and is told level s; the
    residual base stays the clean last frame; 0 leaves the context untouched."""
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=l1", "method.ctx_noise_max=0.5", "method.quantize_frames=false")
    _, _, method = build(cfg, toy_dir)
    B, L = 64, method.L
    context = torch.full((B, L, 3, 16, 16), 0.25)
    acts = torch.zeros(B, L, dtype=torch.long)
    for s in (0.0, 0.3):
        method.mcfg.sample_ctx_noise = s
        spy = Spy(lambda x, c: torch.zeros_like(x))  # residual l1 at temperature 0: the frame is the clean last one
        out = method.generate(spy, context, acts, 1, torch.Generator().manual_seed(0))
        call = spy.calls[-1]
        assert torch.equal(call["level"], torch.full((B,), s))
        seen = call["context"] - 0.25
        assert torch.allclose(seen.flatten(1).std(1), torch.full((B,), s), atol=0.02)  # 3,072 values a sample
        assert torch.equal(out, context[:, -1])


def test_sample_context_noise_above_the_trained_range_is_refused(toy_dir, tmp_path):
    with pytest.raises(GenlabError, match="ctx_noise_max"):
        build(world_cfg(tmp_path, toy_dir, "method.ctx_noise_max=0.2", "method.sample_ctx_noise=0.3"), toy_dir)


# -- action guidance (classifier-free guidance on the actions) -------------------------------------------------
def test_dropped_actions_leave_no_trace_in_the_prediction(toy_dir, tmp_path):
    """action_keep=0 is the null action: the output no longer depends on the actions; action_keep=1 is the plain model."""
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=flow")
    _, model, method = build(cfg, toy_dir)
    torch.manual_seed(0)
    for p in model.parameters():  # adaLN-zero starts blind to the conditioning: give every path weight
        torch.nn.init.normal_(p, std=0.2)
    B, L = 4, method.L
    x, t, lvl = torch.randn(B, 3, 16, 16), torch.rand(B), torch.rand(B)
    ctx = torch.randn(B, L, 3, 16, 16)
    a1, a2 = torch.zeros(B, L, dtype=torch.long), torch.full((B, L), 2)
    keep = torch.tensor([1.0, 0.0, 1.0, 0.0])
    plain1, plain2 = model(x, t, ctx, a1, lvl), model(x, t, ctx, a2, lvl)
    out1, out2 = model(x, t, ctx, a1, lvl, action_keep=keep), model(x, t, ctx, a2, lvl, action_keep=keep)
    assert (plain1 - plain2).abs().amax() > 1e-2                     # the actions matter to this model
    torch.testing.assert_close(out1[keep == 1], plain1[keep == 1])    # kept: the plain model
    torch.testing.assert_close(out1[keep == 0], out2[keep == 0])      # dropped: the same whatever the actions


@pytest.mark.parametrize("steps", [1, 3])
def test_action_guidance_equals_two_separate_predictions_combined(toy_dir, tmp_path, steps):
    """generate() with method.action_guidance=w batches the action and null predictions in one forward; the reference
    runs them as two calls and combines null + w (cond - null) by hand in float64."""
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=flow", "method.action_dropout=0.1", "method.action_guidance=3",
                    "method.quantize_frames=false", "method.sample_temperature=1")
    _, model, method = build(cfg, toy_dir)
    torch.manual_seed(1)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model = model.double()
    B, L = 3, method.L
    ctx = torch.rand(B, L, 3, 16, 16, dtype=torch.float64) * 2 - 1
    acts = torch.randint(0, 3, (B, L))
    noise = torch.randn(B, 3, 16, 16, dtype=torch.float64)
    guided = method.generate(model, ctx, acts, steps, noise=noise)

    class HandGuided(torch.nn.Module):  # the unbatched reference: two calls of the real model
        def forward(self, x, t, context, actions, level):
            cond = model(x, t, context, actions, level)
            null = model(x, t, context, actions, level, action_keep=torch.zeros(x.shape[0], dtype=x.dtype))
            return null + 3.0 * (cond - null)
    method.mcfg.action_guidance = 1.0
    reference = method.generate(HandGuided(), ctx, acts, steps, noise=noise)
    plain = method.generate(model, ctx, acts, steps, noise=noise)
    torch.testing.assert_close(guided, reference, rtol=1e-10, atol=1e-10)
    assert (guided - plain).abs().amax() > 1e-3  # guidance changed the frame


def test_action_dropout_drops_that_share_of_training_samples(toy_dir, tmp_path):
    from genlab.families.base import StepContext
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=l1", "method.action_dropout=0.25", "method.closed_loop_start=1.0")
    _, _, method = build(cfg, toy_dir)
    seen = []

    class KeepSpy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, x_t, t, context, actions, level, action_keep=None):
            seen.append(action_keep)
            return torch.zeros_like(x_t) + 0 * self.w
    B, L = 4000, method.L
    ctx = StepContext(step=0, total_steps=10, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
                      precision="fp32", ema=None, extras={})
    frames = torch.zeros(B, L + method.H, 3, 4, 4)
    method.loss(KeepSpy(), {"frames": frames, "actions": torch.zeros(B, L + method.H, dtype=torch.long)}, ctx)
    keep = seen[-1]
    assert set(keep.unique().tolist()) == {0.0, 1.0}
    assert abs(float(1 - keep.mean()) - 0.25) < 0.03  # 4,000 draws: 4 standard deviations of the share


def test_action_guidance_without_dropout_is_refused(toy_dir, tmp_path):
    with pytest.raises(GenlabError, match="action_dropout"):
        build(world_cfg(tmp_path, toy_dir, "method.action_guidance=2"), toy_dir)


def test_rollout_uses_only_context_and_actions(toy_dir, tmp_path):
    cfg = world_cfg(tmp_path, toy_dir, "method.objective=flow")
    _, model, method = build(cfg, toy_dir)
    ctx = torch.randn(2, method.L, 3, 16, 16).clamp(-1, 1)
    acts = torch.randint(0, 3, (2, method.L + 5))
    g = lambda: torch.Generator().manual_seed(3)
    out = method.rollout(model.eval(), ctx, acts, generator=g())
    assert out.shape == (2, 6, 3, 16, 16) and out.abs().max() <= 1
    assert torch.equal(out, method.rollout(model, ctx, acts, generator=g()))  # reproducible with the same noise


def test_tiny_model_overfits_short_episode(toy_dir, tmp_path):
    from genlab.training.trainer import Trainer
    cfg = world_cfg(tmp_path, toy_dir, "train.steps=200", "log.every=10", "optim.lr=3e-3", "train.ema_decay=0",
                    "model.dim=64", "model.heads=4", "method.closed_loop_start=1.0", "method.ctx_noise_max=0",
                    "train.name=overfit")
    summary = Trainer(cfg).fit()
    recs = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if "loss" in r]
    assert losses[-1] < 0.25 * losses[0], losses
    assert summary["tf_psnr"] > summary["tf_copy_last_psnr"]  # it predicts the motion, not just the last frame
    assert (Path(summary["run_dir"]) / "samples.gif").exists() and "rollout_psnr_h4" in summary
    run = Path(summary["run_dir"])
    own = (run / "world_eval.md").read_text()
    assert own.count("| 4 |") == 1
    # `genlab eval` with other sampling settings reports beside the training's report, never over it, nor over itself
    from genlab.runs.load import evaluate_run
    for _ in range(2):
        evaluate_run(run, ["method.sample_temperature=1"], device="cpu")
    assert (run / "world_eval.md").read_text() == own
    first, second = run / "world_eval_eval_sample_temperature-1.md", run / "world_eval_eval_sample_temperature-1_2.md"
    assert first.exists() and second.exists() and first.read_text() != own
    # a run cut before its final evaluation has no report: `genlab eval` writes the run's own (the world suite reads it)
    for f in ("world_eval.md", "world_eval.json"):
        (run / f).unlink()
    evaluate_run(run, [], device="cpu")
    assert (run / "world_eval.md").read_text() == own and not (run / "world_eval_eval.md").exists()


def test_adversarial_objective_stays_finite(toy_dir, tmp_path):
    from genlab.training.trainer import Trainer
    cfg = world_cfg(tmp_path, toy_dir, "train.steps=6", "log.every=3", "method.objective=l1", "method.adv_weight=0.1",
                    "method.closed_loop_start=0.5", "train.name=adv", "eval.world_horizons=2")
    summary = Trainer(cfg).fit()
    recs = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in recs if "disc_loss" in r]
    assert logged and all(np.isfinite(r["disc_loss"]) and r["disc_nonfinite"] == 0 for r in logged)
    assert max(r["horizon"] for r in recs if "horizon" in r) >= 1 and np.isfinite(summary["loss"])
    # sampling settings may change on a trained run (eval, play); what the weights fixed may not
    from genlab.core.errors import GenlabError
    from genlab.runs.load import load_run
    _, _, method, _, _ = load_run(summary["run_dir"], "cpu", overrides=["method.sample_temperature=1", "method.quantize_frames=false"])
    assert method.mcfg.sample_temperature == 1 and method.mcfg.quantize_frames is False
    with pytest.raises(GenlabError, match="not allowed"):
        load_run(summary["run_dir"], "cpu", overrides=["method.objective=flow"])


# -- play ------------------------------------------------------------------------------------------------
@pytest.fixture
def play_server(toy_dir, tmp_path):
    from genlab.families.world.play import PlaySession, make_server
    cfg = world_cfg(tmp_path, toy_dir)
    data, model, method = build(cfg, toy_dir)
    from genlab.data.windows import spaced_windows
    frames, actions = spaced_windows(data.val, method.L, 1, torch.device("cpu"))
    session = PlaySession(model.eval(), method, frames, actions, record=str(tmp_path / "session.gif"))
    server = make_server(session, port=0)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", session
    server.shutdown()
    server.server_close()


def test_play_generates_under_the_runs_precision(toy_dir, tmp_path, monkeypatch):
    """A bf16 run plays under bf16 autocast (as `genlab sample` / `eval` sample it), and the frames stay float32."""
    from genlab.data.windows import spaced_windows
    from genlab.families.world.play import PlaySession
    from genlab.runtime.switches import build_precision
    cfg = world_cfg(tmp_path, toy_dir)
    data, model, method = build(cfg, toy_dir)
    frames, actions = spaced_windows(data.val, method.L, 1, torch.device("cpu"))
    seen, generate = [], method.generate

    def spy(*args):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return generate(*args)
    monkeypatch.setattr(method, "generate", spy)
    for name, autocast in (("bf16", True), ("fp32", False)):
        session = PlaySession(model.eval(), method, frames, actions, precision=build_precision(name, torch.device("cpu")))
        session.step(0)
        assert seen[-1][0] is autocast and (not autocast or seen[-1][1] == torch.bfloat16)
        assert session.context.dtype == torch.float32


def test_play_server_answers_key_press_with_new_frame(play_server, tmp_path):
    import io

    from PIL import Image
    url, session = play_server
    info = json.loads(urllib.request.urlopen(url + "/info").read())
    assert info["actions"] == MEANINGS and "ArrowRight" in info["keys"]["RIGHT"]
    before = session.context.clone()
    r = urllib.request.urlopen(url + "/step?keys=" + urllib.request.quote('["ArrowRight"]'))
    assert r.headers["Content-Type"] == "image/png" and r.headers["X-Frame"] == "1" and r.headers["X-Action"] == "RIGHT"
    img = np.asarray(Image.open(io.BytesIO(r.read())))
    assert img.shape == (16, 16, 3)
    assert session.actions[0, -1].item() == 2
    assert torch.equal(session.context[:, :-1], before[:, 1:])  # the new frame joined the context
    assert np.array_equal(img, session.current())
    r2 = urllib.request.urlopen(url + "/step?a=1")
    assert r2.headers["X-Frame"] == "2" and r2.headers["X-Action"] == "LEFT"
    paths = session.save_recording(log=lambda *a: None)
    assert paths and paths[0].exists()


def _chrome():
    try:
        from selenium import webdriver
    except ImportError:
        return None
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        return None
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=800,700"):
        opts.add_argument(a)
    try:
        return webdriver.Chrome(service=Service(driver), options=opts)
    except Exception:  # noqa: BLE001  (a browser that cannot start here: skip, as without one)
        return None


@pytest.mark.slow  # a headless Chromium; test_play_server_answers_key_press_with_new_frame is the fast check
def test_play_page_in_real_browser(play_server, tmp_path):
    browser = _chrome()
    if browser is None:
        pytest.skip("no headless Chromium + chromedriver + selenium")
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
    url, session = play_server
    try:
        browser.get(url + "/")
        wait = WebDriverWait(browser, 30)
        frame_no = lambda: int(browser.find_element(By.ID, "n").text or 0)
        wait.until(lambda b: frame_no() >= 3)
        src0 = browser.find_element(By.ID, "frame").get_attribute("src")
        assert src0.startswith("blob:")
        ActionChains(browser).key_down(Keys.ARROW_RIGHT).perform()
        wait.until(lambda b: b.find_element(By.ID, "act").text == "RIGHT")
        n1 = frame_no()
        wait.until(lambda b: frame_no() > n1 + 3)
        ActionChains(browser).key_up(Keys.ARROW_RIGHT).key_down(Keys.ARROW_LEFT).perform()
        wait.until(lambda b: b.find_element(By.ID, "act").text == "LEFT")
        assert browser.find_element(By.ID, "frame").get_attribute("src") != src0
        fps = float(browser.find_element(By.ID, "fps").text)
        assert fps > 0
        wait.until(lambda b: float(b.find_element(By.ID, "fps").text) != fps)  # the counter keeps updating
        assert "Space" in browser.find_element(By.ID, "keys").text or "RIGHT" in browser.find_element(By.ID, "keys").text
        browser.save_screenshot(str(tmp_path / "play.png"))
        assert (tmp_path / "play.png").stat().st_size > 1000
    finally:
        browser.quit()


@pytest.mark.parametrize("mode,attention", [("channels", "math"), ("tokens", "math"), ("tokens", "linear")])
def test_world_dit_flops_match_flop_counter(toy_dir, tmp_path, mode, attention):
    from torch.utils.flop_counter import FlopCounterMode
    # the "math" backend spells attention as matmuls; the counter does not see CPU's fused SDPA kernel
    cfg = world_cfg(tmp_path, toy_dir, f"model.context_mode={mode}", f"model.attention={attention}")
    _, model, method = build(cfg, toy_dir)
    L = method.L
    args = (torch.randn(1, 3, 16, 16), torch.rand(1), torch.randn(1, L, 3, 16, 16), torch.zeros(1, L, dtype=torch.long),
            torch.rand(1))
    with FlopCounterMode(display=False) as fc:
        model(*args)
    assert fc.get_total_flops() == model.flops_per_sample()


@pytest.mark.parametrize("objective", ["flow", "edm", "l1"])
@pytest.mark.parametrize("mode", ["channels", "tokens"])
def test_every_objective_and_context_mode_trains_and_generates(toy_dir, tmp_path, objective, mode):
    from genlab.families.base import StepContext
    cfg = world_cfg(tmp_path, toy_dir, f"method.objective={objective}", f"model.context_mode={mode}")
    data, model, method = build(cfg, toy_dir)
    batch = data.make_loader(cfg.data, 4, "cpu", 0, 0, 1).next()
    ctx = StepContext(step=0, total_steps=1, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
                      precision="fp32", ema=None, extras={})
    loss, _ = method.loss(model, batch, ctx)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    out = method.generate(model.eval(), batch["frames"][:, :method.L], batch["actions"][:, :method.L])
    assert out.shape == (4, 3, 16, 16) and torch.isfinite(out).all()


def test_ssim_is_one_for_equal_images_and_bounded_under_bf16_autocast():
    # regression: under the eval's bf16 autocast the variance terms cancelled and SSIM came out as 2.09 on GPU
    import torch

    from genlab.eval.rollouts import ssim
    g = torch.Generator().manual_seed(0)
    a = torch.rand(4, 3, 32, 32, generator=g) * 2 - 1
    b = (a + 0.3 * torch.randn(a.shape, generator=g)).clamp(-1, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        same, diff = ssim(a, a), ssim(a, b)
    assert torch.allclose(same, torch.ones(4), atol=1e-5)
    assert ((diff > -1) & (diff < 1)).all()


def test_rollout_video_writes_gif_and_mp4_that_decode_back(tmp_path):
    """The composed video (context | real | generated, action captions) round-trips through GIF exactly and
    through H.264 MP4 recognisably (lossy), with every frame and the even-padded size."""
    imageio = pytest.importorskip("imageio.v2")
    pytest.importorskip("imageio_ffmpeg")
    from PIL import Image, ImageSequence

    from genlab.families.world.render import compose_frames, write_video
    g = torch.Generator().manual_seed(0)
    # two levels per channel: with the captions' anti-aliased colours (~240) about what a 256-colour GIF palette holds
    ctx, real = (torch.randint(0, 2, s, generator=g).float() * 2 - 1 for s in [(2, 2, 3, 16, 16), (2, 5, 3, 16, 16)])
    gen = real.flip(-1)
    frames = compose_frames(ctx, real, gen, torch.randint(0, 3, (2, 6), generator=g), MEANINGS, scale=3)
    assert len(frames) == 5 and frames[0].dtype == np.uint8
    written = write_video(frames, tmp_path / "roll.gif", fps=4, log=lambda m: None)
    assert [p.suffix for p in written] == [".gif", ".mp4"]
    gif = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(Image.open(written[0]))]
    assert len(gif) == 5
    for a, b in zip(gif, frames):  # exact but for a few caption pixels when a frame exceeds 256 colours
        d = np.abs(a.astype(int) - b)
        assert d.max() <= 2 and (d > 0).mean() < 1e-3
    mp4 = [f for f in imageio.get_reader(written[1])]
    h, w = frames[0].shape[:2]
    assert len(mp4) == 5 and mp4[0].shape == (h + h % 2, w + w % 2, 3)
    # lossy H.264 (4:2:0 chroma on binary noise): each decoded frame is still far closer to its own frame than to any other
    err = np.array([[np.abs(m[:h, :w].astype(float) - f).mean() for f in frames] for m in mp4])
    assert (err.argmin(1) == np.arange(5)).all() and (err.diagonal() < 0.5 * np.sort(err, 1)[:, 1]).all(), err


# -- layers ----------------------------------------------------------------------------------------------


# -- generation through the shared samplers ---------------------------------------------------------------------
def toy_net(x, t, *_):
    """A smooth stand-in for the backbone that depends on the frame and the time input (float64-safe)."""
    return 0.6 * torch.tanh(1.5 * x + 0.2) * torch.cos(t.to(x.dtype)).view(-1, 1, 1, 1) - 0.1 * x


def reference_frame(objective, prediction, x, steps):
    """Today's hand-written loops (before the objectives used sampling/samplers.py), in float64."""
    from genlab.families.world.objectives import preconditioning
    B, col = x.shape[0], lambda v: v.view(-1, 1, 1, 1)
    if objective == "l1":
        return x + toy_net(x, torch.zeros(B, dtype=x.dtype))
    if objective == "flow":
        ts = torch.linspace(0, 1, steps + 1, dtype=torch.float64)
        for i in range(steps):
            out = toy_net(x, ts[i].expand(B))
            out = (out - x) / (1 - ts[i]) if prediction == "x" else out
            x = x + (ts[i + 1] - ts[i]) * out
        return x
    i = torch.arange(steps, dtype=torch.float64)
    sig = (5.0 ** (1 / 7) + i / max(steps - 1, 1) * (2e-3 ** (1 / 7) - 5.0 ** (1 / 7))) ** 7
    sig = torch.cat([sig, sig.new_zeros(1)])
    x = x * sig[0]
    for k in range(steps):
        c_skip, c_out, c_in, c_noise = preconditioning(sig[k].expand(B), 0.5)
        den = col(c_skip) * x + col(c_out) * toy_net(col(c_in) * x, c_noise)
        x = x + (sig[k + 1] - sig[k]) * (x - den) / sig[k]
    return x


@pytest.mark.parametrize("objective,prediction", [("flow", "x"), ("flow", "v"), ("edm", "x"), ("l1", "x")])
@pytest.mark.parametrize("steps", [1, 3, 8])
def test_world_frames_equal_the_hand_written_loops(toy_dir, tmp_path, objective, prediction, steps):
    """Every objective generates the frame its own Euler/denoising loop did (float64 reference, float tolerance)."""
    cfg = world_cfg(tmp_path, toy_dir, f"method.objective={objective}", f"method.prediction={prediction}",
                    "method.sample_temperature=1", "method.quantize_frames=false", "method.residual_scale=2")
    _, _, method = build(cfg, toy_dir)
    context = torch.rand(3, method.L, 3, 16, 16) * 0.5 - 0.25
    acts = torch.zeros(3, method.L, dtype=torch.long)
    out = method.generate(toy_net, context, acts, steps, torch.Generator().manual_seed(5))
    noise = torch.randn(context[:, -1].shape, generator=torch.Generator().manual_seed(5)).double()
    want = (reference_frame(objective, prediction, noise, steps) / 2 + context[:, -1].double()).clamp(-1, 1)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-5)


def test_world_sampler_picks_the_registered_sampler(toy_dir, tmp_path):
    """method.world_sampler: on v = -x (exact frame x0 / e) Heun and midpoint beat Euler; the SDE draws from the
    generator; a sampler that cannot serve the objective is refused when the method is built."""
    base = ("method.objective=flow", "method.prediction=v", "method.residual=false", "method.sample_temperature=0.5",
            "method.quantize_frames=false")
    context, acts = torch.zeros(2, 2, 3, 16, 16), torch.zeros(2, 2, dtype=torch.long)
    noise = 0.5 * torch.randn(context[:, -1].shape, generator=torch.Generator().manual_seed(0))
    err = {}
    for name in ("euler", "heun", "midpoint", "euler_maruyama"):
        _, _, method = build(world_cfg(tmp_path, toy_dir, *base, f"method.world_sampler={name}"), toy_dir)
        out = method.generate(lambda x, *_: -x, context, acts, 3, torch.Generator().manual_seed(0))
        err[name] = (out - noise / np.e).abs().max().item()
    assert err["heun"] < err["euler"] / 5 and err["midpoint"] < err["euler"] / 5 and err["euler_maruyama"] > 0.01
    for bad, why in (("heun", "t=1"), ("flow_map", "'d' input")):
        with pytest.raises(GenlabError, match=why):
            build(world_cfg(tmp_path, toy_dir, f"method.world_sampler={bad}"), toy_dir)


@pytest.mark.parametrize("discrete", [True, False])
def test_play_maps_first_person_keys_to_the_vizdoom_actions(discrete):
    """WASD walks and strafes, arrows turn, W + an arrow walks while turning, space attacks, E uses."""
    from genlab.families.world.play import FPS_TURN, PlaySession
    from genlab.families.world.vizdoom import NAMES
    s = PlaySession.__new__(PlaySession)
    s.meanings = NAMES if discrete else ["move", "strafe", "turn_degrees", "attack", "use"]
    s.discrete, s.first_person = discrete, True
    if discrete:
        name = lambda keys: NAMES[s.action_for(keys)]  # noqa: E731
        assert [name([]), name(["w"]), name(["ArrowDown"]), name(["a"]), name(["d"])] == \
            ["noop", "forward", "back", "strafe_left", "strafe_right"]
        assert [name(["ArrowLeft"]), name(["w", "ArrowLeft"]), name(["w", "ArrowRight"]), name([" ", "w"]), name(["e"])] == \
            ["turn_left", "forward_left", "forward_right", "attack", "use"]
        assert set(s.keymap()) == set(NAMES) - {"noop", "forward_left", "forward_right"}
    else:
        assert s.action_for(["w", "a", "ArrowRight", " "]).tolist() == [1, -1, FPS_TURN, 1, 0]
        assert s.action_for(["s", "e", "ArrowLeft"]).tolist() == [-1, 0, -FPS_TURN, 0, 1]


@pytest.mark.parametrize("discrete", [True, False])
def test_play_turns_with_the_mouse(discrete):
    """The page sends the mouse's horizontal pixels since the last frame: a discrete run turns past a dead zone (with W:
    walks while turning; a held arrow wins), a continuous one turns in proportion, clipped to three key turns."""
    from genlab.families.world.play import FPS_TURN, MOUSE_DEADZONE_PX, MOUSE_DEGREES_PER_PX, PlaySession
    from genlab.families.world.vizdoom import NAMES
    s = PlaySession.__new__(PlaySession)
    s.meanings = NAMES if discrete else ["move", "strafe", "turn_degrees", "attack", "use"]
    s.discrete, s.first_person = discrete, True
    if discrete:
        name = lambda keys, dx: NAMES[s.action_for(keys, dx)]  # noqa: E731
        assert [name([], -20), name([], 20), name([], MOUSE_DEADZONE_PX - 1), name(["w"], -20), name(["ArrowRight"], -20)] == \
            ["turn_left", "turn_right", "noop", "forward_left", "turn_right"]
    else:
        assert s.action_for([], 30)[2] == pytest.approx(30 * MOUSE_DEGREES_PER_PX)
        assert s.action_for(["ArrowLeft"], 30)[2] == pytest.approx(-FPS_TURN + 30 * MOUSE_DEGREES_PER_PX)
        assert s.action_for([], 1e6)[2] == 3 * FPS_TURN and s.action_for([], -1e6)[2] == -3 * FPS_TURN


@pytest.fixture
def fps_play_server(tmp_path):
    """A first-person toy run (the ViZDoom action names): the play page's keys and mouse reach the model."""
    from genlab.data.windows import spaced_windows
    from genlab.families.world.play import PlaySession, make_server
    from genlab.families.world.vizdoom import NAMES
    frames, _, starts = toy_game()
    actions = np.random.default_rng(0).integers(0, len(NAMES), len(frames))
    folder = write_episodes(tmp_path / "fps", frames, actions, starts=starts,
                            meta={"num_actions": len(NAMES), "action_meanings": NAMES, "game": "vizdoom"})
    data, model, method = build(world_cfg(tmp_path, folder), folder)
    context, acts = spaced_windows(data.val, method.L, 1, torch.device("cpu"))
    session = PlaySession(model.eval(), method, context, acts)
    server = make_server(session, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", session
    server.shutdown()
    server.server_close()


@pytest.mark.slow  # a real browser and two drags: ~5 s
def test_first_person_play_page_in_real_browser(fps_play_server, tmp_path):
    browser = _chrome()
    if browser is None:
        pytest.skip("no headless Chromium + chromedriver + selenium")
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    url, session = fps_play_server
    info = json.loads(urllib.request.urlopen(url + "/info").read())
    assert info["mouse_turn"] is True and info["keys"]["forward"] == ["w", "ArrowUp"]
    try:
        browser.get(url + "/")
        wait = WebDriverWait(browser, 30)
        act = lambda: browser.find_element(By.ID, "act").text  # noqa: E731
        wait.until(lambda b: int(b.find_element(By.ID, "n").text or 0) >= 3)
        assert act() == "noop"
        ActionChains(browser).key_down("a").perform()  # the keys' mapping is unit-tested; one key reaches the model here
        wait.until(lambda b: act() == "strafe_left")
        ActionChains(browser).key_up("a").perform()
        frame = browser.find_element(By.ID, "frame")
        # drag across the view to the right, then to the left: the frames made during the drag turn that way
        for step, turn in ((6, "turn_right"), (-6, "turn_left")):
            session.taken.clear()
            # duration=0: each move lands at once (selenium's default glides 250 ms per move); the pauses pace the drag
            chain = ActionChains(browser, duration=0).move_to_element(frame).click_and_hold()
            for _ in range(30):
                chain = chain.move_by_offset(step, 0).pause(0.05)
            chain.release().perform()
            assert turn in session.taken and "turn_" + ("left" if step > 0 else "right") not in session.taken
        wait.until(lambda b: act() == "noop")  # the mouse stopped: no turn
        assert "mouse" in browser.find_element(By.ID, "help").text
        browser.save_screenshot(str(tmp_path / "fps_play.png"))
    finally:
        browser.quit()


def test_a_wrong_eval_world_episodes_folder_is_refused_before_training(toy_dir, tmp_path):
    from genlab.families.world.method import check_world_config
    with pytest.raises(GenlabError, match="has no meta.json: not an episode folder"):  # loading the config checks it
        world_cfg(tmp_path, toy_dir, f"eval.world_episodes={tmp_path / 'nowhere'}")
    check_world_config(world_cfg(tmp_path, toy_dir, f"eval.world_episodes={toy_dir}"))  # a real folder passes


def test_flow_loss_in_x_space_is_the_plain_frame_error_and_its_mean_predictor_level(toy_dir, tmp_path):
    """method.loss_space=x: the loss is ||x_hat - x||^2 at every t (no 1 / (1 - t)^2 weight); its stall level is the
    residual target's variance (the loss of predicting its mean), computed here by brute force; v with x is refused."""
    data, _, method = build(world_cfg(tmp_path, toy_dir, "method.loss_space=x"), toy_dir)
    target = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    const = torch.full_like(target, 0.25)
    loss, est = method.objective.loss(method, lambda x, t: const, target, torch.randn_like(target), torch.Generator())
    assert loss.item() == pytest.approx(((const - target) ** 2).mean().item(), rel=1e-6) and torch.equal(est, const)
    from genlab.data.windows import spaced_windows
    frames, _ = spaced_windows(data.train, method.L + 1, 10 ** 6, "cpu")
    res = (frames[:, method.L] - frames[:, method.L - 1]).double()
    level = next(b for b in method.trivial_baselines(data, torch.Generator()) if b.metric == "loss").value
    assert level == pytest.approx(((res - res.mean(0)) ** 2).mean().item(), rel=1e-6)
    with pytest.raises(GenlabError, match="loss_space=x .* needs method.prediction=x"):
        build(world_cfg(tmp_path, toy_dir, "method.loss_space=x", "method.prediction=v"), toy_dir)


@pytest.mark.slow  # two short trainings, one compiled on the CPU: ~30 s on 2 cores
def test_the_compiled_world_step_follows_the_eager_one_through_closed_loop_horizons(toy_dir, tmp_path):
    """The world presets ship train.compile=model (reduce-overhead on CUDA). Over teacher-forced steps and closed-loop
    steps of every horizon (the rollout inside the step runs the compiled model under no_grad), the compiled run's
    losses follow the eager run's to float32 rounding of inductor's reordered sums, and its final evaluation runs."""
    from genlab.training.trainer import Trainer
    common = ("train.steps=8", "log.every=1", "method.closed_loop_start=0.25", "train.precision=fp32",
              "optim.warmup_steps=2", "eval.world_rollouts=2", "eval.world_horizons=2")
    losses, horizons = {}, {}
    for name, extra in (("eager", ()), ("compiled", ("train.compile=model",))):
        summary = Trainer(world_cfg(tmp_path, toy_dir, *common, f"train.name={name}", *extra)).fit()
        assert summary["status"] == "finished" and "tf_psnr" in summary
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
        losses[name], horizons[name] = [r["loss"] for r in rows], [r["horizon"] for r in rows]
    assert horizons["compiled"] == horizons["eager"] and max(horizons["eager"]) == 3  # closed loop reached horizon 3
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-4)  # 6e-6 measured (2026-11-28)


@pytest.mark.parametrize("objective", ["flow", "l1"])
def test_motion_weight_weighs_the_pixels_that_move_against_a_float64_loop(toy_dir, tmp_path, objective):
    """method.motion_weight=w: the loss is sum(w_p e_p) / sum(w_p) with w_p = 1 + w on the pixels where the real target
    differs from the real frame before it by more than 1.5 uint8 levels (the evaluation's moving pixels), 1 elsewhere;
    checked against a float64 loop over pixels. 0 is the plain mean."""
    from genlab.families.base import StepContext
    w = 9.0
    extra = ["method.loss_space=x"] if objective == "flow" else []
    cfg = world_cfg(tmp_path, toy_dir, f"method.objective={objective}", "method.ctx_noise_max=0",
                    "method.closed_loop_start=1.0", f"method.motion_weight={w}", *extra)
    _, _, method = build(cfg, toy_dir)
    B, L, S = 3, method.L, 16
    frames = torch.full((B, L + method.H, 3, S, S), -0.5)
    frames[:, L, :, 2:5, 7:9] = 0.5                         # a moved block
    frames[:, L, 1, 10, 10] = -0.5 + 1.0 * 2 / 255          # one level: below the tolerance, not moving
    frames[:, L, 2, 12, 3] = -0.5 + 2.0 * 2 / 255           # two levels, one channel: moving
    const = 0.3                                              # the 'model' predicts a constant residual
    spy = Spy(lambda x, c: torch.full_like(x, const) - (x if objective == "l1" else 0))
    ctx = StepContext(step=0, total_steps=10, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
                      precision="fp32", ema=None, extras={})
    loss, _ = method.loss(spy, {"frames": frames, "actions": torch.zeros(B, L + method.H, dtype=torch.long)}, ctx)
    target, prev = frames[:, L].double().numpy(), frames[:, L - 1].double().numpy()
    num = den = 0.0
    for b in range(B):
        for y in range(S):
            for x in range(S):
                moving = max(abs(target[b, c, y, x] - prev[b, c, y, x]) for c in range(3)) > 1.5 * 2 / 255
                for c in range(3):
                    e = const - (target[b, c, y, x] - prev[b, c, y, x])
                    num += (1 + w * moving) * (e * e if objective == "flow" else abs(e))
                    den += 1 + w * moving
    assert loss.item() == pytest.approx(num / den, rel=1e-5)
    cfg0 = world_cfg(tmp_path, toy_dir, f"method.objective={objective}", "method.ctx_noise_max=0",
                     "method.closed_loop_start=1.0", *extra)
    _, _, plain = build(cfg0, toy_dir)
    loss0, _ = plain.loss(spy, {"frames": frames, "actions": torch.zeros(B, L + method.H, dtype=torch.long)}, ctx)
    res = frames[:, L] - frames[:, L - 1]
    ref0 = ((const - res) ** 2).mean() if objective == "flow" else (const - res).abs().mean()
    assert loss0.item() == pytest.approx(ref0.item(), rel=1e-6)


def test_motion_weighted_mean_predictor_level_is_the_weighted_variance(toy_dir, tmp_path):
    """The stall sentinel's level under method.motion_weight: the weighted loss of the best per-pixel constant,
    brute-forced in float64 from the same windows (weighted mean, then weighted squared error)."""
    data, _, method = build(world_cfg(tmp_path, toy_dir, "method.loss_space=x", "method.motion_weight=4"), toy_dir)
    from genlab.data.windows import spaced_windows
    frames, _ = spaced_windows(data.train, method.L + 1, 10 ** 6, "cpu")
    cur, prev = frames[:, method.L].double(), frames[:, method.L - 1].double()
    res = (cur - prev).numpy()
    wpix = 1 + 4 * ((cur - prev).abs().amax(1) > 1.5 * 2 / 255).double().numpy()       # [N, H, W]
    wfull = np.broadcast_to(wpix[:, None], res.shape)
    mean = (wfull * res).sum(0) / wfull.sum(0)
    ref = float((wfull * (res - mean) ** 2).sum() / wfull.sum())
    level = next(b for b in method.trivial_baselines(data, torch.Generator()) if b.metric == "loss").value
    assert level == pytest.approx(ref, rel=1e-9)
    plain = next(b for b in build(world_cfg(tmp_path, toy_dir, "method.loss_space=x"), toy_dir)[2]
                 .trivial_baselines(data, torch.Generator()) if b.metric == "loss").value
    assert level != pytest.approx(plain, rel=1e-3)  # the moving paddle and ball weigh more: a different level
