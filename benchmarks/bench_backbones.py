"""Backbone x attention training throughput (issue 17): img/s, MFU and peak memory of `genlab bench`'s own step for
every image backbone and attention entry at about DiT-B size, at 256 tokens (32x32x4 latents, patch 2) and 4,096
tokens (128x128x4 latents, patch 2), then the attention kernels alone over a range of token counts to find where
SANA's linear attention overtakes softmax attention (SDPA).

Each variant has the parameter count of DiT-B/2 (genlab.lab.match: depth 12, head width 64; --no-match keeps
the DiT-B shape). The batch holds 65,536 tokens at every length (256 x 256, 16 x 4,096). MFU is each variant's own
analytic FLOPs (linear attention's are linear in tokens) over the device peak, so it compares hardware use, not
work done. Compiled configurations run in their own process (dynamo's recompile limit, docs/benchmarks.md).
A row costs ~80 s on an H100, nearly all of it compilation: --parallel N runs N rows' processes at once, which
compile together and take turns on the GPU for warm-up and timing (`genlab bench --turn-lock`).

    python benchmarks/bench_backbones.py                       # GPU: the full table + crossover (bf16, compile)
    python benchmarks/bench_backbones.py --quick               # CPU smoke run at tiny size (fp32, eager, in process)
    python benchmarks/bench_backbones.py --backbones dit,mmdit --attention sdpa,linear --tokens 4096
    python benchmarks/bench_backbones.py --no-crossover --parallel 6   # the whole table, six rows compiling at once
"""
from __future__ import annotations

import argparse
import itertools
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch
from common import genlab_bench, genlab_env, wall_ms

from genlab.config.tree import load_config
from genlab.core.tables import markdown_row, markdown_table
from genlab.lab.bench import run_bench
from genlab.lab.match import matched_overrides, reference_params
from genlab.nn.attention_spec import attention_registry

BACKBONES = {"dit": [], "long_skips": ["model.long_skips=true"], "incontext_pre": ["model.name=dit_incontext"],
             "incontext_post": ["model.name=dit_incontext", "model.ln_placement=post"], "mmdit": ["model.name=mmdit"],
             "hybrid": ["model.name=mmdit", "model.dual_blocks={half}"]}  # half the blocks dual-stream
ATTENTION = ["sdpa", "flex", "sigmoid", "differential", "linear"]
TOKENS_PER_BATCH = 65536
QUICK = ["model.size=tiny", "train.device=cpu", "train.precision=fp32", "train.compile=off"]


def shape_overrides(tokens: int, patch: int = 2) -> tuple[list, dict]:
    side = int(round(tokens ** 0.5)) * patch
    if (side // patch) ** 2 != tokens:
        raise SystemExit(f"--tokens {tokens} is not a square number of patches")
    spec = {"kind": "image", "image_size": side, "channels": 4, "num_classes": 1000}
    return [f"data.image_size={side}", "data.channels=4", f"model.patch_size={patch}"], spec


def matched(overrides: list, spec: dict) -> list:
    """Width / MLP width giving this variant DiT-B/2's parameter count at this data shape."""
    cfg = load_config("bench_dit_b2", overrides)
    return matched_overrides(cfg.model, spec, reference_params(cfg.model, spec))


def bench_in_process(overrides, steps, warmup):
    try:
        return run_bench(load_config("bench_dit_b2", overrides), steps=steps, warmup=warmup)
    except Exception as e:  # noqa: BLE001 - one failed row (e.g. flex backward on CPU) must not stop the table
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:120]}


def bench_subprocess(overrides, steps, warmup, turn_lock=None, parallel=1):
    env = genlab_env()
    if turn_lock and "TORCHINDUCTOR_COMPILE_THREADS" not in env:  # several compiles share the host's cores
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, (os.cpu_count() or 2) // max(1, parallel)))
    return genlab_bench(["bench_dit_b2", *overrides], steps, warmup, *(["--turn-lock", str(turn_lock)] if turn_lock else []),
                        env=env)


