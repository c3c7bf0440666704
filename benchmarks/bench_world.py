"""World-model generation speed: next frames per second at 64x64 with 3 sampling steps (issue 15).

One "frame" = one full next-frame generation (sample_steps model evaluations). Rows: batch 1 (eager,
torch.compile, torch.compile mode=reduce-overhead = CUDA graphs) and batched (many environments
imagined in parallel). Prints one markdown table.

    python benchmarks/bench_world.py                         # the pong_world model, random weights, CUDA if present
    python benchmarks/bench_world.py --run runs/pong-world   # a trained run (what play uses)
    python benchmarks/bench_world.py --device cpu --quick    # CPU figures (batch 1 and 64)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genlab.core.tables import markdown_table  # noqa: E402


def build(args):
    from genlab.training.trainer import build_model_and_method
    if args.run:
        from genlab.runs.load import load_run
        cfg, model, method, dev, state = load_run(args.run, args.device)
        return model, method, dev, state["data_spec"]
    from genlab.config.tree import load_config
    cfg = load_config(args.preset, args.overrides)
    spec = {"kind": "episodes", "image_size": 64, "channels": 3, "num_actions": 6, "action_dim": 0,
            "context": cfg.data.context_frames, "horizon": cfg.data.horizon, "action_meanings": None, "num_classes": 0}
    model, method = build_model_and_method(cfg, spec)
    from genlab.runtime.parallel import resolve_device
    dev = resolve_device(args.device)
    return model.to(dev).eval(), method, dev, spec


def timed(fn, inputs, device, seconds):
    for _ in range(3):  # warm-up (and compile / graph capture)
        fn(*inputs)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(*inputs)
        n += 1
    sync()
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default=None)
    ap.add_argument("--preset", default="pong_world")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batches", default="1,256,4096")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="CPU: batch 1 and 64, eager only")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
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
        acts = (torch.randint(0, max(spec["num_actions"], 1), (b, L), device=dev))
        noise = torch.randn(b, C, S, S, device=dev)

        def gen(ctx, acts, noise):
            with torch.autocast(dev.type, dtype=dtype, enabled=cuda):
                return method.generate(model, ctx, acts, args.steps, noise=noise)

        for v in variants:
            if v != "eager" and b > 1 and v == "cudagraphs" and b > 4096:
                continue
            try:
                fn = gen if v == "eager" else torch.compile(gen, mode="reduce-overhead" if v == "cudagraphs" else "default")
                with torch.no_grad():
                    dt = timed(fn, (ctx, acts, noise), dev, args.seconds)
                rows.append((b, v, dt * 1e3, b / dt))
            except Exception as e:  # noqa: BLE001  (a variant that fails here is reported, not fatal)
                rows.append((b, v, float("nan"), f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"))
            if cuda:
                torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(dev) if cuda else "CPU"
    print(f"### world-model generation speed: {S}x{S}x{C}, {L} context frames, {args.steps} Euler steps, "
          f"{params / 1e6:.1f}M params, {'bf16' if cuda else 'fp32'}, {name}\n")
    print(markdown_table(["batch", "variant", "ms / batch", "frames / s"],
                         [[b, v, f"{ms:.2f}", fps if isinstance(fps, str) else format(fps, ",.0f")] for b, v, ms, fps in rows]))


if __name__ == "__main__":
    main()
