"""Sampling throughput at FID scale (issue 54 §3): genlab's guided sampler on a DiT preset's network (random weights:
the time does not depend on them), one row per eval.sample_compile mode and batch, against a reference loop over the
public DiT code's `forward_with_cfg` with the same network evaluations and batch, each in this one process with the
compile caches reset between rows. Each row reports the first batch (compile and capture included: the cold start a
`genlab eval` pays once), the steady images/s over the timed batches, the minutes 50,000 samples would take at that
rate plus the first batch, and the peak memory. Decoding latents to pixels is not included (the autoencoder's own row
of `benchmarks/latents.py`).

    python benchmarks/bench_sampling.py --out DIR [--preset bench_dit_xl2] [--batch 256,512] [--steps 50] [--cfg 1.5]
        [--modes off,default,reduce-overhead] [--quant fp8] [--ref PATH/TO/DiT/models.py] [--batches 3]
    python benchmarks/bench_sampling.py --quick      # CPU smoke run: tiny DiT, 2 steps, one timed batch

--ref imports DiT's models.py (github.com/facebookresearch/DiT, which needs timm) and builds the model of the same
size; its loop is DiT's classifier-free guidance (both halves in one forward, guidance on its first three output
channels, as its sample.py) under an Euler update of the first four, compiled with torch.compile's default mode.
"""
from __future__ import annotations

import argparse
import importlib.util

import torch
from common import device_name, error_cell, report, wall_ms

from genlab.config.tree import load_config
from genlab.families.build import build_model_and_method
from genlab.lab.bench import data_spec_for
from genlab.nn.ptq import quantize_model
from genlab.runtime.metrics import peak_flops
from genlab.sampling.images import compiled_for_sampling, sample_images

DIT_NAMES = {"XL": "DiT-XL/2", "L": "DiT-L/2", "B": "DiT-B/2", "S": "DiT-S/2"}  # genlab size -> the reference's name (patch 2)