def attention_ms(name, n, batch, heads, head_dim, device, dtype, reps):
    """Forward + backward of one attention call (ms), q/k/v [batch, heads, n, head_dim]."""
    entry = attention_registry.get(name)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, dtype=dtype, generator=g).requires_grad_()
               for _ in range(3))
    fn = entry(head_dim, heads, 0).to(device=device, dtype=dtype) if isinstance(entry, type) else entry
    return wall_ms(lambda: fn(q, k, v).float().sum().backward(), reps, warmup=2, device=device)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny CPU smoke run (fp32, eager, in process)")
    p.add_argument("--backbones", default=",".join(BACKBONES))
    p.add_argument("--attention", default=",".join(ATTENTION))
    p.add_argument("--tokens", default="256,4096", help="patch tokens per image (squares)")
    p.add_argument("--compile", default="model", help="train.compile of the GPU runs (off | model | blocks)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=10, help="untimed steps (compilation happens here)")
    p.add_argument("--no-match", action="store_true", help="keep the DiT-B shape instead of matching its parameters")
    p.add_argument("--crossover-tokens", default="256,512,1024,2048,4096,8192,16384")
    p.add_argument("--no-table", action="store_true", help="only the kernel crossover")
    p.add_argument("--no-crossover", action="store_true")
    p.add_argument("--parallel", type=int, default=1,
                   help="GPU: rows run as this many processes at once (compile together, time one at a time)")
    p.add_argument("--rows", default=None,
                   help="only these rows of the grid, as backbone:attention:tokens,... (re-measure failed rows)")
    p.add_argument("--out", default=None, help="also write the markdown to this file")
    args = p.parse_args()
    quick = args.quick or not torch.cuda.is_available()
    lines = []

    def emit(s=""):
        print(s, flush=True)
        lines.append(s)

    if not args.no_table:
        tokens = [16, 64] if args.quick else [int(x) for x in args.tokens.split(",") if x]
        emit(markdown_table(["backbone", "attention", "tokens", "batch", "dim", "img/s", "step ms", "MFU", "peak GiB"], [],
                            "llrrlrrrr"))
        rows = []  # (label cells, overrides or None when matching failed, error)
        wanted = None if args.rows is None else set(args.rows.split(","))
        if wanted and (bad := sorted(w for w in wanted if len(w.split(":")) != 3)):
            raise SystemExit(f"--rows takes backbone:attention:tokens items; got {bad}")
        for n, bb, att in itertools.product(tokens, args.backbones.split(","), args.attention.split(",")):
            shape, spec = shape_overrides(n)
            if wanted is not None and f"{bb}:{att}:{n}" not in wanted:
                continue
            batch = 4 if quick else max(1, TOKENS_PER_BATCH // n)
            ov = shape + [o.format(half=2 if quick else 6) for o in BACKBONES[bb]]  # of depth 4 (tiny) or 12 (B)
            ov += [f"model.attention={att}", f"train.batch_size={batch}", *(QUICK if quick else [f"train.compile={args.compile}"])]
            try:
                rows.append(((bb, att, n, batch), ov + ([] if args.no_match or quick else matched(ov, spec)), None))
            except Exception as e:  # noqa: BLE001
                rows.append(((bb, att, n, batch), None, f"match failed: {e}"))
        in_process = quick or args.compile == "off"
        lock = None if in_process or args.parallel < 2 else Path(tempfile.mkdtemp()) / "gpu.lock"

        def one(row):
            _, ov, err = row
            if ov is None:
                return {"error": err}
            if in_process:
                return bench_in_process(ov, 2 if quick else args.steps, 1 if quick else args.warmup)
            return bench_subprocess(ov, args.steps, args.warmup, lock, args.parallel)

        def show(row, r):
            (bb, att, n, batch), ov, _ = row
            dim = next((o.split("=")[1] for o in ov or [] if o.startswith("model.dim=")), "tiny" if quick else "B")
            if "error" in r:
                emit(markdown_row([bb, att, n, batch, dim, f"failed: {r['error']}", "", "", ""]))
                return
            mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
            emit(markdown_row([bb, att, n, batch, dim, f"{r['samples_per_s']:.1f}", f"{r['step_ms']:.1f}", mfu,
                               "n/a" if r.get("peak_mem_gib") is None else f"{r['peak_mem_gib']:.2f}"]))
        retry = []
        with ThreadPoolExecutor(1 if in_process else max(1, args.parallel)) as pool:
            futures = {pool.submit(one, row): row for row in rows}
            for fut in as_completed(futures):  # as they finish: a time limit keeps every row measured so far
                row, r = futures[fut], fut.result()
                if "error" in r and lock is not None and row[1] is not None:
                    retry.append(row)  # packed rows share GPU memory: one that failed runs again alone, below
                    print(f"# {row[0][:3]} failed while packed ({r['error'][:80]}); retried alone after the others",
                          flush=True)
                    continue
                show(row, r)
        for row in retry:
            show(row, bench_subprocess(row[1], args.steps, args.warmup))
        emit()
    if not args.no_crossover:
        dev, dtype = (torch.device("cpu"), torch.float32) if quick else (torch.device("cuda"), torch.bfloat16)
        heads, hd = (2, 16) if quick else (12, 64)
        toks = [16, 64, 256] if quick else [int(x) for x in args.crossover_tokens.split(",")]
        per_batch = 1024 if quick else TOKENS_PER_BATCH
        rows = [(n, b, *(attention_ms(att, n, b, heads, hd, dev, dtype, 3 if quick else 20) for att in ("sdpa", "linear")))
                for n in toks for b in [max(1, per_batch // n)]]
        first = next((n for n, _, s, lin in rows if lin < s), None)
        emit(f"Attention kernels alone, forward + backward, {heads} heads x {hd}, {dtype}, {per_batch} tokens per batch:")
        emit()
        emit(markdown_table(["tokens", "batch", "sdpa ms", "linear ms", "linear / sdpa"],
                            [[n, b, f"{s:.3f}", f"{lin:.3f}", f"{lin / s:.2f}"] for n, b, s, lin in rows]))
        emit()
        emit(f"crossover: linear attention is faster than sdpa from {first} tokens" if first else
             "crossover: linear attention was not faster than sdpa at any measured length")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
