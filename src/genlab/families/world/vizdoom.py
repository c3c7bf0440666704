"""Collect first-person 3D frames with ViZDoom (`pip install vizdoom`: maps ship in the wheel, renders headless on the
CPU), docs/world.md. Every scenario gets the same controls, so one model's actions mean the same on every map.
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from genlab.core.errors import GenlabError
from genlab.data.episodes import check_out_folder, write_episodes
from genlab.families.world.collect import resize_frame, run_workers

# name -> (move, strafe, turn direction, attack, use); turn is scaled by --turn degrees per step
ACTIONS = {"noop": (0, 0, 0, 0, 0), "forward": (1, 0, 0, 0, 0), "back": (-1, 0, 0, 0, 0),
           "strafe_left": (0, -1, 0, 0, 0), "strafe_right": (0, 1, 0, 0, 0), "turn_left": (0, 0, -1, 0, 0),
           "turn_right": (0, 0, 1, 0, 0), "forward_left": (1, 0, -1, 0, 0), "forward_right": (1, 0, 1, 0, 0),
           "attack": (0, 0, 0, 1, 0), "use": (0, 0, 0, 0, 1)}
NAMES = list(ACTIONS)
POLICIES = ("explorer", "random")
ACTION_KINDS = ("discrete", "continuous")
# the explorer's intents and how often it picks each (walking dominates, as when a player explores)
INTENTS = {"forward": 0.42, "forward_left": 0.12, "forward_right": 0.12, "turn_left": 0.07, "turn_right": 0.07,
           "strafe_left": 0.06, "strafe_right": 0.06, "back": 0.03, "use": 0.03, "attack": 0.02}
CELL = 64.0  # map units per coverage cell (a Doom corridor is ~128 units wide)


def scenarios() -> list[str]:
    import vizdoom
    return sorted(f[:-4] for f in os.listdir(vizdoom.scenarios_path) if f.endswith(".cfg"))


def close_game(game) -> None:
    """Close a game and remove the empty `_vizdoom` folder the engine makes in the working directory."""
    game.close()
    try:
        os.rmdir("_vizdoom")
    except OSError:  # not there, not empty, or someone else's
        pass


def _make_game(scenario: str, doom_map: str | None, seed: int):
    try:
        import vizdoom as vzd
    except ImportError as e:
        raise GenlabError("collecting ViZDoom frames needs the vizdoom package: pip install vizdoom==1.3.2") from e
    if scenario not in scenarios():
        raise GenlabError(f"unknown ViZDoom scenario '{scenario}'; valid choices: {', '.join(scenarios())}")
    g = vzd.DoomGame()
    g.set_doom_config_path(os.path.join(tempfile.gettempdir(), "genlab_vizdoom.ini"))  # not _vizdoom.ini in the cwd
    g.load_config(os.path.join(vzd.scenarios_path, f"{scenario}.cfg"))
    g.set_window_visible(False)
    g.set_sound_enabled(False)
    g.set_screen_format(vzd.ScreenFormat.RGB24)
    g.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
    g.set_render_hud(True)
    if doom_map:
        g.set_doom_map(doom_map)
    g.clear_available_buttons()
    for b in ("MOVE_FORWARD", "MOVE_BACKWARD", "MOVE_LEFT", "MOVE_RIGHT", "TURN_LEFT_RIGHT_DELTA", "ATTACK", "USE"):
        g.add_available_button(getattr(vzd.Button, b))
    g.clear_available_game_variables()
    for v in ("POSITION_X", "POSITION_Y", "ANGLE"):
        g.add_available_game_variable(getattr(vzd.GameVariable, v))
    g.set_seed(seed)
    try:
        g.init()
    except Exception as e:  # a bad map name is only found here
        raise GenlabError(f"ViZDoom could not start scenario '{scenario}' map '{doom_map}': {str(e).splitlines()[0]}") from e
    return g


def buttons(vec, skip: int) -> list[float]:
    """[move, strafe, turn degrees per step, attack, use] -> the game's button values (the turn delta is per tic)."""
    move, strafe, turn, attack, use = vec
    return [float(move > 0), float(move < 0), float(strafe < 0), float(strafe > 0), turn / skip, float(attack), float(use)]


class Explorer:
    """Held intents with stuck detection (see the module docstring); continuous turns vary around --turn."""

    def __init__(self, rng: np.random.Generator, turn: float, continuous: bool):
        self.rng, self.turn, self.continuous = rng, turn, continuous
        self.plan: list[str] = []
        self.speed = 1.0
        self.recent: list[np.ndarray] = []

    def act(self, pos: np.ndarray) -> tuple[str, float]:
        self.recent = (self.recent + [pos])[-8:]
        walking = self.plan and ACTIONS[self.plan[0]][0] != 0
        if walking and len(self.recent) == 8 and np.linalg.norm(self.recent[-1] - self.recent[0]) < 16:
            side = str(self.rng.choice(["turn_left", "turn_right"]))
            self.plan = ["back"] * int(self.rng.integers(2, 5)) + ["use"] + [side] * int(self.rng.integers(4, 10))
            self.recent = []
        if not self.plan:
            intent = str(self.rng.choice(list(INTENTS), p=np.array(list(INTENTS.values())) / sum(INTENTS.values())))
            self.plan = [intent] * (1 if intent in ("use", "attack") else int(self.rng.geometric(1 / 8)))
            self.speed = float(np.clip(self.rng.normal(1.0, 0.35), 0.2, 2.0)) if self.continuous else 1.0
        return self.plan.pop(0), self.speed * self.turn


