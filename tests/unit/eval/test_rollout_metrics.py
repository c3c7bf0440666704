"""Per-step world-model metrics (issue 53 §2): PSNR / SSIM over moving pixels against float64 references, and the
rollout evaluation on a game whose dynamics are known (a Pong ball that moves one pixel a frame), where a perfect
model and copy-last have known answers."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from genlab.core.errors import GenlabError
from genlab.data.episodes import Episodes, write_episodes
from genlab.data.windows import spaced_starts
from genlab.eval.objects import GAMES
from genlab.eval.rollouts import evaluate_world, points_before, masked_psnr, masked_ssim, moving_mask, ssim, ssim_map, world_gain_db


def naive_ssim_map(a, b):
    """float64, one window at a time (Wang et al. 2004, 11x11 Gaussian sigma 1.5, data range 2), channels averaged."""
    g = np.exp(-(np.arange(11) - 5.0) ** 2 / (2 * 1.5 ** 2))
    w = np.outer(g, g) / g.sum() ** 2
    N, C, H, W = a.shape
    out = np.zeros((N, H - 10, W - 10))
    c1, c2 = 0.02 ** 2, 0.06 ** 2
    for n in range(N):
        for i in range(H - 10):
            for j in range(W - 10):
                vals = []
                for c in range(C):
                    x, y = a[n, c, i:i + 11, j:j + 11], b[n, c, i:i + 11, j:j + 11]
                    mx, my = (w * x).sum(), (w * y).sum()
                    sxx, syy, sxy = (w * x * x).sum() - mx ** 2, (w * y * y).sum() - my ** 2, (w * x * y).sum() - mx * my
                    vals.append((2 * mx * my + c1) * (2 * sxy + c2) / ((mx ** 2 + my ** 2 + c1) * (sxx + syy + c2)))
                out[n, i, j] = np.mean(vals)
    return out


def test_ssim_map_and_masked_metrics_match_float64_references():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(2, 3, 16, 16, generator=g) * 2 - 1
    b = (a + 0.3 * torch.randn(2, 3, 16, 16, generator=g)).clamp(-1, 1)
    ref = naive_ssim_map(a.double().numpy(), b.double().numpy())
    assert np.allclose(ssim_map(a, b).numpy(), ref, atol=1e-5)
    assert np.allclose(ssim(a, b).numpy(), ref.reshape(2, -1).mean(1), atol=1e-5)
    mask = torch.rand(2, 16, 16, generator=g) > 0.7
    mask[1] = False
    se = ((a.double() - b.double()) ** 2).mean(1).numpy()
    want = 10 * np.log10(4 / se[0][mask[0].numpy()].mean())
    got = masked_psnr(a, b, mask)
    assert abs(got[0].item() - want) < 1e-4 and torch.isnan(got[1])
    full = torch.ones(2, 16, 16, dtype=torch.bool)
    assert torch.allclose(masked_ssim(a, b, full), ssim_map(a, b, same=True).flatten(1).mean(1))
    assert torch.isnan(masked_ssim(a, b, mask)[1])


def test_moving_mask_marks_changed_pixels_only():
    prev = torch.zeros(1, 3, 4, 4)
    real = prev.clone()
    real[0, 1, 2, 3] = 2 / 255 * 2      # two uint8 levels on one channel: moves
    real[0, 0, 0, 0] = 1 / 255 * 2      # one level: quantisation noise, not motion
    m = moving_mask(real, prev)
    assert m.sum() == 1 and m[0, 2, 3]


def pong_episodes(n_eps=4, T=80, size=32):
    """A Pong background with the ball moving one pixel right per frame (wrapping), paddles still."""
    bg, ball = GAMES["Pong"]["background"], GAMES["Pong"]["objects"]["ball"][0]
    frames = np.tile(np.array(bg, np.uint8), (n_eps * T, size, size, 1))
    for e in range(n_eps):
        for t in range(T):
            frames[e * T + t, 16, (3 * e + t) % size] = ball
            frames[e * T + t, 12:16, size - 3] = GAMES["Pong"]["objects"]["player"][0]
    starts = np.arange(n_eps) * T
    return Episodes(frames, np.zeros(n_eps * T, np.int64), np.zeros(n_eps * T, np.float32), np.zeros(n_eps * T, bool),
                    starts, {"game": "Pong", "num_actions": 6})


def rollout_of(model):
    def rollout(context, actions, generator):
        K = actions.shape[1] - context.shape[1] + 1
        last = context[:, -1]
        if model == "copy":
            return last[:, None].expand(-1, K, *last.shape[1:]).clone()
        out = last[:, None].repeat(1, K, 1, 1, 1)
        for k in range(K):  # the true dynamics: the ball's row shifts right, the rest stays
            out[:, k, :, 16] = torch.roll(last[:, :, 16], k + 1, dims=-1)
        return out
    return rollout


def run_eval(model, run_dir=None, episodes=""):
    data = SimpleNamespace(val=pong_episodes())
    ecfg = SimpleNamespace(batch_size=16, world_horizons="8,16", world_rollouts=16, world_episodes=episodes)
    return evaluate_world(rollout_of(model), 2, data, {"eval": ecfg, "device": torch.device("cpu"), "run_dir": run_dir})


def test_a_perfect_model_beats_copy_last_on_moving_pixels_and_tracks_the_ball():
    res = run_eval("perfect")
    assert res["rollout_beats_copy_moving_all_steps_h16"] and res["rollout_beats_copy_all_steps_h16"]
    assert res["moving_psnr_h16"] > 90 and res["copy_last_moving_psnr_h16"] < 20   # exact vs a missing ball
    assert res["ball_within_2px_step8_h8"] == 1.0 and res["ball_within_2px_step8_h16"] == 1.0
    assert res["player_within_2px_step8_h16"] == 1.0
    assert abs(res["action_margin_db"]) < 1e-6       # the true dynamics ignore the actions
    assert res["world_gain_db"] == pytest.approx(res["tf_psnr"] - res["tf_copy_last_psnr"]) and res["world_gain_db"] > 50
    assert abs(res["action_margin_min_from_step2_db"]) < 1e-6


def test_copy_last_as_a_model_loses_the_moving_ball(tmp_path):
    res = run_eval("copy", tmp_path)
    assert res["moving_psnr_h16"] == res["copy_last_moving_psnr_h16"]
    assert not res["rollout_beats_copy_moving_all_steps_h16"]
    assert res["ball_within_2px_step8_h16"] == 0.0     # the ball is 8 px away by step 8
    assert res["player_within_2px_step8_h16"] == 1.0   # the paddle never moved
    table = (tmp_path / "world_eval.md").read_text()   # both horizons; the action margin only in the first
    assert table.count("### rollout H=") == 2 and table.count("| action margin |") == 1
    assert "| 8 | " in table and "0% / 0%" in table    # step 8: the ball is never within 2 or 4 px
    assert res["world_gain_db"] == 0.0                 # copy-last gains nothing over itself: the stall level


def test_world_gain_is_the_larger_of_the_teacher_forced_gain_and_the_action_margin():
    # Breakout, 2026-11-28 (seed 0): 1.9 dB under copy-last one step ahead, yet +9.5 dB of action margin: it learned
    assert world_gain_db({"tf_psnr": 61.14, "tf_copy_last_psnr": 63.21, "action_margin_db": 9.47}) == pytest.approx(9.47)
    # ViZDoom on random actions: under copy-last and blind to the actions: nothing learned
    assert world_gain_db({"tf_psnr": 27.68, "tf_copy_last_psnr": 28.96, "action_margin_db": -0.03}) == pytest.approx(-0.03)
    assert world_gain_db({"tf_psnr": 26.0, "tf_copy_last_psnr": 24.0}) == pytest.approx(2.0)  # no rollout horizon


def test_long_rollouts_report_drift_of_the_frame_fd(tmp_path):
    frames = np.random.default_rng(0).integers(0, 256, (140, 16, 16, 3), dtype=np.uint8)  # small frames: a cheap FD
    eps = Episodes(frames, np.zeros(140, np.int64), np.zeros(140, np.float32), np.zeros(140, bool), np.array([0, 70]),
                   {"num_actions": 2})
    data = SimpleNamespace(val=eps)
    ecfg = SimpleNamespace(batch_size=16, world_horizons="64", world_rollouts=8, world_episodes="")
    res = evaluate_world(rollout_of("copy"), 2, data, {"eval": ecfg, "device": torch.device("cpu"), "run_dir": None})
    # the last 32 steps' FD over the first 32's, from the per-step curve (a collapse grows it)
    assert res["frechet_last32_over_first32_h64"] > 0


def test_eval_world_episodes_scores_another_folder_and_refuses_a_mismatched_one(tmp_path):
    still = pong_episodes()
    frames = np.asarray(still.frames).copy()
    frames[:, 16] = GAMES["Pong"]["background"]   # no ball: nothing moves in the other folder
    write_episodes(tmp_path / "other", frames, still.actions, starts=still.starts, meta={"game": "Pong", "num_actions": 6})
    res = run_eval("copy", tmp_path / "run", episodes=str(tmp_path / "other"))
    assert (tmp_path / "run" / "world_eval_other.md").exists() and not (tmp_path / "run" / "world_eval.md").exists()
    assert res["rollout_psnr_h16"] == res["copy_last_psnr_h16"] and "moving_psnr_h16" not in res  # no moving pixels
    write_episodes(tmp_path / "small", frames[:, :16, :16], still.actions, starts=still.starts, meta={"num_actions": 6})
    with pytest.raises(GenlabError, match=r"eval.world_episodes '.*small' has frames \[16, 16, 3\], the run was trained on \[32, 32, 3\]"):
        run_eval("copy", episodes=str(tmp_path / "small"))
    write_episodes(tmp_path / "many", frames, np.full(len(frames), 9), starts=still.starts, meta={"num_actions": 10})
    with pytest.raises(GenlabError, match="has 10 discrete actions, the run's model takes 6 discrete actions"):
        run_eval("copy", episodes=str(tmp_path / "many"))


def test_breakout_rollouts_report_the_bricks_the_real_ball_removed():
    """Copy-last never removes a brick: of the rollouts where the real frames lose two bricks, none keeps up."""
    from test_objects import box64, breakout_wall
    full, gone = box64(breakout_wall()), box64(breakout_wall({(1, 4), (1, 5)}))
    T = 40
    frames = np.stack([full if t % T < 12 else gone for t in range(2 * T)])
    eps = Episodes(frames, np.zeros(2 * T, np.int64), np.zeros(2 * T, np.float32), np.zeros(2 * T, bool),
                   np.array([0, T]), {"game": "Breakout", "num_actions": 4})
    ecfg = SimpleNamespace(batch_size=16, world_horizons="16", world_rollouts=8, world_episodes="")
    res = evaluate_world(rollout_of("copy"), 2, SimpleNamespace(val=eps), {"eval": ecfg, "device": torch.device("cpu"),
                                                                            "run_dir": None})
    assert res["bricks_rollouts_with_removal_h16"] >= 2 and res["bricks_removed_share_h16"] == 0.0
    # no ball in these frames: every removal counts as one whose generated ball was not tracked
    assert res["bricks_removed_share_h16_ball_lost"] == 0.0 and "bricks_removed_share_h16_ball_tracked" not in res
    assert res.get("bricks_phantom_share_h16", 0.0) == 0.0


def test_pong_ball_shares_come_split_into_balls_in_flight_and_new_serves(tmp_path):
    """A point (a reward) after the context makes the ball of every later step a new serve: the ball shares are also
    given over those rollouts and over the others, each counted over its own windows."""
    eps = pong_episodes()
    T = len(eps.frames) // len(eps.starts)
    eps.rewards[np.arange(len(eps.starts)) * T + 10] = 1.0  # a point at frame 10 of every episode
    served = points_before(np.asarray(eps.rewards)[spaced_starts(eps, 2 + 16, 16)[:, None] + np.arange(18)], 2)
    assert served.any() and (~served).any() and (np.diff(served.astype(int), axis=1) >= 0).all()  # once served, stays
    # step k (1-based) counts a reward on a transition from the last context frame up to step k - 1's frame
    assert served.sum() == sum(s + 1 <= 10 <= s + k - 1 for s in spaced_starts(eps, 18, 16) % T for k in range(1, 17))
    data = SimpleNamespace(val=eps)
    ecfg = SimpleNamespace(batch_size=16, world_horizons="8,16", world_rollouts=16, world_episodes="")
    res = evaluate_world(rollout_of("copy"), 2, data, {"eval": ecfg, "device": torch.device("cpu"), "run_dir": tmp_path})
    ball = json.loads((tmp_path / "world_eval.json").read_text())["curves"]["16"]["objects"]["ball"]
    assert [a + b for a, b in zip(ball["served"]["visible"], ball["in_flight"]["visible"])] == ball["visible"]
    assert ball["served"]["visible"] == served.sum(0).tolist()
    assert res["ball_within_2px_step8_h16"] == 0.0 and "ball_within_2px_step8_h16_in_flight" in res
    assert "in flight / new serve" in (tmp_path / "world_eval.md").read_text()
    plain = evaluate_world(rollout_of("copy"), 2, SimpleNamespace(val=pong_episodes()), {"eval": ecfg, "device": torch.device("cpu")})
    assert plain["ball_within_2px_step8_h16"] == res["ball_within_2px_step8_h16"]  # the whole-set share is unchanged
