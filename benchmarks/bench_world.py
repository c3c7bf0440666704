"""World model (issue 15): generation speed, next frames per second at 64x64 with 3 sampling steps, or (--sampling) a
trained run's rollouts under sampling settings.

    python benchmarks/bench_world.py                         # the pong_world model, random weights, CUDA if present
    python benchmarks/bench_world.py --run runs/pong-world   # a trained run (what play uses)
    python benchmarks/bench_world.py --device cpu --quick    # CPU figures (batch 1 and 64)
    python benchmarks/bench_world.py --run runs/pong-world --sampling --rollouts 64 --variants 0:q,1:n,0.5:q
    python benchmarks/bench_world.py --run runs/doom --sampling --variants 0:q,0:q:2,0:q:4   # action guidance
    python benchmarks/bench_world.py --run runs/doom --sampling --variants 0:q,0:q:1:0.1,0:q:1:0:8   # ctx noise, 8 steps
    python benchmarks/bench_world.py --collect atari,vizdoom --workers 1,2 --frames 4000   # collection frames/s

Speed: one "frame" = one full next-frame generation (sample_steps model evaluations); rows at batch 1 (eager,
torch.compile, torch.compile mode=reduce-overhead = CUDA graphs) and batched (many environments imagined at once).
--sampling: the same held-out windows evaluated with each (method.sample_temperature, method.quantize_frames[,
method.action_guidance[, method.sample_ctx_noise[, method.sample_steps]]]) variant;
rollout PSNR at the longest horizon against copy-last, the per-step margin range, whether the model wins at every
step, the in-domain Fréchet distance and the action-sensitivity margin.
--collect: `genlab data collect` (Pong with the sticky policy, ViZDoom my_way_home with the explorer) at each worker
count, 64x64: frames/s including process start-up and the episode folder's write, and frames/s per worker (core).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import device_name, error_cell, wall_ms

from genlab.config.tree import load_config
from genlab.core.errors import GenlabError
from genlab.core.tables import markdown_row, markdown_table
from genlab.data import build_dataset
from genlab.families.build import build_model_and_method
from genlab.families.world.method import check_world_config
from genlab.runs.load import load_run
from genlab.runtime.parallel import resolve_device


def build(args):
    if args.run:
        cfg, model, method, dev, state = load_run(args.run, args.device)
        return model, method, dev, state["data_spec"]
    cfg = load_config(args.preset, args.overrides)
    spec = {"kind": "episodes", "image_size": 64, "channels": 3, "num_actions": 6, "action_dim": 0,
            "context": cfg.data.context_frames, "horizon": cfg.data.horizon, "action_meanings": None, "num_classes": 0}
    model, method = build_model_and_method(cfg, spec)
    dev = resolve_device(args.device)
    return model.to(dev).eval(), method, dev, spec


VARIANT = "TEMPERATURE:q|n[:GUIDANCE[:CONTEXT_NOISE[:STEPS]]]"


def parse_variant(text: str) -> tuple[str, ...]:
    """VARIANT -> its five fields: guidance 1, context noise 0 and steps 0 (the run's own) when left out."""
    fields = text.split(":")
    if not 2 <= len(fields) <= 5 or fields[1] not in ("q", "n") or not (len(fields) < 5 or fields[4].isdigit()):
        print(f"error: --variants entry '{text}' is not {VARIANT}", file=sys.stderr)
        sys.exit(2)
    return tuple(fields + ["1", "0", "0"][len(fields) - 2:])


def apply_variant(mcfg, own_steps: int, temp: str, q: str, guidance: str, ctx_noise: str, steps: str) -> None:
    mcfg.sample_temperature, mcfg.quantize_frames = float(temp), q == "q"
    mcfg.action_guidance, mcfg.sample_ctx_noise = float(guidance), float(ctx_noise)
    mcfg.sample_steps = int(steps) or own_steps


def sampling_table(args):
    variants = [parse_variant(v) for v in args.variants.split(",")]  # a bad entry stops before the run loads
    cfg, model, method, dev, _ = load_run(args.run, args.device)
    cfg.eval.world_rollouts = args.rollouts
    data = build_dataset(cfg.data)
    rows, own_steps = [], method.mcfg.sample_steps
    for variant in variants:  # every variant passes the world method's own checks before any is scored
        try:
            apply_variant(method.mcfg, own_steps, *variant)
            check_world_config(cfg)
        except GenlabError as e:
            print(f"error: --variants {':'.join(variant)}: {e}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            apply_variant(method.mcfg, own_steps, *variant)
            temp, q, guidance, ctx_noise, _ = variant
            res = method.evaluate(model, data, {"eval": cfg.eval, "device": dev, "run_dir": tmp})
            curves = json.loads((Path(tmp) / "world_eval.json").read_text())["curves"]
            H = max(curves, key=int)
            margin = [m - c for m, c in zip(curves[H]["model"], curves[H]["copy_last"])]
            drift = res.get(f"frechet_last32_over_first32_h{H}", float("nan"))  # horizons of 64 and more
            rows.append([f"{float(temp):g}", "yes" if q == "q" else "no", f"{float(guidance):g}", f"{float(ctx_noise):g}",
                         str(method.mcfg.sample_steps),
                         f"{res['tf_psnr']:.2f} dB", f"{res[f'rollout_psnr_h{H}']:.2f} dB",
                         f"{res[f'copy_last_psnr_h{H}']:.2f} dB", f"{min(margin):+.2f} … {max(margin):+.2f} dB",
                         "yes" if min(margin) > 0 else "no", f"{res[f'frechet_h{H}']:.3f}", f"{drift:.2f}", f"{res['action_margin_db']:+.2f} dB",
                         f"{res.get('action_margin_min_from_step2_db', float('nan')):+.2f} dB"])
            print(markdown_row(rows[-1]), file=sys.stderr, flush=True)
    print(f"rollouts: {args.rollouts} held-out windows, horizon {H}; the run's own sampling steps: {own_steps}\n")
    print(markdown_table(["temperature", "quantised", "action guidance", "context noise", "sampling steps",
                          "teacher-forced PSNR", "rollout PSNR (mean)", "copy-last", "margin per step",
                          "beats copy-last at every step", "FD", "FD last 32 / first 32", "action margin",
                          "min action margin from step 2"], rows, "rlrrrrrrllrrrr"))


def collect_table(args):
    from genlab.families.world.collect import collect_atari
    from genlab.families.world.vizdoom import collect_vizdoom
    runs = {"atari": lambda n, w, out: collect_atari("Pong", n, out, policy="sticky", workers=w, log=lambda *_: None),
            "vizdoom": lambda n, w, out: collect_vizdoom("my_way_home", n, out, workers=w, log=lambda *_: None)}
    rows = []
    for source in args.collect.split(","):
        for w in map(int, args.workers.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                runs[source](args.frames, w, Path(tmp) / "ep")
                dt = time.perf_counter() - t0
            rows.append([source, w, args.frames, f"{dt:.1f}", f"{args.frames / dt:,.0f}", f"{args.frames / dt / w:,.0f}"])
            print(markdown_row(rows[-1]), file=sys.stderr, flush=True)
    print(markdown_table(["source", "workers", "frames", "seconds", "frames / s", "frames / s per worker"], rows, "lrrrrr"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default=None)
    ap.add_argument("--preset", default="pong_world")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batches", default="1,256,4096")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="CPU: batch 1 and 64, eager only")
    ap.add_argument("--sampling", action="store_true", help="the run's rollouts under each of --variants")
    ap.add_argument("--rollouts", type=int, default=64, help="--sampling: held-out windows per horizon (eval.world_rollouts)")
    ap.add_argument("--variants", default="1:n,1:q,0:n,0:q",
                    help=f"--sampling: comma-separated {VARIANT} (q = generated frames quantised to uint8 levels; "
                         "GUIDANCE = method.action_guidance, 1 by default: a run trained with method.action_dropout; "
                         "CONTEXT_NOISE = method.sample_ctx_noise, 0 by default; STEPS = method.sample_steps, the "
                         "run's own by default)")
    ap.add_argument("--collect", default=None, help="comma-separated sources (atari, vizdoom): time collection instead")
    ap.add_argument("--workers", default="1,2", help="--collect: comma-separated worker counts")
    ap.add_argument("--frames", type=int, default=4000, help="--collect: frames per collection")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.collect:
        return collect_table(args)
    if args.sampling:
        return sampling_table(args)
    model, method, dev, spec = build(args)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    L, C, S = spec["context"], spec["channels"], spec["image_size"]
    batches = [1, 64] if args.quick else [int(b) for b in args.batches.split(",")]
    variants = ["eager"] + ([] if args.quick or not cuda else ["compile", "cudagraphs"])
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for b in batches:
        ctx = torch.rand(b, L, C, S, S, device=dev) * 2 - 1
        acts = torch.randint(0, max(spec["num_actions"], 1), (b, L), device=dev)
        noise = torch.randn(b, C, S, S, device=dev)

        def gen(ctx, acts, noise):
            with torch.autocast(dev.type, dtype=dtype, enabled=cuda):
                return method.generate(model, ctx, acts, args.steps, noise=noise)

        for v in variants:
            if v == "cudagraphs" and b > 4096:
                continue
            try:
                fn = gen if v == "eager" else torch.compile(gen, mode="reduce-overhead" if v == "cudagraphs" else "default")
                with torch.no_grad():
                    # as many calls as fit in --seconds, after 3 warm-up calls (compile / graph capture)
                    ms = wall_ms(lambda: fn(ctx, acts, noise), 0, 3, dev, args.seconds)
                rows.append([b, v, f"{ms:.2f}", format(b / (ms / 1e3), ",.0f")])
            except Exception as e:  # noqa: BLE001  (a variant that fails here is reported, not fatal)
                rows.append([b, v, "nan", f"failed: {error_cell(e)}"])
            # each row as it lands: a run cut by its time limit keeps the rows it measured
            print(markdown_row(rows[-1]), file=sys.stderr, flush=True)
            if cuda:
                torch.cuda.empty_cache()
    print(f"### world-model generation speed: {S}x{S}x{C}, {L} context frames, {args.steps} Euler steps, "
          f"{params / 1e6:.1f}M params, {'bf16' if cuda else 'fp32'}, {device_name(dev)}\n")
    print(markdown_table(["batch", "variant", "ms / batch", "frames / s"], rows))


if __name__ == "__main__":
    sys.exit(main())
