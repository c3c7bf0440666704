"""genlab's training step side by side with the public reference code (issue 54's speed targets are ratios against it):
DiT-B/2 batch 256 and DiT-XL/2 batch 128 against facebookresearch/DiT's models.py, GPT-2 124M (seq 1024) at batch 32
and 64 against karpathy/nanoGPT's model.py, both compiled. Each measurement runs in its own fresh process (a cold compile
cache, one after another): the reference's step in a child of this script, genlab's through `genlab bench PRESET`.

    python benchmarks/bench_reference.py --workload dit_b2 --ref-dit gpu_data/refs/DiT/models.py
    python benchmarks/bench_reference.py --workload gpt2_b32 --ref-nanogpt gpu_data/refs/nanoGPT/model.py \\
        [--steps 30 --warmup 10] [--which ref|genlab|both] [--set model.adaln=triton ...] [--out FILE]
    python benchmarks/bench_reference.py --workload dit_b2 --ref-dit M.py --device cpu --tiny --eager   # CPU smoke

The reference step is what the reference's own training script does, at genlab bench's settings:
- DiT (train.py): `DiT_models[NAME](input_size=32, num_classes=1000)` (learn_sigma: 8 output channels), AdamW(lr 1e-4,
  wd 0) as train.py builds it (torch's default foreach kernel; genlab: fused), an EMA updated by train.py's
  `update_ema` loop, no gradient clipping (genlab clips at optim.grad_clip=1). The loss is a stand-in: q_sample on
  DiT's linear 1000-step schedule at random t, then an MSE of the first 4 output channels against the noise (train.py
  uses gaussian_diffusion's training_losses, which adds the learned-sigma VLB term: a few elementwise ops more).
  bf16 autocast and `torch.compile(model)` as genlab's preset (train.py itself runs fp32 with TF32, uncompiled).
- nanoGPT (train.py): `GPT(GPTConfig(block_size=1024, vocab_size=50304, 12 layers, 12 heads, 768, dropout 0, no
  bias))`, `configure_optimizers(0.1, 6e-4, (0.9, 0.95), device)` (fused AdamW on CUDA), bf16 autocast, compiled, a
  disabled GradScaler, clip_grad_norm_ 1.0, zero_grad(set_to_none=True), the LR set on each group every step.
Both: one fixed random batch on the device (as genlab bench; train.py reads its data: DiT through a VAE, nanoGPT from
a memmap), TF32 on CUDA as both train.py set it, `--warmup` untimed steps, then one window of `--steps` steps between two
synchronisations (perf_counter), peak memory over the warm-up and the timed steps. genlab bench does the same (two windows only with
--turn-lock); its DiT step is one CUDA graph on a GPU (train.graph_step=auto; `--set train.graph_step=false` for the
plain step), that is part of what the ratio measures. MFU: genlab's analytic FLOP count of the matching preset
(without --set) for both rows, against genlab's bf16 dense peak of the device (GENLAB_PEAK_FLOPS overrides).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import device_name, genlab_bench, report

from genlab.config.tree import load_config
from genlab.core.tables import markdown_table
from genlab.families.build import build_model_and_method
from genlab.lab.bench import data_spec_for
from genlab.runtime.metrics import peak_flops


@dataclasses.dataclass(frozen=True)
class Workload:
    preset: str  # the genlab bench preset it matches
    batch: int
    family: str  # "dit" (facebookresearch/DiT) or "gpt" (karpathy/nanoGPT)
    dit_name: str = ""  # the reference's DiT_models key
    image_size: int = 32
    channels: int = 4
    num_classes: int = 1000
    seq_len: int = 1024
    vocab: int = 50257  # tokens drawn; the model's table is padded to a multiple of 64 (nanoGPT's 50304)
    gpt: tuple = (12, 12, 768)  # layers, heads, width
    genlab: tuple = ()  # genlab overrides that give the same shapes (--tiny)

    def overrides(self) -> list[str]:
        return [f"train.batch_size={self.batch}", *self.genlab]


WORKLOADS = {
    "dit_b2": Workload("bench_dit_b2", 256, "dit", "DiT-B/2"),
    "dit_xl2": Workload("bench_dit_xl2", 128, "dit", "DiT-XL/2"),
    "gpt2_b32": Workload("gpt2_124m", 32, "gpt"),
    "gpt2_b64": Workload("gpt2_124m", 64, "gpt"),
}


def tiny(w: Workload) -> Workload:
    """The same code at CPU-smoke sizes: DiT-S/2 on 8x8 latents, a 4-layer GPT of width 128 on 64 tokens."""
    if w.family == "dit":
        return dataclasses.replace(w, batch=2, dit_name="DiT-S/2", image_size=8, num_classes=10, genlab=(
            "model.size=S", "data.image_size=8", "data.num_classes=10"))
    return dataclasses.replace(w, batch=2, seq_len=64, vocab=256, gpt=(4, 4, 128), genlab=(
        "model.size=tiny", "data.seq_len=64", "data.vocab_size=256"))


def load_reference(path, name: str):
    """The reference's own file, imported by path (in sys.modules: dataclasses and dynamo look modules up there)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no reference file at {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@torch.no_grad()
