#!/usr/bin/env bash
# Head-dim-16 attention kernel (issue 5) on ONE H100/H200, ~280 s: GPU correctness test, kernel table
# (Triton variants vs SDPA backends, exp floor), ncu pipe utilisation, end-to-end genlab bench.
# Run from the repo root:  bash benchmarks/gpu_attention.sh  (logs and tables in $OUT)
# STAGES picks steps (default all): test bench e2e ncu (bench64: the D=64 table alone); VARIANTS/E2E_ATT/E2E_STEPS override defaults.
set -u
source "$(dirname "$0")/gpu_common.sh"  # OUT, PYTHONPATH, stamp, the GPU/torch/commit header
STAGES=${STAGES:-"test bench e2e ncu"}
VARIANTS=${VARIANTS:-"1/split/fixed,2/split/fixed,3/split/fixed,2/split/fixed/mma,2/atomic/fixed,3/atomic/fixed,2/split,2/atomic"}
E2E_ATT=${E2E_ATT:-sdpa,triton}
for s in $STAGES; do case $s in
test)  stamp test
       timeout ${T_TEST:-90} python3 -m pytest -q -p no:cacheprovider tests/test_triton_attention.py -k gpu 2>&1 | tail -25 >> "$OUT/main.log" ;;
bench) stamp bench
       timeout ${T_BENCH:-120} python3 benchmarks/bench_attention.py --shapes ${SHAPES:-long,d64} --variants "$VARIANTS" \
         --out "$OUT/kernels.md" > "$OUT/bench.log" 2>&1; tail -5 "$OUT/bench.log" >> "$OUT/main.log" ;;
bench64) stamp bench64
       timeout ${T_BENCH64:-60} python3 benchmarks/bench_attention.py --shapes d64 --variants "$VARIANTS" \
         --out "$OUT/kernels64.md" > "$OUT/bench64.log" 2>&1; tail -8 "$OUT/bench64.log" >> "$OUT/main.log" ;;
e2e)   stamp e2e
       timeout ${T_E2E:-110} python3 benchmarks/bench_attention.py --shapes "" --e2e --e2e-attention "$E2E_ATT" \
         --steps ${E2E_STEPS:-5} --warmup 3 --profile-dir /tmp/prof --out "$OUT/e2e.md" > "$OUT/e2e.log" 2>&1
       cat /tmp/prof/*/profile.md >> "$OUT/e2e.log" 2>/dev/null ;;
ncu)   stamp ncu
       NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
       for v in ${NCU_VARIANTS:-1/split 2/split}; do
         echo "=== $v" >> "$OUT/ncu.txt"
         timeout ${T_NCU:-40} $NCU --clock-control none -k regex:_attn_ --launch-count 4 --print-details all \
           --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
           --section InstructionStats python3 benchmarks/bench_attention.py --once $v >> "$OUT/ncu.txt" 2>&1
         timeout 30 $NCU --clock-control none -k regex:_attn_ --launch-count 4 --metrics \
           sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active \
           python3 benchmarks/bench_attention.py --once $v >> "$OUT/ncu.txt" 2>&1
       done ;;
esac; done
stamp done
cat "$OUT"/kernels.md "$OUT"/kernels64.md "$OUT"/e2e.md 2>/dev/null
