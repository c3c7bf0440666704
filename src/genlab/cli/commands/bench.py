"""`genlab bench [CONFIG] [key=value ...]`: time training steps on synthetic data of the config's shape. The timing
itself is in genlab.lab.bench, imported when the command runs (building the CLI's parser must not import torch: a bad
command line is answered in a fraction of a second)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from genlab.cli.commands import split_config_and_overrides
from genlab.core.errors import GenlabError

ORDER = 6


def cmd_bench(args):
    from genlab.config.tree import load_config
    preset, overrides = split_config_and_overrides(args.items)
    cfg = load_config(preset, overrides)
    if args.steps < 1 or args.warmup < 0:
        raise GenlabError("--steps must be >= 1 and --warmup >= 0")
    from genlab.lab.bench import format_table, run_bench  # torch is imported here, not when the CLI parser is built
    res = run_bench(cfg, steps=args.steps, warmup=args.warmup, profile_dir=args.profile, turn_lock=args.turn_lock)
    if res["world"] > 1 and int(os.environ.get("RANK", "0")) != 0:
        return 0
    print(format_table([res]))
    print(f"device: {res['device']}  world: {res['world']}  FLOPs/step: {res['flops_per_step']:.3e}  "
          f"compiled graphs: {res['graphs']} (recompiles after warmup: {res['recompiles']})  "
          f"host syncs/step: {res['host_syncs_per_step']}"
          + (f" at {', '.join(res['host_sync_sites'])}" if res["host_sync_sites"] else ""))
    if res.get("profile"):
        print((Path(args.profile) / "profile.md").read_text())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def add_parser(sub):
    p = sub.add_parser("bench", help="time training steps on synthetic data of the config's shape")
    p.add_argument("items", nargs="*", help="a preset name or .toml path, then dotted overrides")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation and autotuning happen here; 3 were too few for GPT-2 124M)")
    p.add_argument("--json", default=None, help="also write the result as JSON to this file")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="also run torch.profiler over 5 steps: GPU time per kernel category and top kernels in DIR/profile.md")
    p.add_argument("--turn-lock", default=None, metavar="FILE",
                   help="share one GPU with other bench processes given the same FILE: compile at the same time, take "
                        "turns to time (benchmarks/bench_backbones.py --parallel)")
    p.set_defaults(fn=cmd_bench)
