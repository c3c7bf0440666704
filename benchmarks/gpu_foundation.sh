#!/usr/bin/env bash
# One GPU call (about 7 minutes on one H100): the foundation benchmark table, the loader table,
# the activation-checkpointing memory table and the default digits run on the GPU.
# Usage on the GPU machine, from the repo root:  OUT=/some/dir bash benchmarks/gpu_foundation.sh
set -uo pipefail
source "$(dirname "$0")/gpu_deps.sh"  # tomli_w for genlab train
export PYTHONPATH=src:${PYTHONPATH:-}
OUT=${OUT:-/tmp/genlab-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
git rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null || true
timeout 330 python3 benchmarks/bench_dit.py --steps 30 --warmup 10 | tee "$OUT/bench_dit.md"
for ac in none full every_k selective; do
  timeout 60 python3 -m genlab bench bench_dit_xl2 train.batch_size=256 train.compile=off \
    train.activation_checkpointing=$ac --steps 5 --warmup 2 --json "$OUT/ac_$ac.json" 2>&1 | tail -3
done | tee "$OUT/ac_memory.txt"
timeout 60 python3 benchmarks/bench_loader.py --device cuda --n 50000 --steps 100 | tee "$OUT/loader.md"
timeout 60 python3 benchmarks/bench_loader.py --device cuda --n 50000 --steps 100 --work-ms 20 | tee -a "$OUT/loader.md"
timeout 120 python3 -m genlab train log.progress=false train.out_dir="$OUT/runs" train.name=digits_gpu 2>&1 | tail -5 | tee "$OUT/digits_gpu.txt"
