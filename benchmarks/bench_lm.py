"""GPT-2 124M training throughput variants in one process (dynamo reset between them), plus an optional CUDA kernel
profile of one variant: the language-model issue's speed benchmark. Each variant is `genlab bench gpt2_124m` (vocab
50304, context 1024, bf16, compile, fused AdamW) with the overrides and the temporary change (`hook`) of VARIANTS.
Rows are printed as they finish and written to DIR/bench_lm.md and DIR/bench_lm.json.

    python benchmarks/bench_lm.py --out DIR [--profile new_b16] [--only a,b] [--budget 380]
    python benchmarks/bench_lm.py --quick            # CPU smoke run at tiny size
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
import traceback
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from common import REPO  # noqa: F401 - puts src/ on sys.path
from torch.nn.attention import SDPBackend, sdpa_kernel

from genlab.config.tree import load_config
from genlab.families.lm.autoregressive import Autoregressive
from genlab.lab.bench import BenchStep, format_table, profile_steps, run_bench

VARIANTS = {
    "old_loss_b16": (["train.batch_size=16"], "old_loss"),  # the loss outside the compiled model (the code before)
    "new_b16": (["train.batch_size=16"], None),  # the loss inside the compiled model: head + cross-entropy fused
    "new_b32": (["train.batch_size=32"], None),
    "new_b48": (["train.batch_size=48"], None),
    "chunk_b16": (["train.batch_size=16", "model.ce_chunk=4096"], None),  # fused linear + CE over 4096-token chunks
    "new_b64": (["train.batch_size=64"], None),
    "cudnn_b16": (["train.batch_size=16"], "cudnn"),  # SDPA restricted to one backend (torch 2.11 picks cuDNN on H100)
    "flash_b16": (["train.batch_size=16"], "flash"),
    "cudagraphs_b32": (["train.batch_size=32", "train.compile_mode=reduce-overhead"], None),
    "autotune_b16": (["train.batch_size=16", "train.compile_mode=max-autotune-no-cudagraphs"], None),
    "autotune_b32": (["train.batch_size=32", "train.compile_mode=max-autotune-no-cudagraphs"], None),
}
QUICK = ["model.size=tiny", "data.seq_len=64", "train.device=cpu", "train.precision=fp32", "train.compile=off"]


def old_loss(self, model, batch, generator):
    """Autoregressive.loss before the head and cross-entropy moved inside the compiled model."""
    self._check(model)
    return F.cross_entropy(model(batch["x"]).flatten(0, 1), batch["y"].flatten()), {}


def hook(name):
    """The temporary change a variant needs: the old loss path, or one SDPA backend."""
    if name == "old_loss":
        return mock.patch.object(Autoregressive, "loss", old_loss)
    if name in ("cudnn", "flash"):
        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION if name == "cudnn" else SDPBackend.FLASH_ATTENTION])
    return contextlib.nullcontext()


def profile(cfg, out: Path, steps=3):
    """GPU time by kernel category and the top kernels of a few steps after warm-up (`genlab bench --profile`'s
    summary): out/profile.md, profile.json and trace.json.gz."""
    b = BenchStep(cfg)
    for _ in range(12):
        b.step()
    profile_steps(b, steps, out)
    print((out / "profile.md").read_text()[:6000], flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--only", default="new_b16,old_loss_b16,new_b32,chunk_b16,cudnn_b16,autotune_b16")
    ap.add_argument("--profile", default="", help="variant to profile after the benches (e.g. new_b16)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: start no variant after this")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, rows, res = time.time(), [], {}
    names = [n for n in a.only.split(",") if n]
    for name in names + ([f"profile:{a.profile}"] if a.profile else []):
        if time.time() - t0 > a.budget:
            print(f"skipped {name}: past the {a.budget:.0f} s budget", flush=True)
            continue
        overrides, h = VARIANTS[name.split(":")[-1]]
        cfg = load_config("gpt2_124m", overrides + (QUICK if a.quick else []))
        torch._dynamo.reset()
        t1 = time.time()
        try:
            with hook(h):
                if name.startswith("profile:"):
                    profile(cfg, out)
                    continue
                r = run_bench(cfg, steps=2 if a.quick else a.steps, warmup=1 if a.quick else a.warmup)
        except Exception as e:  # noqa: BLE001 - one failed variant must not lose the others
            traceback.print_exc()
            res[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(f"{name}: FAILED {res[name]['error']}", flush=True)
            continue
        finally:
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
        r["variant"], r["wall_s"] = name, time.time() - t1
        res[name] = r
        rows.append(r)
        print(f"{name}: {r['tokens_per_s']:.0f} tokens/s, step {r['step_ms']:.1f} ms, "
              f"MFU {100 * (r['mfu'] or 0):.1f}%, peak {r['peak_mem_gib'] or 0:.2f} GiB, "
              f"recompiles {r['recompiles']}, {r['wall_s']:.0f} s", flush=True)
        (out / "bench_lm.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "bench_lm.json").write_text(json.dumps(res, indent=2, default=str))
    labels = "\n".join(f"- row {i + 1}: {r['variant']}" for i, r in enumerate(rows))
    (out / "bench_lm.md").write_text((format_table(rows) if rows else "(no rows)") + "\n\n" + labels + "\n")
    print((out / "bench_lm.md").read_text())


if __name__ == "__main__":
    main()
