"""Batched seeds (train.seeds) against the same seeds trained one after another: aggregate training img/s.

    python benchmarks/batched_seeds.py                                   # mnist_flow (DiT-S/4, batch 256), 8 seeds
    python benchmarks/batched_seeds.py --synthetic                       # ... on MNIST-shaped random images (no files)
    python benchmarks/batched_seeds.py --batched-set train.compile=model # the batched step compiled
    python benchmarks/batched_seeds.py --seeds 2 --lrs 1e-4,3e-4,1e-3,3e-3 # batched variants: 2 seeds x 4 lrs (train.lrs)
    python benchmarks/batched_seeds.py --preset digits_flow --seeds 4 --steps 10 --device cpu \\
        model.dim=32 model.depth=2 model.heads=2 train.batch_size=16    # a tiny CPU case

Both sides run the trainer's own steps after the same setup (models, optimizers, loaders, run folders in a temporary
directory; no eval): "sequential" times `--steps` steps of each single run in turn (after `--warmup` untimed ones)
and sums the times, as N runs one after another would spend training; "batched" times `--steps` steps of one
SeedsTrainer holding all N seeds. Aggregate img/s = N x batch x steps / seconds.
"""
from __future__ import annotations

import argparse
import tempfile

import torch
from common import wall_ms

from genlab.config.tree import load_config
from genlab.core.tables import markdown_table
from genlab.training.seeds import SeedsTrainer
from genlab.training.trainer import Trainer

MNIST_SHAPE = ["data.name=synthetic", "data.path=", "data.image_size=28", "data.channels=1", "data.num_classes=10",
               "data.size=8192"]


def timed_steps(step, warmup, steps, device) -> float:
    """Seconds of the calls step(warmup) .. step(warmup + steps - 1), after the untimed step(0) .. step(warmup - 1)."""
    i = iter(range(warmup + steps))
    return wall_ms(lambda: step(next(i)), steps, warmup, device) * steps / 1e3


def sequential(cfg_for, members, warmup, steps) -> float:
    """Seconds of `steps` training steps of each member's single run, summed."""
    total = 0.0
    for m in members:
        tr = Trainer(cfg_for(*m))
        tr.setup()
        total += timed_steps(lambda i, tr=tr: tr.steps(i, tr.loader.next), warmup, steps, tr.device)
        tr.log.close()
        del tr
    return total


def batched(cfg, warmup, steps) -> float:
    st = SeedsTrainer(cfg)
    st.setup()
    secs = timed_steps(st.engine, warmup, steps, st.runs[0].device)
    for r in st.runs:
        r.log.close()
    return secs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="mnist_flow")
    ap.add_argument("--seeds", type=int, default=8, help="number of seeds N (seeds 0..N-1)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--synthetic", action="store_true", help="MNIST-shaped random images instead of the preset's data")
    ap.add_argument("--lrs", default="", help="batched variants: these optim.lr values crossed with the seeds "
                    "(train.lrs; the sequential side runs each member at its lr)")
    ap.add_argument("--batched-set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for the batched run only (e.g. train.compile=model: the compiled vmapped step "
                         "against the single runs as the preset ships them)")
    ap.add_argument("overrides", nargs="*", help="config overrides for both sides (section.key=value)")
    a = ap.parse_args(argv)
    seeds = list(range(a.seeds))
    with tempfile.TemporaryDirectory() as tmp:
        base = [*(MNIST_SHAPE if a.synthetic else []), *a.overrides, f"train.device={a.device}", f"train.out_dir={tmp}",
                "log.progress=false", "log.tensorboard=false", f"train.steps={a.warmup + a.steps}"]

        lrs = [x for x in a.lrs.split(",") if x]
        members = [(s, lr) for lr in lrs or [None] for s in seeds]

        def cfg_for(s, lr):
            return load_config(a.preset, [*base, f"train.seed={s}", f"train.name=seq-{lr}-s{s}",
                                          *([f"optim.lr={lr}"] if lr else [])])
        cfg = load_config(a.preset, [*base, *a.batched_set, "train.seeds=" + ",".join(map(str, seeds)), "train.name=batched",
                                     *([f"train.lrs={a.lrs}"] if lrs else [])])
        B = cfg.train.batch_size
        dev = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else a.device if a.device != "auto" else "cpu")
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
        t_seq = sequential(cfg_for, members, a.warmup, a.steps)
        t_bat = batched(cfg, a.warmup, a.steps)
    imgs = len(members) * B * a.steps
    print(f"preset {a.preset}{' (synthetic MNIST-shaped data)' if a.synthetic else ''}"
          f"{', batched run with ' + ' '.join(a.batched_set) if a.batched_set else ''}, {cfg.model.name} dim "
          f"{cfg.model.dim or cfg.model.size}, batch {B} per run, {len(seeds)} seeds"
          f"{f' x lrs {a.lrs}' if lrs else ''} = {len(members)} runs, {a.steps} timed steps "
          f"(+{a.warmup} warm-up), {name}, torch {torch.__version__}")
    print(markdown_table(["mode", "seconds", "ms per step (sequential: one run; batched: all runs)", "aggregate img/s",
                          "vs sequential"],
                         [[mode, f"{t:.2f}", f"{1e3 * t / a.steps / (len(members) if mode.startswith('seq') else 1):.1f}",
                           f"{imgs / t:,.0f}", f"{t_seq / t:.2f}x"]
                          for mode, t in (("sequential single runs", t_seq), ("one batched run", t_bat))]))


if __name__ == "__main__":
    main()
