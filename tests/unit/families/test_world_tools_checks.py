"""The world-model data tools and world training check their inputs before any work: `data import episodes`
(validated, then written atomically), `data collect` (--out, --max-episode), world training (actions that do not fit
the model's action count). Plus the alignment check on repeated actions (genlab's own sticky collection)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import cli_in_process

from genlab.core.errors import GenlabError
from genlab.data.episodes import read_episodes, write_episodes

pytestmark = pytest.mark.usefixtures("one_thread")


def toy_game(T=600, episodes=3, size=16, stick=0.0, seed=0):
    """tests/unit/families/test_world.py's game (a paddle moved by the action: frame t+1 follows action t, a ball on its own), with
    `data collect`'s sticky policy: each action repeats the previous one with probability `stick`."""
    rng = np.random.default_rng(seed)
    actions = np.zeros(T, np.int64)
    for t in range(T):
        actions[t] = actions[t - 1] if t and rng.random() < stick else rng.integers(0, 3)
    starts = np.linspace(0, T, episodes + 1)[:-1].astype(np.int64)
    frames = np.full((T, size, size, 3), 30, np.uint8)
    x = 0
    for t in range(T):
        x = size // 2 - 2 if t in starts else int(np.clip(x + (0, -2, 2)[actions[t - 1]], 0, size - 4))
        frames[t, size - 4:size - 1, x:x + 4] = (240, 240, 240)
        bx = (t * 3) % (size - 2)
        frames[t, 3:5, bx:bx + 2] = (220, 60, 60)
    return frames, actions, starts


def snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def assert_one_line_exit_2(r, needle):
    err = r.stderr.strip()
    assert r.returncode == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err


