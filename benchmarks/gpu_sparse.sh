#!/usr/bin/env bash
# Sparse Transformer (issue 16) on ONE H100/H200, ~8 min: GPU tests (flex backward vs dense, bf16), the
# attention speed/memory table at 3,072 and 12,288 tokens, and bits/dim of dense vs strided vs fixed at
# equal steps on MNIST (784 bytes), with wall-clock and a completion grid. Tables and logs in $OUT.
# Run from the repo root with the MNIST folders carried:  bash benchmarks/gpu_sparse.sh
#   (gpu_data/mnist/{train,test}: genlab data prepare mnist --src ../shared/data/mnist [--split test] --out ...)
# STAGES picks steps (default all): test bench quality; STEPS (default 1000) sets the training length.
# Under a 10-minute limit run it twice: STAGES="test bench" (~5 min), then STAGES=quality (~6 min).
# BLOCKS=128,64 times FlexAttention at each block size (model.sparse_block); BATCH=N overrides each case's batch;
# BACKENDS=flex,blocked picks the bench's backends; BACKEND (default auto) is model.sparse_backend of the quality runs;
# PATTERNS (default "dense strided fixed") picks them; FIXED_ARGS adds overrides to the fixed run, e.g.
# FIXED_ARGS="model.sparse_summary=7 model.sparse_summary_groups=4" (split gives the summary groups half the heads);
# ARGS adds overrides to every quality run, e.g. ARGS="model.heads=8" so all patterns share one head width.
set -u
source "$(dirname "$0")/gpu_common.sh"  # OUT, PYTHONPATH, stamp, the GPU/torch/commit header
STAGES=${STAGES:-"test bench quality"}
STEPS=${STEPS:-1000}
for s in $STAGES; do case $s in
test)    stamp test
         timeout ${T_TEST:-150} python3 -m pytest -q -p no:cacheprovider tests/test_sparse.py -k bf16 2>&1 | tail -15 >> "$OUT/main.log" ;;
bench)   stamp bench
         timeout ${T_BENCH:-240} python3 benchmarks/bench_sparse_attention.py --blocks ${BLOCKS:-128} ${BATCH:+--batch $BATCH} --backends ${BACKENDS:-flex,blocked} --out "$OUT/sparse_attention.md" > "$OUT/bench.log" 2>&1
         cat "$OUT/sparse_attention.md" >> "$OUT/main.log" 2>/dev/null || tail -20 "$OUT/bench.log" >> "$OUT/main.log" ;;
quality) stamp quality
         if [ ! -f gpu_data/mnist/train/meta.json ]; then echo "gpu_data/mnist/train missing (carry it)" | tee -a "$OUT/main.log"; continue; fi
         echo "overrides: ${ARGS:-none}; fixed also: ${FIXED_ARGS:-none}" > "$OUT/bits_per_dim.md"
         echo "| pattern | mode | backend | steps | val bits/dim | wall s | samples/s |" >> "$OUT/bits_per_dim.md"
         echo "| --- | --- | --- | ---: | ---: | ---: | ---: |" >> "$OUT/bits_per_dim.md"
         for p in ${PATTERNS:-dense strided fixed}; do
           extra="${ARGS:-}"; [ "$p" = fixed ] && extra="$extra ${FIXED_ARGS:-}"
           timeout ${T_RUN:-140} python3 -m genlab train mnist_sparse model.sparse_pattern=$p model.sparse_backend=${BACKEND:-auto} train.steps=$STEPS $extra \
             train.out_dir="$OUT/runs" train.name=$p log.tensorboard=false > "$OUT/train_$p.log" 2>&1
           python3 - "$OUT/runs/$p/summary.json" $p $STEPS ${BACKEND:-auto} >> "$OUT/bits_per_dim.md" <<'PY' || tail -5 "$OUT/train_$p.log" >> "$OUT/main.log"
import json, sys
s = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | split | {sys.argv[4]} | {sys.argv[3]} | {s['val_bits_per_dim']:.4f} | {s['wall_time']:.1f} | {s['samples_per_s']:.1f} |")
PY
         done
         cat "$OUT/bits_per_dim.md" >> "$OUT/main.log"
         timeout 120 python3 -m genlab sample "$OUT/runs/strided" --complete --out "$OUT/strided.png" >> "$OUT/main.log" 2>&1
         timeout 60 python3 -m genlab sample "$OUT/runs/strided" --attention 14,14 --out "$OUT/strided.png" >> "$OUT/main.log" 2>&1 ;;
esac; done
stamp done
