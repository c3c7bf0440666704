"""CLI of the world-model family: `genlab data collect|import|stats` and `genlab play`."""
from __future__ import annotations

import json


def cmd_collect(args):
    from genlab.world.collect import collect_atari
    from genlab.errors import GenlabError
    if args.source != "atari":
        raise GenlabError(f"unknown collection source '{args.source}'; valid choices: atari")
    path = collect_atari(args.game, args.frames, args.out, policy=args.policy, size=args.size, channels=args.channels,
                         workers=args.workers, seed=args.seed, max_episode=args.max_episode)
    print(f"wrote {path}")
    return 0


def cmd_import(args):
    from genlab.errors import GenlabError
    from genlab.world.tools import import_episodes
    if args.kind != "episodes":
        raise GenlabError(f"unknown import kind '{args.kind}'; valid choices: episodes")
    res = import_episodes(args.frames, args.actions, args.out, starts=args.episode_starts, size=args.size)
    print(f"wrote {res['path']}")
    return 0 if res["ok"] else 1


def cmd_stats(args):
    from genlab.world.tools import episode_stats
    res = episode_stats(args.dir, sheet=args.sheet)
    if args.json:
        print(json.dumps(res, indent=2))
    return 0


def add_data_commands(dsub):
    c = dsub.add_parser("collect", help="collect game frames + actions into an episode folder (gymnasium + ale-py)")
    c.add_argument("source", help="atari")
    c.add_argument("--game", default="Pong", help="any ALE game name, e.g. Pong, Breakout, MsPacman")
    c.add_argument("--frames", type=int, default=10000)
    c.add_argument("--policy", default="random", help="random | sticky (repeats its last action with p=0.8)")
    c.add_argument("--size", type=int, default=64, help="frames resized to SIZE x SIZE")
    c.add_argument("--channels", type=int, default=3, help="3 (RGB) or 1 (grey)")
    c.add_argument("--workers", type=int, default=0, help="processes (0 = one per core, up to frames/2000)")
    c.add_argument("--max-episode", dest="max_episode", type=int, default=1000, help="cut episodes at this many frames")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", required=True)
    c.set_defaults(fn=cmd_collect)
    i = dsub.add_parser("import", help="import your own recordings (frames + control file) with an alignment check")
    i.add_argument("kind", help="episodes")
    i.add_argument("--frames", required=True, help="a folder of images (sorted by name) or a uint8 .npy [T,H,W,C]")
    i.add_argument("--actions", required=True, help=".npy / .csv / .txt: one row per frame (ints = discrete, else vectors)")
    i.add_argument("--episode-starts", dest="episode_starts", default=None, help="file of episode start frame indices")
    i.add_argument("--size", type=int, default=0, help="resize image frames to SIZE x SIZE")
    i.add_argument("--out", required=True)
    i.set_defaults(fn=cmd_import)
    s = dsub.add_parser("stats", help="frames, episodes, action histogram and coverage, contact sheet of an episode folder")
    s.add_argument("dir")
    s.add_argument("--sheet", default=None, help="contact sheet PNG (default DIR/contact_sheet.png)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_stats)


def cmd_play(args):
    from genlab.world.play import run_play
    return run_play(args.run, host=args.host, port=args.port, device=args.device, steps=args.steps, record=args.record,
                    temperature=args.temperature)


def add_parser(sub):
    p = sub.add_parser("play", help="play a world-model run in a local web page (frames generated live)")
    p.add_argument("run", help="run folder or checkpoint of a method.name=world run")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=None, help="sampling steps per frame (default: method.sample_steps)")
    p.add_argument("--temperature", type=float, default=None,
                   help="scale of the starting noise: 0 the deterministic frame, 1 a sample (default: method.sample_temperature)")
    p.add_argument("--record", default=None, help="write the session as a video (GIF + MP4) to this path on exit")
    p.set_defaults(fn=cmd_play)