@pytest.fixture
def inputs(tmp_path):
    """Good frames/actions/starts files of the toy game, and broken variants."""
    frames, actions, starts = toy_game(T=120)
    np.save(tmp_path / "frames.npy", frames)
    np.savetxt(tmp_path / "good.csv", actions, fmt="%d")
    np.savetxt(tmp_path / "starts.txt", starts, fmt="%d")
    np.savetxt(tmp_path / "nan.csv", np.full(120, np.nan))
    vec = np.random.default_rng(0).normal(size=(120, 3)).astype(np.float32)
    vec[17, 1] = np.inf
    np.save(tmp_path / "inf_row.npy", vec)
    np.savetxt(tmp_path / "short.csv", actions[:50], fmt="%d")
    np.savetxt(tmp_path / "descending.txt", [0, 80, 40], fmt="%d")
    np.save(tmp_path / "float_frames.npy", frames.astype(np.float32))
    (tmp_path / "words.csv").write_text("left\nright\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "afile").write_text("x")
    return tmp_path


IMPORT_CASES = [
    ("all-NaN actions", ["--actions", "{t}/nan.csv"], "nan.csv: 120 of 120 action rows are not finite"),
    ("one inf action row", ["--actions", "{t}/inf_row.npy"], "first at row 17"),
    ("too few actions", ["--actions", "{t}/short.csv"], "50 actions for 120 frames"),
    ("descending episode starts", ["--actions", "{t}/good.csv", "--episode-starts", "{t}/descending.txt"], "episode_starts"),
    ("float frames", ["--actions", "{t}/good.csv", "--frames", "{t}/float_frames.npy"], "uint8"),
    ("actions not numbers", ["--actions", "{t}/words.csv"], "words.csv"),
    ("missing actions file", ["--actions", "{t}/none.csv"], "none.csv"),
    ("out not empty", ["--actions", "{t}/good.csv", "--out", "{t}/full"], "is not empty"),
    ("out is a file", ["--actions", "{t}/good.csv", "--out", "{t}/afile"], "is a file"),
    ("out under a file", ["--actions", "{t}/good.csv", "--out", "{t}/afile/sub/out"], "not a writable folder"),
]


@pytest.mark.parametrize("extra,needle", [c[1:] for c in IMPORT_CASES], ids=[c[0] for c in IMPORT_CASES])
def test_import_refuses_bad_input_before_writing(inputs, extra, needle, capfd):
    extra = [a.replace("{t}", str(inputs)) for a in extra]
    argv = ["data", "import", "episodes", "--frames", str(inputs / "frames.npy"), "--out", str(inputs / "new" / "out")]
    argv = argv + extra  # later flags win (argparse): a case may replace --frames or --out
    before = snapshot(inputs)
    assert_one_line_exit_2(cli_in_process(capfd, *argv), needle)
    assert snapshot(inputs) == before, "a refused import created or changed files"


def test_import_that_fails_while_writing_leaves_nothing(inputs, monkeypatch):
    """A failure after validation (disk full while saving) removes the half-written folder and the parents it made."""
    import genlab.data.episodes as episodes
    from genlab.families.world.tools import import_episodes
    real, calls = np.save, []

    def failing_save(path, arr):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(path, arr)

    before = snapshot(inputs)
    monkeypatch.setattr(episodes.np, "save", failing_save)
    with pytest.raises(OSError, match="No space"):
        import_episodes(inputs / "frames.npy", inputs / "good.csv", inputs / "new" / "out", log=lambda *a: None)
    assert len(calls) == 3 and snapshot(inputs) == before
    monkeypatch.setattr(episodes.np, "save", real)
    res = import_episodes(inputs / "frames.npy", inputs / "good.csv", inputs / "new" / "out", log=lambda *a: None)
    assert sorted(p.name for p in (inputs / "new").iterdir()) == ["out"]  # no temporary folder beside it
    assert read_episodes(res["path"]).actions.tolist() == np.loadtxt(inputs / "good.csv").astype(int).tolist()


def test_import_into_an_existing_empty_folder(inputs, capfd):
    (inputs / "empty").mkdir()
    r = cli_in_process(capfd, "data", "import", "episodes", "--frames", inputs / "frames.npy", "--actions",
                       inputs / "good.csv", "--episode-starts", inputs / "starts.txt", "--out", inputs / "empty")
    assert r.returncode == 0, r.stderr
    assert read_episodes(inputs / "empty").starts.tolist() == [0, 40, 80]


# -- the alignment check and repeated actions ------------------------------------------------------------
def _import(tmp_path, capfd, frames, actions, starts, name):
    np.save(tmp_path / f"{name}_frames.npy", frames)
    np.save(tmp_path / f"{name}_actions.npy", actions)
    np.save(tmp_path / f"{name}_starts.npy", starts)
    return cli_in_process(capfd, "data", "import", "episodes", "--frames", tmp_path / f"{name}_frames.npy",
                          "--actions", tmp_path / f"{name}_actions.npy", "--episode-starts", tmp_path / f"{name}_starts.npy",
                          "--out", tmp_path / name)


def test_sticky_actions_import_aligned_and_a_shifted_copy_is_late(tmp_path, capfd):
    """`data collect --policy sticky` repeats actions, so action t resembles action t-1 and 'explains' the change
    t-1 caused: the R^2 at lag -1 is well above half the best, which the check used to call 'late by 1'. The
    same episodes import as aligned, and the same actions one frame late are still flagged."""
    from genlab.data.episodes import Episodes
    from genlab.families.world.tools import alignment_check
    frames, actions, starts = toy_game(T=600, stick=0.8)
    eps = Episodes(frames, actions, np.zeros(600), np.zeros(600, bool), starts)
    rep = alignment_check(eps)
    assert rep["scores"][-1] > 0.5 * max(rep["scores"].values())  # what the old lag -1 rule fired on
    r = _import(tmp_path, capfd, frames, actions, starts, "own")
    assert r.returncode == 0 and "aligned" in r.stdout, r.stdout + r.stderr
    for shift, word in ((1, "late by 1"), (2, "late by 2"), (-1, "early by 1")):
        shifted = np.concatenate([np.roll(actions[a:b], shift) for a, b in zip(starts, np.append(starts[1:], 600))])
        r = _import(tmp_path, capfd, frames, shifted, starts, f"shift{shift}")
        if shift > 0:
            assert r.returncode == 1 and word in r.stdout, (shift, r.stdout)
        else:  # repeated actions blur an early file too; a random policy's is caught (test_world.py)
            assert r.returncode in (0, 1)


@pytest.mark.slow
def test_own_sticky_pong_collection_imports_aligned(tmp_path, capfd):
    """genlab's own collection (sticky policy, as docs/world.md collects) re-imported from its files: aligned; its
    actions one frame late: flagged."""
    pytest.importorskip("ale_py")
    pytest.importorskip("gymnasium")
    from genlab.families.world.collect import collect_atari
    src = collect_atari("Pong", 4000, tmp_path / "pong", policy="sticky", size=64, workers=1, log=lambda *a: None)
    eps = read_episodes(src)
    r = _import(tmp_path, capfd, np.asarray(eps.frames), eps.actions, eps.starts, "again")
    assert r.returncode == 0 and "aligned" in r.stdout, r.stdout + r.stderr
    ends = np.append(eps.starts[1:], len(eps.actions))
    late = np.concatenate([np.roll(eps.actions[a:b], 1) for a, b in zip(eps.starts, ends)])
    r = _import(tmp_path, capfd, np.asarray(eps.frames), late, eps.starts, "late")
    assert r.returncode == 1 and "late by 1" in r.stdout, r.stdout


# -- data collect ----------------------------------------------------------------------------------------
COLLECT_CASES = [
    ("max episode 0", ["--max-episode", "0"], "--max-episode must be >= 2"),
    ("max episode 1", ["--max-episode", "1"], "--max-episode must be >= 2"),
    ("negative workers", ["--workers", "-1"], "--workers"),
    ("out not empty", ["--out", "{t}/full"], "is not empty"),
    ("out is a file", ["--out", "{t}/afile"], "is a file"),
    ("out under a file", ["--out", "{t}/afile/pong"], "not a writable folder"),
]


@pytest.mark.parametrize("extra,needle", [c[1:] for c in COLLECT_CASES], ids=[c[0] for c in COLLECT_CASES])
def test_collect_refuses_bad_input_before_any_work(inputs, extra, needle, capfd, monkeypatch):
    import genlab.families.world.collect as collect

    def no_work(*a, **k):
        raise AssertionError("the emulator was started before the inputs were checked")

    monkeypatch.setattr(collect, "_make_env", no_work)
    extra = [a.replace("{t}", str(inputs)) for a in extra]
    before = snapshot(inputs)
    r = cli_in_process(capfd, "data", "collect", "atari", "--frames", "100", "--out", inputs / "new", *extra)
    assert_one_line_exit_2(r, needle)
    assert snapshot(inputs) == before


def test_collect_never_writes_one_frame_episodes(tmp_path):
    """21 frames cut at 10: the third episode would hold one frame; the second ends on its real next frame instead."""
    pytest.importorskip("ale_py")
    pytest.importorskip("gymnasium")
    import ale_py
    import gymnasium as gym

    from genlab.families.world.collect import collect_atari, resize_frame
    eps = read_episodes(collect_atari("Pong", 21, tmp_path / "p", size=16, workers=1, max_episode=10, log=lambda *a: None))
    assert eps.starts.tolist() == [0, 10] and len(eps.frames) == 21
    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", repeat_action_probability=0.0, frameskip=4)
    env.reset(seed=0)  # worker 0 of seed 0
    for _ in range(10):
        env.step(0)
    env.reset()
    for t in range(10, 20):
        obs, *_ = env.step(int(eps.actions[t]))
    assert np.array_equal(resize_frame(obs, 16, 3), eps.frames[20])  # the last frame follows the last action


@pytest.mark.slow  # two spawned emulator processes (~10 s)
def test_collect_caps_workers_at_two_frames_each(tmp_path):
    pytest.importorskip("ale_py")
    from genlab.families.world.collect import collect_atari
    eps = read_episodes(collect_atari("Pong", 5, tmp_path / "p", size=16, workers=4, log=lambda *a: None))
    assert len(eps.frames) == 5 and np.diff(np.append(eps.starts, 5)).min() >= 2


# -- world training: actions that do not fit the model ---------------------------------------------------
def _world_argv(tmp_path, data):
    return ["train", "pong_world_tiny", f"data.path={data}", "model.dim=32", "model.depth=1", "model.heads=2",
            "model.patch_size=4", "data.context_frames=2", "data.horizon=2", "train.steps=2", "log.progress=false",
            "log.tensorboard=false", f"train.out_dir={tmp_path}/runs", "train.name=w"]


def _toy_folder(tmp_path, **edit):
    frames, actions, starts = toy_game(T=60, size=16)
    actions[7] = 5
    folder = write_episodes(tmp_path / "toy", frames, actions, starts=starts)  # num_actions 6 in meta.json
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(edit)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_world_training_refuses_action_ids_past_the_model_before_the_run_folder(tmp_path, capfd):
    data = _toy_folder(tmp_path, num_actions=3)  # a hand-made meta.json: the model would embed 3 actions
    r = cli_in_process(capfd, *_world_argv(tmp_path, data))
    assert_one_line_exit_2(r, "action ids go up to 5 but the model's action count (num_actions in meta.json) is 3")
    assert not (tmp_path / "runs").exists()


def test_world_training_refuses_non_finite_action_vectors(tmp_path, capfd):
    data = _toy_folder(tmp_path)
    vec = np.random.default_rng(0).normal(size=(60, 2)).astype(np.float32)
    vec[3] = np.nan
    np.save(data / "actions.npy", vec)
    r = cli_in_process(capfd, *_world_argv(tmp_path, data))
    assert_one_line_exit_2(r, "first at row 3")
    assert not (tmp_path / "runs").exists()


def test_write_episodes_refuses_ids_past_num_actions_and_writes_nothing(tmp_path):
    frames, actions, starts = toy_game(T=30)
    actions[4] = 3
    with pytest.raises(GenlabError, match="go up to 3 .* is 3"):
        write_episodes(tmp_path / "e", frames, actions, starts=starts, meta={"num_actions": 3})
    assert list(tmp_path.iterdir()) == []
