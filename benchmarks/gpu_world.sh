#!/usr/bin/env bash
# World model on one GPU (issue 15), in two calls that each fit a 10-minute command limit:
#   OUT=out bash benchmarks/gpu_world.sh [extra train overrides ...]   # Pong frames -> probe -> train (~6-7 min) -> eval -> GIF
#   OUT=out bash benchmarks/gpu_world.sh bench                          # speed table of runs/$NAME (GPU batch 1/batched + CPU)
#                                                                       # + sampling.md (temperature 1 vs 0, quantised or not)
# Another game: DATA=gpu_data/breakout64 NAME=breakout GAME=Breakout (two games can train at once on one GPU, each
# in its own $OUT; the probe then measures the shared step time and sizes each run to it).
# Data: a carried $DATA (episode folder, frames gzipped; unpacked on first read), else collected here
# (needs gymnasium + ale-py). Results under $OUT: world_eval.md (rollout PSNR vs copy-last, action margin),
# summary.json, rollout.gif/.mp4, speed.md, data_stats.txt, contact_sheet.png, train.log.
set -u
source "$(dirname "$0")/gpu_deps.sh"  # tomli_w for genlab train
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
DATA=${DATA:-gpu_data/pong64}
BUDGET=${BUDGET:-360}   # seconds of training after the probe
NAME=${NAME:-pong}; GAME=${GAME:-Pong}
RUN=runs/$NAME
if [ "${1:-}" = bench ]; then
  { python benchmarks/bench_world.py --run $RUN --batches 1,256,4096,16384 --seconds 2
    echo; python benchmarks/bench_world.py --run $RUN --device cpu --quick --seconds 2; } > "$OUT/speed.md" 2> "$OUT/speed.err"
  python benchmarks/world_sampling.py $RUN --rollouts 64 --variants 1:n,1:q,0:n,0:q > "$OUT/sampling.md" 2>> "$OUT/speed.err"
  cat "$OUT/speed.md" "$OUT/sampling.md"; exit 0
fi
rm -rf runs/probe_$NAME $RUN   # run folders of an earlier call on a warm machine
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt" 2>&1
if [ ! -f "$DATA/meta.json" ]; then
  python -m genlab data collect atari --game $GAME --frames 50000 --policy sticky --size 64 --out "$DATA" || exit 1
fi
python -m genlab data stats "$DATA" --sheet "$OUT/contact_sheet.png" > "$OUT/data_stats.txt" 2>&1
COMMON=(pong_world "data.path=$DATA" train.out_dir=runs log.tensorboard=false log.progress=false "$@")
# 1) probe: teacher-forced step time, to size the run to the budget (closed-loop steps cost ~3x: rollouts)
python -m genlab train "${COMMON[@]}" train.name=probe_$NAME train.steps=60 log.every=20 optim.warmup_steps=10 \
  eval.world_rollouts=8 eval.world_horizons=4 > "$OUT/probe.log" 2>&1
ST=$(python -c "import json;print(json.load(open('runs/probe_$NAME/summary.json'))['step_time'])" 2>/dev/null || echo 0.1)
STEPS=$(python -c "print(max(${MIN_STEPS:-500}, int($BUDGET / ($ST * (0.6 + 0.4 * 3.0)) // 100 * 100)))")
echo "probe step time $ST s -> $STEPS steps" | tee "$OUT/plan.txt"
# 2) train + evaluate (the trainer evaluates at the end: world_eval.md/json in the run folder); hard cap 9 min
timeout -s INT ${CAP:-450} python -m genlab train "${COMMON[@]}" train.name=$NAME train.steps=$STEPS log.ckpt_every=0 \
  > "$OUT/train.log" 2>&1
if ! grep -q '"status": "finished"' $RUN/summary.json 2>/dev/null; then  # stopped early: evaluate the last checkpoint
  python -m genlab eval $RUN > "$OUT/eval.json" 2>> "$OUT/train.log"
fi
cp $RUN/summary.json $RUN/world_eval.md $RUN/world_eval.json $RUN/metrics.jsonl "$OUT/" 2>/dev/null
# 3) rollout video (H=32, context | real | generated, actions written)
python -m genlab sample $RUN --n 6 --out "$OUT/rollout.gif" >> "$OUT/train.log" 2>&1
cat "$OUT/plan.txt" "$OUT/world_eval.md"; tail -3 "$OUT/train.log"
