"""ViZDoom collection (issue 53 §1): aligned frames and actions, the same controls on every scenario, the explorer's
unsticking, coverage statistics, and one-line refusals before any work."""
import json

import numpy as np
import pytest

from genlab.core.errors import GenlabError
from genlab.data.episodes import read_episodes

vizdoom = pytest.importorskip("vizdoom")


@pytest.fixture(scope="module")
def doom_dir(tmp_path_factory):
    from genlab.families.world.vizdoom import collect_vizdoom
    out = tmp_path_factory.mktemp("doom") / "ep"
    collect_vizdoom("my_way_home", 240, out, size=32, workers=1, seed=0, max_episode=120, log=lambda *_: None)
    return out


def test_collection_writes_aligned_frames_and_actions(doom_dir):
    """Replaying the recorded actions in a fresh game with the worker's seed reproduces every recorded next frame."""
    from genlab.families.world.collect import resize_frame
    from genlab.families.world.vizdoom import ACTIONS, NAMES, _make_game, buttons, close_game
    eps = read_episodes(doom_dir)
    assert eps.frames.shape == (240, 32, 32, 3) and eps.frames.dtype == np.uint8
    assert eps.discrete and eps.num_actions == len(NAMES) and eps.meta["action_meanings"] == NAMES
    assert eps.starts.tolist() == [0, 120]  # max_episode 120 cuts the episode (the goal was not reached)
    game = _make_game("my_way_home", None, 0)  # worker 0 of seed 0
    game.new_episode()
    end = int(eps.ends[0])
    assert np.array_equal(resize_frame(game.get_state().screen_buffer, 32, 3), eps.frames[0])
    for t in range(end - 1):
        vec = np.asarray(ACTIONS[NAMES[int(eps.actions[t])]], np.float32) * np.array([1, 1, 12.0, 1, 1], np.float32)
        game.make_action(buttons(vec, 4), 4)
        assert np.array_equal(resize_frame(game.get_state().screen_buffer, 32, 3), eps.frames[t + 1]), \
            f"frame {t + 1} is not the result of action {t}"
    close_game(game)


def test_a_turn_action_turns_the_view_by_its_degrees():
    from genlab.families.world.vizdoom import _make_game, buttons, close_game
    assert buttons([1, -1, 12.0, 0, 1], 4) == [1.0, 0.0, 1.0, 0.0, 3.0, 0.0, 1.0]
    game = _make_game("my_way_home", None, 1)
    game.new_episode()
    a0 = game.get_state().game_variables[2]
    game.make_action(buttons([0, 0, 12.0, 0, 0], 4), 4)
    a1 = game.get_state().game_variables[2]
    close_game(game)
    assert abs(((a0 - a1) % 360) - 12.0) < 0.5  # a positive delta turns right: the angle falls by 12 degrees


def test_explorer_backs_off_and_turns_when_it_walks_into_a_wall():
    from genlab.families.world.vizdoom import Explorer
    ex = Explorer(np.random.default_rng(0), 12.0, continuous=False)
    ex.plan = ["forward"] * 20
    moves = [ex.act(np.zeros(2, np.float32))[0] for _ in range(9)]
    assert moves[:7] == ["forward"] * 7 and moves[7] == "back"  # stuck after 8 positions that did not move
    rest = [ex.act(np.zeros(2, np.float32))[0] for _ in range(len(ex.plan))]
    assert "use" in rest and rest[-1] in ("turn_left", "turn_right")


def test_continuous_actions_and_coverage(tmp_path):
    from genlab.families.world.vizdoom import collect_vizdoom
    collect_vizdoom("my_way_home", 200, tmp_path / "c", actions="continuous", size=16, workers=1, seed=2, log=lambda *_: None)
    eps = read_episodes(tmp_path / "c")
    assert eps.actions.shape == (200, 5) and eps.action_dim == 5 and eps.actions.dtype == np.float32
    turns = eps.actions[:, 2][eps.actions[:, 2] != 0]
    assert len(turns) > 0 and len(np.unique(np.abs(turns))) > 3  # turn amounts vary around --turn
    cov = json.loads((tmp_path / "c" / "meta.json").read_text())["coverage"]
    assert cov["cells_visited"] >= 2 and cov["distance_walked"] > 0
    assert sum(cov["action_histogram"].values()) > 0


def test_bad_inputs_are_refused_before_any_work(tmp_path, capfd):
    from conftest import cli_in_process

    from genlab.families.world.vizdoom import collect_vizdoom
    with pytest.raises(GenlabError, match="unknown ViZDoom scenario 'nope'; valid choices: .*my_way_home"):
        collect_vizdoom("nope", 100, tmp_path / "a")
    with pytest.raises(GenlabError, match="valid choices: discrete, continuous"):
        collect_vizdoom("my_way_home", 100, tmp_path / "a", actions="joystick")
    r = cli_in_process(capfd, "data", "collect", "vizdoom", "--policy", "sticky", "--out", tmp_path / "b")
    assert r.returncode == 2 and "valid choices: explorer, random" in r.stderr
    r = cli_in_process(capfd, "data", "collect", "minecraft", "--out", tmp_path / "b")
    assert r.returncode == 2 and "valid choices: atari, vizdoom" in r.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
