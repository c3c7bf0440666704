#!/usr/bin/env bash
# Evaluation metrics on one GPU (issue 18, Evaluation): real-vs-real floors of MNIST and Fashion-MNIST (train
# images scored against the test split at n = 500/2000/5000), FID-Inception / LPIPS throughput (random weights:
# no weights can be fetched on the GPU machine either), then a short MNIST flow run evaluated with
# `genlab eval --metrics accuracy,fd,pr` against the test split. Expected wall time ~6-8 min on an H100.
#   OUT=out [STEPS=3000] bash benchmarks/gpu_eval_metrics.sh
# Needs gpu_data/mnist/*.gz and gpu_data/fashion-mnist/*.gz (carried: copy ../shared/data/{mnist,fashion-mnist}).
set -u
source "$(dirname "$0")/gpu_deps.sh"  # tomli_w for genlab train
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 GENLAB_CACHE=/tmp/genlab_evalq_cache
G="python3 -m genlab"; RUNS=/tmp/genlab_evalq_runs; rm -rf "$RUNS"
for ds in mnist fashion-mnist; do
  for split in train test; do
    [ -d gpu_data/${ds}_$split ] || $G data prepare $ds --src gpu_data/$ds --split $split --out gpu_data/${ds}_$split \
      >> "$OUT/prepare.log" 2>&1 || { echo "prepare $ds $split failed"; tail "$OUT/prepare.log"; exit 1; }
  done
done
{
  echo "## real-vs-real floors (train images vs the test split; in-project classifier features)"
  for ds in mnist fashion-mnist; do
    echo; echo "### $ds"
    python3 benchmarks/bench_eval_metrics.py --data gpu_data/${ds}_train --val gpu_data/${ds}_test \
      $([ "$ds" = mnist ] && echo --speed) 2>> "$OUT/stderr.log"
  done
} | tee "$OUT/eval_floors.md"
timeout ${CAP:-300} $G train mnist_flow data.path=gpu_data/mnist_train eval.val_path=gpu_data/mnist_test \
  train.steps=${STEPS:-3000} log.eval_every=1000 log.ckpt_every=0 train.out_dir=$RUNS train.name=mnist \
  > "$OUT/train.log" 2>&1 || { echo "train failed"; tail -5 "$OUT/train.log"; }
tail -4 "$OUT/train.log"
$G eval $RUNS/mnist eval.num_samples=2000 --metrics accuracy,fd,pr > "$OUT/eval_mnist.json" 2> "$OUT/eval_mnist.log"
tail -1 "$OUT/eval_mnist.log"; cat "$OUT/eval_mnist.json"
grep '"eval/' $RUNS/mnist/metrics.jsonl > "$OUT/periodic_eval.jsonl"
echo "total ${SECONDS} s"
