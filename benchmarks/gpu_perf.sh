#!/usr/bin/env bash
# Performance tables for issue 5 on ONE H100/H200. Expected wall time: ~500 s (hard stop at 540 s;
# rows are ordered by priority and a row that would start after the deadline is skipped and listed).
# Every configuration runs in its own process (dynamo's recompile limit makes one-process sweeps lie).
# Run from the repo root:  bash benchmarks/gpu_perf.sh   (tables in $OUT/*.md, raw JSON in $OUT/json/)
# float8 crossover lives in benchmarks/gpu_float8.sh (another ~400 s), 2 GPUs in benchmarks/gpu_dist.sh.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT/json"
export PYTHONPATH=src:${PYTHONPATH:-}
python3 -m pip install --no-deps wheels/*.whl >/dev/null 2>&1 || echo "torchao wheel not installed (float8 rows will fail)"
START=$(date +%s); DEADLINE=${DEADLINE:-540}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
bench() {  # bench TABLE NAME TIMEOUT_S genlab-bench-args...
  local table=$1 name=$2 lim=$3; shift 3
  local left=$(( DEADLINE - ($(date +%s) - START) ))
  if (( left < 30 )); then echo "| $name | skipped: out of time |" >> "$OUT/skipped.md"; return; fi
  (( lim > left )) && lim=$left
  timeout "$lim" python3 -m genlab bench "$@" --json "$OUT/json/$name.json" > "$OUT/json/$name.log" 2>&1 \
    || echo "| $name | failed or timed out, see json/$name.log |" >> "$OUT/skipped.md"
  echo "$name" >> "$OUT/json/$table.list"
  echo "[$(( $(date +%s) - START ))s] $name done"
}
S="--steps 20 --warmup 5"
# 1. DiT-B/2 bs256 bf16: eager vs compile model vs blocks, + compiled autograd / optimizer
bench dit_b2 b2_eager 90 bench_dit_b2 train.compile=off $S
bench dit_b2 b2_model 120 bench_dit_b2 train.compile=model $S
bench dit_b2 b2_blocks 120 bench_dit_b2 train.compile=blocks $S
bench dit_b2 b2_model_copt 120 bench_dit_b2 train.compile=model train.compile_optimizer=true $S
# 2. DiT-XL/2 bs64 and bs128, compiled
bench dit_xl2 xl2_bs64 120 bench_dit_xl2 train.batch_size=64 $S
bench dit_xl2 xl2_bs128 120 bench_dit_xl2 train.batch_size=128 $S
# 3. memory: DiT-XL/2 bs256 per checkpointing mode (eager: memory does not need compile time)
for ac in none full every_k selective; do
  bench ac_xl2 ac_$ac 90 bench_dit_xl2 train.batch_size=256 train.compile=off train.activation_checkpointing=$ac --steps 5 --warmup 2
done
# 4. long sequence (16,384 tokens, head dim 16), SDPA
bench longseq longseq_sdpa 100 bench_longseq --steps 10 --warmup 3
# 5. lower priority: compiled autograd on top of compile=model
bench dit_b2 b2_model_cautograd 150 bench_dit_b2 train.compile=model train.compiled_autograd=true $S
python3 - "$OUT" <<'PY'
import json, sys, pathlib
sys.path.insert(0, "src")
from genlab.bench import format_table
out = pathlib.Path(sys.argv[1])
for lst in sorted((out / "json").glob("*.list")):
    rows = []
    for name in dict.fromkeys(lst.read_text().split()):
        p = out / "json" / f"{name}.json"
        if p.exists():
            rows.append(json.loads(p.read_text()))
    if rows:
        gpu = rows[0]["device"]
        (out / f"{lst.stem}.md").write_text(f"{lst.stem} on {gpu}\n\n" + format_table(rows) + "\n")
        print(f"\n## {lst.stem} ({gpu})\n" + format_table(rows))
PY
cat "$OUT/skipped.md" 2>/dev/null
echo "total $(( $(date +%s) - START ))s"
