#!/usr/bin/env bash
# Optimizers (issue 18): the `optimizers` sweep (every optimizer with and without Caution at a 3-point LR grid,
# DiT-B/2 width on MNIST, 300 steps; see src/genlab/configs/sweeps/optimizers.toml) and, first, the exact-resume
# tests of every optimizer on the GPU (heavyball's stochastic rounding draws from the CUDA generator).
# Writes $OUT/report.md (loss at steps 100/200/300 and at 10/20 s of training, step time, optimizer-state MiB,
# peak memory), $OUT/results.csv, $OUT/optimizers.tgz (the sweep folder without checkpoints) and logs.
# Needs: wheels/{heavyball,opt_einsum,pytorch_optimizer,tomli_w}*.whl and gpu_data/mnist/*.gz (both carried).
#   OUT=out bash benchmarks/gpu_optimizers.sh              # STAGES="test sweep" by default
# 60 runs, one per GPU at a time (launcher per_gpu): on nvidia-h200-x8 about 8 rounds; on one GPU they run one after
# another and no run starts after SWEEP_BUDGET s (default 300, counted from the end of setup: wheels, data): calling the script again on the same (warm) machine
# skips finished runs and continues (SWEEP_ROOT persists there).
# CALL_LIMIT (default 570 s) caps RUN_TIMEOUT so that the last run and the report copy end inside one device call.
# JOBS=N runs N at once per GPU (then step time and loss at equal wall-clock are shared-GPU figures; each run takes
# ~13 GiB, so at most 5 on an 80 GB H100: 10 ran out of memory; shampoo's full-matrix preconditioners take far more:
# run ONLY=shampoo-... with JOBS=1, the others with JOBS=5; a packed run that runs out of memory is retried alone). ONLY=a,b picks variants by full run-variant name, e.g.
# ONLY=adamw-lr=1e-3-caution=false,adamw-lr=1e-3-caution=true (a name without its -caution=... part is refused).
# CONTINUE=1: a second call on the same warm machine that finishes runs the first call's RUN_TIMEOUT cut (they saved a
# checkpoint when stopped; --retry-failed resumes them from it); it stops at once when the machine was released in
# between (the sweep root is gone), rather than starting them over. Shampoo's 300 steps (~2 s a step) need this.
set -u
source "$(dirname "$0")/gpu_common.sh"  # OUT, PYTHONPATH, the GPU/torch/commit header in main.log, tomli_w
ROOT=${SWEEP_ROOT:-/tmp/genlab-sweeps}; mkdir -p "$ROOT"
if [ -n "${CONTINUE:-}" ] && [ ! -d "$ROOT/optimizers/runs" ]; then
  echo "CONTINUE: $ROOT/optimizers/runs is gone (a fresh machine): nothing to continue"; exit 3
fi
BUDGET=${SWEEP_BUDGET:-300}; RUN_TIMEOUT=${RUN_TIMEOUT:-240}
STAGES=${STAGES:-"test sweep"}
python3 -c "import heavyball, pytorch_optimizer" 2>/dev/null || python3 -m pip install --quiet --no-deps ${WHEELS:-wheels}/heavyball-*.whl \
  ${WHEELS:-wheels}/opt_einsum-*.whl ${WHEELS:-wheels}/pytorch_optimizer-*.whl 2>&1 | tail -2
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import torch; from importlib.metadata import version as v; print('torch', torch.__version__, 'pytorch-optimizer', v('pytorch_optimizer'), 'heavyball', v('heavyball'))"
  git rev-parse --short HEAD 2>/dev/null; } > "$OUT/env.txt" 2>&1
if [ ! -f data/mnist/meta.json ]; then
  python3 -m genlab data prepare mnist --src gpu_data/mnist --out data/mnist > "$OUT/prepare.log" 2>&1 \
    || { echo "MNIST prepare failed (carry gpu_data/mnist/*.gz)"; tail -3 "$OUT/prepare.log"; exit 1; }
fi
SETUP=$SECONDS  # wheels and data preparation do not count against SWEEP_BUDGET (a budget of 20 s once went to them)
for s in $STAGES; do case $s in
test)  echo "== exact resume of every optimizer on $(python3 -c 'import torch; print(torch.cuda.get_device_name())')"
       timeout ${T_TEST:-300} python3 -m pytest -q -p no:cacheprovider tests/test_optim.py -k "resumes_exactly" 2>&1 | tail -8 \
         | tee "$OUT/test_resume.log" ;;
sweep) left=$((BUDGET - SECONDS + SETUP)); [ "$left" -lt 0 ] && left=0
       # the last run must end, and the report be copied (~15 s), before the device call does (CALL_LIMIT, default
       # 570 s): an outer timeout once killed this script after the runs and before the copy, losing the report
       cap=$(( ${CALL_LIMIT:-570} - SECONDS - left - 15 ))
       [ "$RUN_TIMEOUT" -gt "$cap" ] && { echo "RUN_TIMEOUT $RUN_TIMEOUT -> $cap s (CALL_LIMIT ${CALL_LIMIT:-570})"; RUN_TIMEOUT=$cap; }
       echo "== sweep optimizers (no run starts after ${left} s more; ${RUN_TIMEOUT} s per run)"
       python3 -m genlab sweep optimizers --root "$ROOT" --max-time "$left" --timeout "$RUN_TIMEOUT" --jobs-per-gpu "${JOBS:-1}" ${ONLY:+--only "$ONLY"} ${CONTINUE:+--retry-failed} 2>&1 | grep --line-buffered -v "^\s*$" | tee "$OUT/sweep.log"
       cp "$ROOT/optimizers/report.md" "$ROOT/optimizers/results.csv" "$OUT/" 2>/dev/null
       tar czf "$OUT/optimizers.tgz" -C "$ROOT" --exclude="checkpoints" --exclude="*.pt" --exclude="events.out.tfevents*" optimizers ;;
esac; done
echo "total ${SECONDS} s"
