"""Ball and paddle positions by colour (issue 53 §2): against the exact-colour centroid of the full-resolution
frame (the reference), on real Pong and Breakout frames box-resized to 64x64, and on synthetic frames."""
import itertools

import numpy as np
import pytest

from PIL import Image

from genlab.eval.objects import GAMES, brick_mass, bricks_removed, object_positions, position_errors


def test_a_blended_ball_is_found_at_its_centroid():
    bg = np.array(GAMES["Pong"]["background"], np.float32)
    ball = np.array(GAMES["Pong"]["objects"]["ball"][0], np.float32)
    f = np.tile(bg, (1, 64, 64, 1))
    f[0, 30, 20] = bg + 0.5 * (ball - bg)   # half the ball in this pixel, a quarter in each neighbour below/right
    f[0, 31, 20] = bg + 0.25 * (ball - bg)
    f[0, 30, 21] = bg + 0.25 * (ball - bg)
    pos = object_positions(f.round().astype(np.uint8), "Pong")
    assert np.allclose(pos["ball"][0], [20.25, 30.25], atol=0.02)
    assert np.isnan(pos["player"][0]).all() and np.isnan(pos["opponent"][0]).all()


def test_position_errors_measure_the_shift_and_count_lost_objects():
    bg = np.array(GAMES["Pong"]["background"], np.uint8)
    real = np.tile(bg, (3, 64, 64, 1))
    real[:, 30, 20] = GAMES["Pong"]["objects"]["ball"][0]
    gen = real.copy()
    gen[1, 30, 20], gen[1, 33, 24] = bg, GAMES["Pong"]["objects"]["ball"][0]   # moved by (4, 3): 5 px
    gen[2, 30, 20] = bg                                                        # lost
    real[0, 40, 40] = gen[0, 40, 40] = GAMES["Pong"]["objects"]["player"][0]   # no paddle in 1, 2: NaN there
    e = position_errors(real, gen, "Pong")["ball"]
    assert e["visible"] == 3 and e["lost"] == 1
    assert np.allclose(e["errors"][:2], [0.0, 5.0]) and np.isinf(e["errors"][2])
    p = position_errors(real, gen, "Pong")["player"]
    assert p["visible"] == 1 and p["lost"] == 0 and p["errors"][0] == 0 and np.isnan(p["errors"][1:]).all()


@pytest.mark.parametrize("game", ["Pong", "Breakout"])
def test_detection_at_64px_matches_the_full_resolution_reference(game):
    gym = pytest.importorskip("gymnasium")
    ale_py = pytest.importorskip("ale_py")
    from genlab.families.world.collect import resize_frame
    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}-v5", repeat_action_probability=0.0, frameskip=4)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    full = []
    for _ in range(300):
        obs, _, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        full.append(obs if not (term or trunc) else env.reset()[0])
    env.close()
    full = np.stack(full)
    pos = object_positions(np.stack([resize_frame(f, 64, 3) for f in full]), game)
    for name, (colour, (r0, r1)) in GAMES[game]["objects"].items():
        ref = np.full((len(full), 2), np.nan)
        c0, c1 = (round(c * 160) for c in GAMES[game].get("cols", (0, 1)))  # Breakout: between the walls
        for i, f in enumerate(full):
            ys, xs = np.where((f[int(round(r0 * 210)):int(round(r1 * 210)), c0:c1] == colour).all(-1))
            if len(ys):   # pixel centres mapped to the 64x64 grid
                ref[i] = [(xs.mean() + c0 + 0.5) * 64 / 160 - 0.5, (ys.mean() + round(r0 * 210) + 0.5) * 64 / 210 - 0.5]
        seen = ~np.isnan(ref[:, 0])
        assert seen.sum() > 100, f"{name}: too few reference frames"
        assert not (~seen & ~np.isnan(pos[name][:, 0])).any(), f"{name} found where the frame does not show it"
        found = seen & ~np.isnan(pos[name][:, 0])
        assert found.sum() >= 0.97 * seen.sum(), f"{name} missed on {seen.sum() - found.sum()} of {seen.sum()} frames"
        err = np.linalg.norm(pos[name][found] - ref[found], axis=1)
        assert err.mean() < 1.0 and np.percentile(err, 95) < 1.5, f"{name}: mean {err.mean():.2f} px"


def breakout_wall(removed=()) -> np.ndarray:
    """A full-resolution Breakout frame (210x160): black, grey side walls, six rows of 18 bricks; `removed` (row, col)
    bricks are gone."""
    colours = [(200, 72, 72), (198, 108, 58), (180, 122, 48), (162, 162, 42), (72, 160, 72), (66, 72, 200)]
    f = np.zeros((210, 160, 3), np.uint8)
    f[32:196, :8] = f[32:196, 152:] = 142
    for r, c in itertools.product(range(6), range(18)):
        if (r, c) not in removed:
            f[57 + 6 * r:63 + 6 * r, 8 + 8 * c:16 + 8 * c] = colours[r]
    return f


def box64(f: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(f).resize((64, 64), Image.BOX))


def test_brick_mass_counts_the_bricks_at_64x64():
    full, three_gone = box64(breakout_wall()), box64(breakout_wall({(0, 3), (2, 9), (5, 17)}))
    m = brick_mass(np.stack([full, three_gone]), "Breakout")
    assert m[0] == pytest.approx(108, rel=0.05)          # 6 x 18 bricks, the walls not counted
    assert m[0] - m[1] == pytest.approx(3, abs=0.3)      # three bricks, whatever their colour


def test_bricks_removed_by_the_real_ball_and_by_the_rollout():
    full, gone = box64(breakout_wall()), box64(breakout_wall({(1, 4), (1, 5)}))
    last = np.stack([full] * 3)
    real = np.stack([np.stack([full, gone]), np.stack([full, gone]), np.stack([full, full])])     # [3 rollouts, 2 steps]
    gen = np.stack([np.stack([full, gone]), np.stack([full, full]), np.stack([gone, gone])])
    b = bricks_removed(last, real, gen, "Breakout")
    assert b["rollouts_with_removal"] == [0, 2]
    assert b["removed_share"] == [None, 0.5]            # rollout 0 removed them too, rollout 1 kept them
    assert b["phantom_share"] == [1 / 3, 1.0]           # rollout 2 removed bricks the real ball never hit


def test_bricks_removed_split_by_whether_the_generated_ball_was_tracked_at_the_first_removal():
    full, gone = box64(breakout_wall()), box64(breakout_wall({(1, 4), (1, 5)}))
    last = np.stack([full] * 4)
    real = np.stack([np.stack([full, gone, gone])] * 3 + [np.stack([full, full, full])])  # removal at step 2 in 0-2
    gen = np.stack([np.stack([full, gone, gone]), np.stack([full, full, full]), np.stack([full, full, gone]),
                    np.stack([full, full, full])])
    tracked = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 1], [1, 1, 1]], bool)  # at step 2: tracked, lost, lost, (none)
    b = bricks_removed(last, real, gen, "Breakout", tracked)
    assert b["rollouts_ball_tracked"] == 1 and b["removed_share_ball_tracked"] == 1.0
    assert b["rollouts_ball_lost"] == 2 and b["removed_share_ball_lost"] == 0.5  # rollout 2 removed them late
    assert b["removed_share"][-1] == pytest.approx(2 / 3)  # the unsplit share is unchanged
    assert "removed_share_ball_tracked" not in bricks_removed(last, real, gen, "Breakout")
