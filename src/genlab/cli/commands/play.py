"""`genlab play RUN`: play a world-model run in a local web page, frames generated live."""
from __future__ import annotations

ORDER = 9


def cmd_play(args):
    from genlab.families.world.play import run_play
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
