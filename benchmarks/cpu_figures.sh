#!/usr/bin/env bash
# The CPU figures quoted in the README and docs/benchmarks.md, reproducible on the 2-core machine (no GPU).
#   quickstart: `genlab train` (the default digits run), its summary lines       (~2.5 min idle)
#   guidance:   the guidance-interval table on that run (`genlab eval` per row)  (~25 s a row)
#   shift:      the default run again with method.time_shift=2 (its row beside quickstart's)  (~2.5 min)
#   text:       `genlab train text_sparse` (Sparse Transformer on text), its val loss  (~12 min)
#   sparse_groups: MNIST bytes (../shared/data/mnist), tiny Sparse Transformer, 200 steps: dense vs fixed (c = 7)
#               with 1 and 4 summary groups, val bits/dim on 500 test images  (~17 min)
#   shampoo:    the digits run, 100 steps at lr 3e-4: shampoo (ScalableShampoo) vs adamw, final loss  (~2 min)
# Usage (repo root): OUT=/dir STAGES="quickstart guidance shift text" bash benchmarks/cpu_figures.sh
# (guidance alone reuses $OUT/quickstart's run when it is there). Tables and logs go to $OUT.
set -euo pipefail
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/genlab-cpu-figures}
STAGES=${STAGES:-"quickstart guidance shift text"}
G="python -m genlab"
mkdir -p "$OUT"
echo "date $(date -u +%F) commit $(git rev-parse --short HEAD) cpus $(nproc)" | tee "$OUT/env.txt"
run_of() { ls -d "$OUT/$1"/*/ 2>/dev/null | head -1; }

if [[ " $STAGES " == *" quickstart "* ]]; then
  rm -rf "$OUT/quickstart"
  $G train train.out_dir="$OUT/quickstart" > "$OUT/quickstart.log" 2>&1
  grep -E "^(run|final loss|eval \()" "$OUT/quickstart.log" | tail -3 | tee "$OUT/quickstart.txt"
fi

if [[ " $STAGES " == *" guidance "* ]]; then
  RUN=$(run_of quickstart)
  [ -n "$RUN" ] || { echo "guidance needs the quickstart stage's run in $OUT/quickstart"; exit 1; }
  T="$OUT/guidance.md"
  printf '| guidance | interval | eval line |\n| --- | --- | --- |\n' > "$T"
  for row in "1.0 0,1" "1.5 0,1" "2.0 0,1" "2.0 0.5,1" "2.0 0.3,1" "2.0 0.3,0.8" "3.0 0.5,1" "3.0 0.3,1" "3.0 0,0.7" "4.0 0.6,1"; do
    set -- $row
    line=$($G eval "$RUN" eval.cfg_scale="$1" method.cfg_interval="$2" 2>&1 | grep "^eval (" | sed 's/.*): //')
    echo "| $1 | [$2] | $line |" | tee -a "$T"
  done
fi

if [[ " $STAGES " == *" shift "* ]]; then
  rm -rf "$OUT/shift"
  $G train method.time_shift=2 train.out_dir="$OUT/shift" > "$OUT/shift.log" 2>&1
  grep -E "^(run|final loss|eval \()" "$OUT/shift.log" | tail -3 | tee "$OUT/shift.txt"
fi

if [[ " $STAGES " == *" text "* ]]; then
  rm -rf "$OUT/text"
  $G train text_sparse train.out_dir="$OUT/text" train.name=text_sparse > "$OUT/text.log" 2>&1
  grep -E "^(run|final loss|val_loss|val_bpc)" "$OUT/text.log" | tee "$OUT/text.txt"
fi

if [[ " $STAGES " == *" sparse_groups "* ]]; then
  MN=${MNIST:-../shared/data/mnist}
  for split in train test; do
    [ -f "$OUT/mnist_$split/meta.json" ] || $G data prepare mnist --src "$MN" --split $split --out "$OUT/mnist_$split" > /dev/null
  done
  C="data.path=$OUT/mnist_train eval.val_path=$OUT/mnist_test train.device=cpu train.compile=off model.size=tiny
     model.dim=64 model.depth=3 model.heads=8 train.steps=200 train.batch_size=16 optim.warmup_steps=20
     eval.num_samples=500 train.out_dir=$OUT/sparse_groups log.tensorboard=false log.every=50 train.seed=0"
  T="$OUT/sparse_groups.md"
  printf '| pattern | c | summary groups | val bits/dim | wall s |\n| --- | ---: | ---: | ---: | ---: |\n' > "$T"
  for row in "dense - - model.sparse_pattern=dense" "fixed 7 1 model.sparse_pattern=fixed model.sparse_summary=7" \
             "fixed 7 4 model.sparse_pattern=fixed model.sparse_summary=7 model.sparse_summary_groups=4"; do
    set -- $row; name="$1_c$2_g$3"; shift 3
    rm -rf "$OUT/sparse_groups/$name"
    $G train mnist_sparse $C "$@" train.name=$name > "$OUT/sparse_groups_$name.log" 2>&1
    python -c "import json,sys; s=json.load(open(sys.argv[1])); r=sys.argv[2].split('_'); print(f'| {r[0]} | {r[1][1:]} | {r[2][1:]} | {s[\"val_bits_per_dim\"]:.4f} | {s[\"wall_time\"]:.1f} |')" \
      "$OUT/sparse_groups/$name/summary.json" "$name" | tee -a "$T"
  done
fi

if [[ " $STAGES " == *" shampoo "* ]]; then
  for opt in shampoo adamw; do
    rm -rf "$OUT/shampoo/$opt"
    $G train digits_flow optim.name=$opt optim.lr=3e-4 train.steps=100 log.every=10 eval.num_samples=0 \
      train.out_dir="$OUT/shampoo" train.name=$opt log.tensorboard=false > "$OUT/shampoo_$opt.log" 2>&1
    echo "$opt: $(grep '^final loss' "$OUT/shampoo_$opt.log")" | tee -a "$OUT/shampoo.txt"
  done
fi