def dit_train_ema(ema, model, decay=0.9999):
    """The EMA as DiT's train.py runs it: ema = decay ema + (1 - decay) param, two kernels per parameter tensor."""
    for kept, live in zip(ema.parameters(), model.parameters()):
        kept.mul_(decay).add_(live.detach(), alpha=1 - decay)


def dit_step(ref, w: Workload, device, compile: bool):
    make = ref.DiT_models.get(w.dit_name)
    if make is None:
        raise ValueError(f"the reference has no {w.dit_name}; it has {', '.join(ref.DiT_models)}")
    model = make(input_size=w.image_size, num_classes=w.num_classes).to(device)
    ema = copy.deepcopy(model).to(device)
    ema.requires_grad_(False)
    dit_train_ema(ema, model, decay=0)
    model.train()
    ema.eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    net = torch.compile(model) if compile else model
    gen = torch.Generator(device=device).manual_seed(0)
    B, C, S = w.batch, w.channels, w.image_size
    x = torch.randn(B, C, S, S, device=device, generator=gen)
    y = torch.randint(0, w.num_classes, (B,), device=device, generator=gen)
    # DiT's create_diffusion(""): the linear schedule, 1000 steps, betas 1e-4..0.02 in float64; q_sample's coefficients
    abar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)
    a, s = abar.sqrt().float().to(device), (1 - abar).sqrt().float().to(device)

    def step():
        t = torch.randint(0, 1000, (B,), device=device)
        noise = torch.randn_like(x)
        x_t = a[t].view(B, 1, 1, 1) * x + s[t].view(B, 1, 1, 1) * noise
        with torch.autocast(device.type, torch.bfloat16):
            out = net(x_t, t, y)
        loss = F.mse_loss(out[:, :C].float(), noise)  # the epsilon MSE; the learned sigma's VLB term left out
        opt.zero_grad()
        loss.backward()
        opt.step()
        dit_train_ema(ema, model)
    return step


