#!/usr/bin/env bash
# Run shipped ablation sweeps on ONE GPU and copy their reports (not the checkpoints) to $OUT.
# Expected wall time: at most ~530 s whatever the list (default: all_axes). No run starts after
# SWEEP_BUDGET s (default 390) and each run is capped at RUN_TIMEOUT s (default 120); runs left over are
# recorded as not_run and the SAME command on the same (still warm) machine continues where it stopped
# (finished runs are skipped, SWEEP_ROOT persists). One DiT-B/2 run of 100 steps takes about 60-80 s on an
# H100 (start-up + compile + steps + final checkpoint/samples), so all_axes (10 rows, 1 skipped on one
# GPU) needs two calls, all_axes_part2 one.
# Usage (repo root): OUT=/dir bash benchmarks/gpu_sweep.sh [all_axes] [dtype ...]
set -uo pipefail
source "$(dirname "$0")/gpu_deps.sh"  # tomli_w for genlab train
export PYTHONPATH=src:${PYTHONPATH:-}
OUT=${OUT:-/tmp/genlab-out}
ROOT=${SWEEP_ROOT:-/tmp/genlab-sweeps}
BUDGET=${SWEEP_BUDGET:-390}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
mkdir -p "$OUT" "$ROOT"
[ $# -eq 0 ] && set -- all_axes
python3 -c "import torchao" 2>/dev/null || python3 -m pip install --quiet --no-deps wheels/*.whl 2>&1 | tail -2
python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1 > "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/env.txt"
python3 -c "import torch; print('torch', torch.__version__)" >> "$OUT/env.txt"
git rev-parse --short HEAD >> "$OUT/env.txt" 2>/dev/null
for s in "$@"; do
  left=$((BUDGET - SECONDS))
  [ "$left" -lt 0 ] && left=0
  echo "== sweep $s (start no run after ${left} s more; ${RUN_TIMEOUT} s per run)"
  python3 -m genlab sweep "$s" --root "$ROOT" --max-time "$left" --timeout "$RUN_TIMEOUT" 2>&1 | grep -v "^\s*$" | tail -40
  # The device tool returns at most 8 files: pack each sweep's report (not its checkpoints) into one tarball.
  tar czf "$OUT/$s.tgz" -C "$ROOT" --exclude="checkpoints" --exclude="*.pt" --exclude="events.out.tfevents*" "$s"
done
echo "total ${SECONDS} s"
