#!/usr/bin/env bash
# 2 GPUs of one host (nvidia-h200-x2): DiT-B/2 bs256 per GPU (global 512 on 2) bf16 compile=model on 1 GPU vs DDP vs FSDP2 on 2.
# Scaling target: 2-GPU img/s >= 90% of 2x the 1-GPU img/s. Expected wall time: ~300 s.
# Run from the repo root: bash benchmarks/gpu_dist.sh   (table in $OUT/dist.md)
set -u
OUT=${OUT:-out}; mkdir -p "$OUT/json"
export PYTHONPATH=src
S="--steps 20 --warmup 5"
timeout 150 python3 -m genlab bench bench_dit_b2 train.batch_size=256 $S --json "$OUT/json/d1.json" > "$OUT/json/d1.log" 2>&1
for p in ddp fsdp; do
  timeout 180 python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m genlab bench bench_dit_b2 train.batch_size=512 train.parallel=$p $S \
    --json "$OUT/json/d2_$p.json" > "$OUT/json/d2_$p.log" 2>&1 || echo "$p failed (see $OUT/json/d2_$p.log)"
done
python3 - "$OUT" <<'PY'
import json, sys, pathlib
sys.path.insert(0, "src")
from genlab.bench import format_table
out = pathlib.Path(sys.argv[1])
rows = [json.loads((out / "json" / f).read_text()) for f in ("d1.json", "d2_ddp.json", "d2_fsdp.json") if (out / "json" / f).exists()]
t = format_table(rows)
if rows and rows[0]["world"] == 1:
    one = rows[0]["samples_per_s"]
    t += "\n\n" + "\n".join(f"{r['switches']['parallel']} x{r['world']}: {r['samples_per_s'] / (2 * one):.1%} of 2x single-GPU" for r in rows[1:])
(out / "dist.md").write_text(f"on {rows[0]['device'] if rows else '?'}\n\n{t}\n"); print(t)
PY