def gpt_step(ref, w: Workload, device, compile: bool):
    layers, heads, width = w.gpt
    conf = ref.GPTConfig(block_size=w.seq_len, vocab_size=64 * math.ceil(w.vocab / 64), n_layer=layers, n_head=heads,
                         n_embd=width, dropout=0.0, bias=False)
    model = ref.GPT(conf).to(device)
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
    scaler = torch.amp.GradScaler(device.type, enabled=False)  # train.py's, off for bf16
    net = torch.compile(model) if compile else model
    gen = torch.Generator(device=device).manual_seed(0)
    X = torch.randint(0, w.vocab, (w.batch, w.seq_len), device=device, generator=gen)
    Y = torch.randint(0, w.vocab, (w.batch, w.seq_len), device=device, generator=gen)

    def step():
        for group in opt.param_groups:  # train.py sets its (cosine) LR every iteration
            group["lr"] = 6e-4
        with torch.autocast(device.type, torch.bfloat16):
            _, loss = net(X, Y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    return step


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_reference(w: Workload, path, steps: int, warmup: int, device="cpu", compile: bool = True) -> dict:
    """The reference's training step: {samples_per_s, tokens_per_s, step_ms, peak_gib, peak_flops}."""
    device = torch.device(device)
    torch.manual_seed(0)
    if device.type == "cuda":  # as both train.py files
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    ref = load_reference(path, f"{w.family}_reference")
    step = (dit_step if w.family == "dit" else gpt_step)(ref, w, device, compile)
    if device.type == "cuda":  # the peak spans the warm-up, as genlab bench's (whose graph step allocates there)
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    step_s = (time.perf_counter() - t0) / steps
    rate = w.batch / step_s
    return {"samples_per_s": rate, "tokens_per_s": rate * w.seq_len if w.family == "gpt" else None,
            "step_ms": 1e3 * step_s, "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda"
            else None, "peak_flops": peak_flops(device), "device": device_name(device), "torch": torch.__version__}


def flops_per_step(w: Workload) -> float:
    """genlab's analytic training FLOPs of the matching preset at this batch (what `genlab bench` divides by)."""
    cfg = load_config(w.preset, w.overrides())
    with torch.device("meta"):  # shapes only
        model, method = build_model_and_method(cfg, data_spec_for(cfg))
    return float(method.train_flops_per_sample(model, cfg.train.steps) * w.batch)


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def _rate(v) -> str:
    return "n/a" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def table(rows: list[dict]) -> str:
    """One markdown row per measurement; genlab's rows divided by the reference's rate of the same workload."""
    ref = {r["workload"]: r.get("samples_per_s") for r in rows if r["side"] == "reference"}
    body = []
    for r in rows:
        base = ref.get(r["workload"])
        ratio = f"{r['samples_per_s'] / base:.2f}x" if r["side"] == "genlab" and base and r.get("samples_per_s") else ""
        if r.get("error"):
            cells = [r["error"], "", "", "", "", ""]
        else:
            mfu = None if r.get("mfu") is None else 100 * r["mfu"]
            cells = [_rate(r.get("samples_per_s")), _rate(r.get("tokens_per_s")), _fmt(r.get("step_ms"), ".1f"),
                     "n/a" if mfu is None else f"{mfu:.1f}%", _fmt(r.get("peak_gib"), ".2f"), ratio]
        body.append([r["workload"], r["code"], *cells])
    return markdown_table(["workload", "code", "samples/s", "tokens/s", "step ms", "MFU", "peak GiB", "genlab/reference"],
                          body)


def run_child(args, wname: str, path: str) -> dict:
    """The reference's step in a fresh process of this script (a cold compile cache)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, __file__, "--workload", wname, "--which", "ref", "--steps", str(args.steps), "--warmup",
               str(args.warmup), "--device", args.device, "--child-out", str(out), "--ref-dit", str(args.ref_dit),
               "--ref-nanogpt", str(args.ref_nanogpt)] + ["--tiny"] * args.tiny + ["--eager"] * args.eager
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not out.exists():
            print(r.stdout[-2000:], r.stderr[-3000:], file=sys.stderr, flush=True)
            return {"error": ([x for x in r.stderr.strip().splitlines() if x.strip()] or ["failed"])[-1][:160]}
        return json.loads(out.read_text())


def measure(args, wname: str, side: str) -> dict:
    w = WORKLOADS[wname]
    w = tiny(w) if args.tiny else w
    flops = flops_per_step(w)
    if side == "ref":
        label = "reference: DiT models.py " + w.dit_name if w.family == "dit" else "reference: nanoGPT model.py"
        r = run_child(args, wname, args.ref_dit if w.family == "dit" else args.ref_nanogpt)
        peak = r.get("peak_flops")
    else:
        sets = args.set or []
        label = " ".join(["genlab", w.preset, *sets])
        device = [] if args.device == "auto" else [f"train.device={args.device}"]
        items = [w.preset, *w.overrides(), *device, *(["train.compile=off"] if args.eager else []), *sets]
        r = genlab_bench(items, args.steps, args.warmup)
        r = {**r, "peak_gib": r.get("peak_mem_gib")}
        # the device's peak genlab divided by: its MFU is its own FLOPs over time and peak
        peak = r["flops_per_step"] / (r["step_ms"] / 1e3) / r["mfu"] if r.get("mfu") else None
    row = {"workload": wname, "side": "reference" if side == "ref" else "genlab", "code": label,
           **{k: r.get(k) for k in ("samples_per_s", "tokens_per_s", "step_ms", "peak_gib", "device", "error")},
           "flops_per_step": flops}
    row["mfu"] = flops / (row["step_ms"] / 1e3) / peak if peak and row.get("step_ms") else None
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS), help="the matched pair of shapes")
    p.add_argument("--ref-dit", default="gpu_data/refs/DiT/models.py", help="facebookresearch/DiT's models.py (needs timm)")
    p.add_argument("--ref-nanogpt", default="gpu_data/refs/nanoGPT/model.py", help="karpathy/nanoGPT's model.py")
    p.add_argument("--which", default="both", choices=("ref", "genlab", "both"))
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (compilation)")
    p.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE", help="genlab overrides (its row only)")
    p.add_argument("--device", default="auto", help="auto (cuda when there is one), cuda or cpu")
    p.add_argument("--tiny", action="store_true", help="CPU-smoke sizes: DiT-S/2 on 8x8 latents, a 4-layer GPT, batch 2")
    p.add_argument("--eager", action="store_true", help="no torch.compile on either side (genlab: train.compile=off)")
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)  # the reference's process writes its result here
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child_out:
        w = tiny(WORKLOADS[args.workload]) if args.tiny else WORKLOADS[args.workload]
        path = args.ref_dit if w.family == "dit" else args.ref_nanogpt
        res = time_reference(w, path, args.steps, args.warmup, args.device, compile=not args.eager)
        Path(args.child_out).write_text(json.dumps(res))
        return
    sides = ["ref", "genlab"] if args.which == "both" else [args.which]
    rows = []
    for side in sides:  # one after another, each in its own process
        rows.append(measure(args, args.workload, side))
        print("  " + table(rows[-1:]).splitlines()[-1], flush=True)
    w = tiny(WORKLOADS[args.workload]) if args.tiny else WORKLOADS[args.workload]
    lines = [f"`{args.workload}`: batch {w.batch}, {args.warmup} warm-up + {args.steps} timed steps, bf16 autocast, "
             f"{'eager' if args.eager else 'compiled'}, {rows[0].get('device') or args.device}, torch {torch.__version__}; "
             f"MFU from genlab's count for `{w.preset}`, {rows[0]['flops_per_step'] / 1e12:.4g} TFLOP/step, for both rows"
             + ("; the DiT reference's loss is an epsilon MSE on its output (a stand-in for its diffusion's "
                "training_losses)" if w.family == "dit" else ""), "", table(rows)]
    report(lines, args.out)
    # the sweep engine reads the JSON a stage's output ends with: one row, or all of them
    print(json.dumps(rows[0] if len(rows) == 1 else {"rows": rows}))


if __name__ == "__main__":
    main()