def _worker(args):
    scenario, doom_map, frames, policy, kind, size, channels, turn, skip, seed, max_episode = args
    game = _make_game(scenario, doom_map, seed)
    rng = np.random.default_rng(seed)
    explorer = Explorer(rng, turn, kind == "continuous")
    out_f, out_a, out_r, out_t, starts, pos = [], [], [], [], [0], []
    game.new_episode()
    t_ep = 0
    while len(out_f) < frames:
        state = game.get_state()
        xy = np.asarray(state.game_variables[:2], np.float32)
        name, deg = explorer.act(xy) if policy == "explorer" else (NAMES[int(rng.integers(len(NAMES)))], turn)
        vec = np.asarray(ACTIONS[name], np.float32) * np.array([1, 1, deg, 1, 1], np.float32)
        out_f.append(resize_frame(state.screen_buffer, size, channels))
        out_a.append(NAMES.index(name) if kind == "discrete" else vec)
        pos.append(np.asarray(state.game_variables, np.float32))
        out_r.append(game.make_action(buttons(vec, skip), skip))
        t_ep += 1
        ended = game.is_episode_finished()
        # ended in the game: the goal reached or the player dead, not the scenario's time limit
        out_t.append(bool(game.is_player_dead() or (ended and game.get_episode_time() < game.get_episode_timeout())))
        if (ended or t_ep >= max_episode) and len(out_f) < frames:
            if not ended and len(out_f) == frames - 1:
                continue  # a reset would leave a one-frame episode: run this one a step over max_episode instead
            game.new_episode()
            t_ep = 0
            starts.append(len(out_f))
            explorer.plan, explorer.recent = [], []
    close_game(game)
    if starts[-1] == len(out_f) - 1 and len(starts) > 1:  # a game that ended one frame short: drop the lone frame
        for lst in (out_f, out_a, out_r, out_t, pos):
            lst.pop()
        starts.pop()
    return (np.stack(out_f), np.stack(out_a) if kind == "continuous" else np.asarray(out_a, np.int64),
            np.asarray(out_r, np.float32), np.asarray(out_t), np.asarray(starts, np.int64), np.stack(pos))


def coverage(positions: np.ndarray, actions: np.ndarray, kind: str) -> dict:
    """Cells of CELL map units visited, the distance walked and the action histogram: what a collection covers."""
    cells = {(int(x // CELL), int(y // CELL)) for x, y in positions[:, :2]}
    steps = np.linalg.norm(np.diff(positions[:, :2], axis=0), axis=1)
    walked = float(steps[steps < 4 * CELL].sum())  # a jump of more than 4 cells is a new episode's spawn
    if kind == "discrete":
        hist = {name: int((actions == i).sum()) for i, name in enumerate(NAMES)}
    else:
        hist = {name: int((actions[:, i] != 0).sum()) for i, name in enumerate(("move", "strafe", "turn", "attack", "use"))}
    return {"cells_visited": len(cells), "cell_units": CELL, "distance_walked": round(walked, 1),
            "x_range": [float(positions[:, 0].min()), float(positions[:, 0].max())],
            "y_range": [float(positions[:, 1].min()), float(positions[:, 1].max())], "action_histogram": hist}


def collect_vizdoom(scenario: str, frames: int, out, policy: str = "explorer", actions: str = "discrete", size: int = 64,
                    channels: int = 3, workers: int = 0, seed: int = 0, max_episode: int = 1000, doom_map: str | None = None,
                    turn: float = 12.0, skip: int = 4, log=print):
    if policy not in POLICIES:
        raise GenlabError(f"unknown policy '{policy}' for vizdoom; valid choices: {', '.join(POLICIES)}")
    if actions not in ACTION_KINDS:
        raise GenlabError(f"unknown --actions '{actions}'; valid choices: {', '.join(ACTION_KINDS)}")
    if channels not in (1, 3):
        raise GenlabError(f"--channels must be 1 (grey) or 3 (RGB), got {channels}")
    if frames < 2 or size < 8 or max_episode < 2 or workers < 0 or skip < 1:
        raise GenlabError("need --frames >= 2, --size >= 8, --max-episode >= 2, --workers >= 0 and --skip >= 1")
    check_out_folder(out)
    close_game(_make_game(scenario, doom_map, seed))  # a bad scenario or map fails here, before any worker starts
    t0 = time.perf_counter()
    parts, starts = run_workers(_worker, frames, workers, seed, lambda n, s: (scenario, doom_map, n, policy, actions, size,
                                                                             channels, turn, skip, s, max_episode))
    acts, pos = np.concatenate([p[1] for p in parts]), np.concatenate([p[5] for p in parts])
    meta = {"source": f"vizdoom {scenario}{f' map {doom_map}' if doom_map else ''} (frame skip {skip}, 160x120 resized)",
            "game": "vizdoom", "scenario": scenario, "map": doom_map, "policy": policy, "seed": seed, "turn_degrees": turn,
            "coverage": coverage(pos, acts, actions)}
    if actions == "discrete":
        meta.update(num_actions=len(NAMES), action_meanings=NAMES)
    else:
        meta["action_meanings"] = ["move", "strafe", "turn_degrees", "attack", "use"]
    path = write_episodes(out, np.concatenate([p[0] for p in parts]), acts, np.concatenate([p[2] for p in parts]),
                          np.concatenate([p[3] for p in parts]), starts, meta)
    dt = time.perf_counter() - t0
    cov = meta["coverage"]
    log(f"collected {sum(len(p[0]) for p in parts)} frames of vizdoom {scenario} ({len(starts)} episodes) in {dt:.1f} s "
        f"with {len(parts)} worker(s): {frames / dt:.0f} frames/s; {cov['cells_visited']} cells of {CELL:.0f} units visited")
    return path
