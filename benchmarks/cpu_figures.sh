#!/usr/bin/env bash
# The CPU figures quoted in the README and docs/benchmarks.md, reproducible on the 2-core machine (no GPU).
#   quickstart: `genlab train` (the default digits run), its summary lines       (~2.5 min idle)
#   guidance:   the guidance-interval table on that run (`genlab eval` per row)  (~25 s a row)
#   shift:      the default run again with method.time_shift=2 (its row beside quickstart's)  (~2.5 min)
#   text:       `genlab train text_sparse` (Sparse Transformer on text), its val loss  (~12 min)
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
