#!/usr/bin/env bash
# Run shipped ablation sweeps on the GPU machine and copy their reports (not the checkpoints) to $OUT.
# Usage: OUT=/dir bash benchmarks/gpu_sweep.sh all_axes [dtype ...]     (each sweep file ≤ 10 min on one H100)
set -uo pipefail
export PYTHONPATH=src
OUT=${OUT:-/tmp/genlab-out}
ROOT=${SWEEP_ROOT:-/tmp/genlab-sweeps}
mkdir -p "$OUT" "$ROOT"
python3 -c "import torchao" 2>/dev/null || python3 -m pip install --quiet --no-deps wheels/*.whl 2>&1 | tail -1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
for s in "$@"; do
  python3 -m genlab sweep "configs/sweeps/$s.toml" --root "$ROOT" 2>&1 | grep -v "^\s*$" | tail -40
  mkdir -p "$OUT/$s"
  cp "$ROOT/$s"/{results.csv,report.md,report.html,status.json,*.png} "$OUT/$s/" 2>/dev/null
  cp -r "$ROOT/$s/grids" "$OUT/$s/" 2>/dev/null
  mkdir -p "$OUT/$s/logs" && for f in "$ROOT/$s"/logs/*.log; do tail -30 "$f" > "$OUT/$s/logs/$(basename "$f")"; done
done
