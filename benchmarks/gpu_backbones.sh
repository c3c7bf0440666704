#!/usr/bin/env bash
# Backbone x attention zoo (issue 17) on ONE H100/H200; tables and sweep reports land in $OUT.
#   table    benchmarks/bench_backbones.py: img/s, MFU, peak memory per backbone x attention at DiT-B/2's parameter
#            count, 256 and 4,096 tokens, bf16, compile=model, one process per row. Measured: ~80 s a row on an H100,
#            nearly all compilation (COMPILE=blocks compiles one block graph). PARALLEL rows (default 2: DiT-B/2 at
#            batch 256 peaks at 24-30 GiB, so 5 at once ran out of memory) compile at once and take turns on the GPU for
#            timing (genlab bench --turn-lock); a row that fails while packed runs again alone after the others. Rows print
#            as they finish, so the T_TABLE cap keeps every finished row. ROWS=bb:att:tokens,... re-measures chosen rows.
#            Split the 60 rows over calls with BACKBONES / ATTENTION / TOKENS, each call < 10 min
#   cross    the attention kernels alone (sdpa vs linear, fwd+bwd, 12 heads x 64, bf16) from 256 to 16,384 tokens
#   sweeps   genlab sweep architectures and attention on MNIST (matched parameters, 2000 steps a run, 6 runs each),
#            JOBS runs at once on the GPU (default 6: DiT-S/4 at 49 tokens is launch-bound, 6.5% MFU alone; a packed
#            run that runs out of memory is retried alone). No run starts after SWEEP_BUDGET s (default 120) and each
#            is capped at RUN_TIMEOUT s (default 420: six packed runs took 230-310 s each with their evaluation on an
#            H100, and a 300 s cap cut them all); one sweep per call (SWEEPS=architectures, then SWEEPS=attention),
#            SWEEP_BUDGET + RUN_TIMEOUT under the 600 s call limit; call again on the same warm machine to continue (finished runs
#            are skipped, SWEEP_ROOT persists)
# Needs gpu_data/mnist/*.gz (carried) for the sweeps. Examples (repo root):
#   OUT=out STAGES=cross bash benchmarks/gpu_backbones.sh
#   OUT=out STAGES=table TOKENS=256 BACKBONES=dit,incontext_pre,incontext_post bash benchmarks/gpu_backbones.sh
#   OUT=out STAGES=table TOKENS=4096 BACKBONES=mmdit,hybrid ATTENTION=sdpa,linear bash benchmarks/gpu_backbones.sh
#   OUT=out STAGES=sweeps SWEEPS="architectures attention" bash benchmarks/gpu_backbones.sh
set -u
source "$(dirname "$0")/gpu_common.sh"  # OUT, PYTHONPATH, stamp, the GPU/torch/commit header
STAGES=${STAGES:-"cross table"}
BACKBONES=${BACKBONES:-dit,long_skips,incontext_pre,incontext_post,mmdit,hybrid}
ATTENTION=${ATTENTION:-sdpa,flex,sigmoid,differential,linear}
TOKENS=${TOKENS:-256,4096}
TAG=${TAG:-$(echo "$TOKENS-$BACKBONES-$ATTENTION" | tr ',' '_' | cut -c1-80)}
for s in $STAGES; do case $s in
cross) stamp cross
       timeout ${T_CROSS:-240} python3 benchmarks/bench_backbones.py --no-table --out "$OUT/crossover.md" \
         > "$OUT/crossover.log" 2>&1; tail -14 "$OUT/crossover.log" | tee -a "$OUT/main.log" ;;
table) stamp "table $TAG"
       timeout ${T_TABLE:-560} python3 benchmarks/bench_backbones.py --no-crossover --tokens "$TOKENS" \
         --backbones "$BACKBONES" --attention "$ATTENTION" --compile ${COMPILE:-model} --steps ${STEPS:-10} \
         --warmup ${WARMUP:-10} --parallel ${PARALLEL:-2} ${ROWS:+--rows "$ROWS"} --out "$OUT/table_$TAG.md" > "$OUT/table_$TAG.log" 2>&1
       cat "$OUT/table_$TAG.log" | grep "^|" | tee -a "$OUT/main.log" ;;
sweeps) stamp sweeps
       if [ ! -d data/mnist ]; then
         python3 -m genlab data prepare mnist --src gpu_data/mnist --out gpu_data/mnist_prepared > "$OUT/prepare.log" 2>&1 \
           || { echo "prepare failed"; tail "$OUT/prepare.log"; exit 1; }
         mkdir -p data && ln -sfn "$PWD/gpu_data/mnist_prepared" data/mnist
       fi
       ROOT=${SWEEP_ROOT:-/tmp/genlab-sweeps}; mkdir -p "$ROOT"
       for sw in ${SWEEPS:-architectures attention}; do
         left=$(( ${SWEEP_BUDGET:-120} - ($(date +%s) - START) )); [ "$left" -lt 0 ] && left=0
         python3 -m genlab sweep "$sw" --root "$ROOT" --max-time "$left" --timeout ${RUN_TIMEOUT:-420} --jobs-per-gpu ${JOBS:-6} 2>&1 | grep --line-buffered -v "^\s*$" | tee -a "$OUT/main.log"
         tar czf "$OUT/$sw.tgz" -C "$ROOT" --exclude="checkpoints" --exclude="*.pt" --exclude="events.out.tfevents*" "$sw"
       done ;;
esac; done
stamp done
