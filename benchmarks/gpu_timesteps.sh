#!/usr/bin/env bash
# The timestep-sampler sweep (src/genlab/configs/sweeps/timesteps.toml: 10 runs of DiT-S/4 on class-conditional
# MNIST, 2000 steps each, FD and sample accuracy at equal steps) on ONE GPU, then the quality-vs-NFE table of one
# finished run for every sampler. Resumable like gpu_sweep.sh: no run starts after SWEEP_BUDGET s (default 360),
# each run is capped at RUN_TIMEOUT s (default 200), so one call stays under 10 minutes; call the SAME command again
# on the still-warm machine to continue (finished runs are skipped, SWEEP_ROOT persists). Run times are not
# measured yet (estimate: 60-100 s per run incl. compile, the first run also trains the cached MNIST classifier),
# so expect two or three calls, then one NFE_ONLY=1 call.
# Needs gpu_data/mnist/*.gz (carried: the four standard MNIST idx files).
# JOBS=N packs N runs onto the GPU at once (DiT-S/4 leaves an H100 mostly idle; the FD/accuracy columns are unaffected).
# Usage (repo root): OUT=/dir bash benchmarks/gpu_timesteps.sh            # sweep (+ the NFE table if time is left)
#                    OUT=/dir NFE_ONLY=1 bash benchmarks/gpu_timesteps.sh  # only the NFE table
set -uo pipefail
source "$(dirname "$0")/gpu_deps.sh"  # tomli_w for genlab train
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/genlab-out}
ROOT=${SWEEP_ROOT:-/tmp/genlab-sweeps}
BUDGET=${SWEEP_BUDGET:-360}
RUN_TIMEOUT=${RUN_TIMEOUT:-200}
NFE_RUN=${NFE_RUN:-logit_normal-s0}
G="python3 -m genlab"
mkdir -p "$OUT" "$ROOT"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)";
  git rev-parse --short HEAD 2>/dev/null; } > "$OUT/env.txt"
[ -f gpu_data/mnist_prepared/meta.json ] || $G data prepare mnist --src gpu_data/mnist --out gpu_data/mnist_prepared \
  > "$OUT/prepare.log" 2>&1 || { echo "MNIST prepare failed (carry gpu_data/mnist/*.gz)"; tail -3 "$OUT/prepare.log"; exit 1; }
if [ "${NFE_ONLY:-0}" != 1 ]; then
  echo "== sweep timesteps (no run starts after ${BUDGET} s; ${RUN_TIMEOUT} s per run)"
  $G sweep timesteps --root "$ROOT" --max-time "$BUDGET" --timeout "$RUN_TIMEOUT" --jobs-per-gpu "${JOBS:-1}" 2>&1 | grep -v "^\s*$" | tail -40
  tar czf "$OUT/timesteps.tgz" -C "$ROOT" --exclude="checkpoints" --exclude="*.pt" --exclude="events.out.tfevents*" timesteps
  cp "$ROOT"/timesteps/report.md "$OUT/timesteps_report.md" 2>/dev/null
fi
RUN="$ROOT/timesteps/runs/$NFE_RUN"
if [ -d "$RUN/checkpoints" ] && { [ "${NFE_ONLY:-0}" = 1 ] || [ "$SECONDS" -lt 150 ]; }; then
  echo "== quality vs NFE of $NFE_RUN (eval.num_samples=2000, guidance 1.5)"
  timeout 480 $G eval "$RUN" eval.nfe_list=4,8,16,32,64 eval.samplers=euler,heun,midpoint,euler_maruyama \
    > "$OUT/nfe_eval.json" 2> "$OUT/nfe_eval.log"
  cp "$RUN/eval_nfe.md" "$OUT/" 2>/dev/null && cat "$OUT/eval_nfe.md" || tail -5 "$OUT/nfe_eval.log"
fi
echo "total ${SECONDS} s"