def timed(draw, batches: int, device) -> dict:
    """{first_s: seconds of the first call, batch_s: steady seconds per call over `batches` calls, peak_gib}."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first, steady = (wall_ms(draw, n, 0, device) / 1e3 for n in (1, batches))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return {"first_s": first, "batch_s": steady, "peak_gib": peak}


def genlab_row(cfg, mode: str, batch: int, args, device, quant: str | None = None) -> dict:
    model, method = build_model_and_method(cfg, data_spec_for(cfg))
    model = model.to(device).eval()
    if quant:  # what `genlab quantize RUN --to QUANT` does to a trained run's block linears before its evaluation
        quantize_model(model, quant, device)
    net = compiled_for_sampling(model, mode)
    labels = torch.arange(batch, device=device) % method.spec["num_classes"]
    gen = torch.Generator(device=device).manual_seed(0)

    def draw():
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            return sample_images(method, net, labels, steps=args.steps, cfg_scale=args.cfg, sampler="euler",
                                 generator=gen, device=device, batch=batch)
    return timed(draw, args.batches, device)


def reference_row(cfg, batch: int, args, device) -> dict:
    spec = importlib.util.spec_from_file_location("dit_reference_models", args.ref)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)  # the reference's own code, named on the command line
    size = cfg.model.size
    make = ref.DiT_models[DIT_NAMES[size]] if size in DIT_NAMES else None
    if make is None or cfg.model.patch_size != 2:
        raise ValueError(f"no reference DiT of size {size} with patch {cfg.model.patch_size}")
    d = data_spec_for(cfg)
    model = make(input_size=d["image_size"], in_channels=d["channels"], num_classes=d["num_classes"]).to(device).eval()
    step = torch.compile(model.forward_with_cfg)
    C, S = d["channels"], d["image_size"]
    y = torch.cat([torch.arange(batch, device=device) % d["num_classes"],
                   torch.full((batch,), d["num_classes"], device=device)])  # the second half: DiT's null class
    gen = torch.Generator(device=device).manual_seed(0)

    @torch.no_grad()
    def draw():
        x = torch.randn(batch, C, S, S, generator=gen, device=device)
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16):
            for i in range(args.steps):
                t = torch.full((2 * batch,), 999 - i * (1000 // args.steps), device=device)
                out = step(torch.cat([x, x]), t, y, args.cfg)
                x = x - out[:batch, :C].float() / args.steps
        return x
    return timed(draw, args.batches, device)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bench_dit_xl2")
    p.add_argument("--batch", default="256", help="comma-separated batch sizes")
    p.add_argument("--steps", type=int, default=50, help="Euler steps (2 network evaluations each, guided, in one forward)")
    p.add_argument("--cfg", type=float, default=1.5, help="guidance scale (DiT's FID-50k setting: 1.5)")
    p.add_argument("--modes", default="off,default,reduce-overhead", help="eval.sample_compile modes to time")
    p.add_argument("--quant", default="", help="also time each mode on the model quantized by `genlab quantize --to` this "
                                               "format (e.g. fp8: float8 block linears, torchao)")
    p.add_argument("--ref", default=None, help="path to the reference DiT's models.py (a row per batch)")
    p.add_argument("--batches", type=int, default=3, help="timed batches per row after the first")
    p.add_argument("--fp32", dest="bf16", action="store_false", help="no bf16 autocast")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: a tiny DiT, 2 steps, one timed batch")
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = p.parse_args()
    overrides = []
    if args.quick:
        overrides = ["model.size=tiny", "model.patch_size=4", "data.image_size=16", "data.num_classes=10"]
        args.steps, args.batches, args.batch, args.bf16 = 2, 1, "8", False
        args.modes = "off,default" if args.modes == p.get_default("modes") else args.modes
    cfg = load_config(args.preset, overrides)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = [int(b) for b in args.batch.split(",")]
    quants = [None] + ([args.quant] if args.quant else [])
    rows = [(mode, b, q) for b in batches for q in quants for mode in args.modes.split(",")] + \
        ([("reference", b, None) for b in batches] if args.ref else [])
    with torch.device("meta"):  # the FLOP count needs the shapes only
        forward = build_model_and_method(cfg, data_spec_for(cfg))[0].flops_per_sample()
    per_image = forward * args.steps * (2 if args.cfg != 1 else 1)  # both halves of the guided forward
    peak = peak_flops(device)
    lines = [f"`{args.preset}` ({cfg.model.name} {cfg.model.size}/{cfg.model.patch_size}), {args.steps} Euler steps, guidance "
             f"{args.cfg} in one batched forward, {'bf16 autocast' if args.bf16 else 'fp32'}, {device_name(device)}, torch "
             f"{torch.__version__}; {forward / 1e9:.4g} GFLOP per forward (the model's own count), so {per_image / 1e12:.4g} "
             "TFLOP per image; MFU against the bf16 dense peak", "",
             "| sampler | batch | first batch s | images/s | TFLOP/s | MFU | 50,000 samples, min | peak GiB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, b, quant in rows:
        torch._dynamo.reset()
        try:
            r = reference_row(cfg, b, args, device) if name == "reference" else genlab_row(cfg, name, b, args, device, quant)
            rate = b / r["batch_s"]
            cells = [f"{r['first_s']:.1f}", f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}", f"{rate * per_image / 1e12:.3g}",
                     f"{rate * per_image / peak:.1%}" if peak else "-", f"{(50_000 / rate + r['first_s']) / 60:.1f}",
                     f"{r['peak_gib']:.1f}"]
        except Exception as e:  # a row that cannot run here (no reference code, out of memory) says so in its cells
            cells = [error_cell(e), "", "", "", "", ""]
        label = "DiT reference, compiled" if name == "reference" else \
            f"genlab{f' {quant} (genlab quantize)' if quant else ''}, sample_compile={name}"
        lines.append(f"| {label} | {b} | " + " | ".join(cells) + " |")
        print("  " + lines[-1], flush=True)  # as it comes; the table (lines from "|") follows at the end
    report(lines, args.out)


if __name__ == "__main__":
    main()
