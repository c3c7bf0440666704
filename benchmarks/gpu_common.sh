# Sourced (not run) by the gpu_*.sh scripts that log to $OUT/main.log: the output folder, the import path, `stamp`
# (elapsed seconds + a label, appended to main.log) and one header naming the GPU, its clocks, torch/triton and
# the commit, so every table in a log says where and on what it was measured.
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
START=$(date +%s)
stamp() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/main.log"; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total,temperature.gpu,power.draw --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null; } 2>&1 | tee -a "$OUT/main.log"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_deps.sh"  # tomli_w
