#!/usr/bin/env bash
# Sigmoid attention's Triton kernel (issue 17) on ONE H100/H200, about 8 min: the GPU tests against float64, the
# kernel table (SDPA vs sigmoid through Triton, FlexAttention and plain ops, fwd and fwd+bwd) and the backbone rows
# (bench_backbones.py, DiT-B/2 parameters, bf16, compile=blocks) of `sigmoid` (the Triton kernel) next to SDPA in the
# same call, so the ratios share one GPU (`sigmoid_flex`, the FlexAttention path, can be added with ROWS). Logs and
# tables land in $OUT. Measured 2026-11-24 on an H100: 342 s (rows ran as `sigmoid_triton`, now `sigmoid`).
#   OUT=out bash benchmarks/gpu_sigmoid.sh            STAGES picks: test kernels rows (default all three)
#   ROWS=dit:sigmoid_flex:256,... overrides the backbone rows
set -u
source "$(dirname "$0")/gpu_common.sh"  # OUT, PYTHONPATH, stamp, the GPU/torch/commit header
STAGES=${STAGES:-"test kernels rows"}
DEFAULT_ROWS=""
for bb in dit incontext_pre mmdit hybrid; do DEFAULT_ROWS+="$bb:sdpa:256,$bb:sigmoid:256,"; done
DEFAULT_ROWS+="long_skips:sigmoid:256,incontext_post:sigmoid:256,hybrid:differential:256"
ROWS=${ROWS:-$DEFAULT_ROWS}
for s in $STAGES; do case $s in
test)    stamp test
         timeout ${T_TEST:-150} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_triton_sigmoid.py 2>&1 \
           | tail -25 | tee -a "$OUT/main.log" ;;
kernels) stamp kernels
         timeout ${T_KERNELS:-120} python3 benchmarks/bench_attention.py --sigmoid --out "$OUT/sigmoid_kernels.md" \
           > "$OUT/kernels.log" 2>&1; grep "^|" "$OUT/kernels.log" | tee -a "$OUT/main.log"; tail -3 "$OUT/kernels.log" ;;
rows)    stamp rows
         left=$(( ${BUDGET:-570} - ($(date +%s) - START) ))
         timeout $left python3 benchmarks/bench_backbones.py --no-crossover --tokens 256 \
           --backbones dit,long_skips,incontext_pre,incontext_post,mmdit,hybrid \
           --attention sdpa,sigmoid,sigmoid_flex,differential --rows "$ROWS" --compile ${COMPILE:-blocks} \
           --parallel ${PARALLEL:-2} --out "$OUT/rows.md" > "$OUT/rows.log" 2>&1
         grep "^|" "$OUT/rows.log" | tee -a "$OUT/main.log"; tail -3 "$OUT/rows.log" ;;
esac; done
stamp done
