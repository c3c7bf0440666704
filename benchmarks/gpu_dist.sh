#!/usr/bin/env bash
# 2 GPUs of one host (nvidia-h200-x2): DiT-B/2 bs256 per GPU (global 512 on 2) bf16 compile=model on 1 GPU vs DDP vs
# FSDP2 on 2 (FSDP2 with its defaults: fused AdamW on DTensor shards, prefetch 1, last block kept unsharded; then
# per-block compile; NOSWITCH=1 adds prefetch/keep-last off). Scaling target: 2-GPU img/s >= 90% of 2x the 1-GPU
# img/s. Phase 1 also times single-GPU rows two at a time, one per GPU (SINGLE=0 skips them).
# Run from the repo root: bash benchmarks/gpu_dist.sh [EXTRA OVERRIDES]   (table in $OUT/dist.md; ~390 s)
set -u
OUT=${OUT:-out}; mkdir -p "$OUT/json"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast here
S="--steps 20 --warmup 10"
X="$*"
BUDGET=${BUDGET:-380}; T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
run2() {  # name, overrides...
  local name=$1; shift
  local l; l=$(left); if [ "$l" -lt 45 ]; then echo "$name: skipped (budget)"; return; fi
  timeout $(( l < 110 ? l : 110 )) python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m genlab bench bench_dit_b2 \
    train.batch_size=512 "$@" $X $S --json "$OUT/json/$name.json" > "$OUT/json/$name.log" 2>&1 || echo "$name failed (see $OUT/json/$name.log)"
  echo "$name done at $(( $(date +%s) - T0 )) s"
}
run1() {  # gpu, name, preset, overrides... : one process on one GPU
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout 125 python3 -m genlab bench "$@" $S --json "$OUT/json/$name.json" > "$OUT/json/$name.log" 2>&1 \
    || echo "$name failed (see $OUT/json/$name.log)"
  echo "$name done at $(( $(date +%s) - T0 )) s"
}
# single-GPU rows run two at a time, one per GPU: DiT-B/2 bs256 (the scaling reference, profiled) with the residual
# stream in fp32 (default) and in bf16 (model.residual=compute); then the 2-GPU rows; then DiT-XL/2 bs64 likewise
if [ "${SINGLE:-1}" = 1 ]; then
  run1 0 d1 bench_dit_b2 train.batch_size=256 $X --profile "$OUT/prof_d1" &
  run1 1 d1_resbf16 bench_dit_b2 train.batch_size=256 model.residual=compute $X &
  wait
else
  run1 0 d1 bench_dit_b2 train.batch_size=256 $X
fi
run2 d2_ddp train.parallel=ddp
run2 d2_fsdp train.parallel=fsdp
if [ "${SINGLE:-1}" = 1 ] && [ "$(left)" -gt 100 ]; then
  run1 0 xl bench_dit_xl2 train.batch_size=64 $X &
  run1 1 xl_resbf16 bench_dit_xl2 train.batch_size=64 model.residual=compute $X &
  wait
fi
run2 d2_fsdp_blocks train.parallel=fsdp train.compile=blocks
[ "${NOSWITCH:-0}" = 1 ] && run2 d2_fsdp_noswitch train.parallel=fsdp train.fsdp_prefetch=0 train.fsdp_keep_last=0
python3 - "$OUT" <<'PY'
import json, sys, pathlib
sys.path.insert(0, "src")
from genlab.bench import format_table
out = pathlib.Path(sys.argv[1])
names = ("d1", "d2_ddp", "d2_fsdp", "d2_fsdp_blocks", "d2_fsdp_noswitch", "d1_resbf16", "xl", "xl_resbf16")
rows = [(n, json.loads((out / "json" / f"{n}.json").read_text())) for n in names if (out / "json" / f"{n}.json").exists()]
t = format_table([r for _, r in rows]) + "\n\nrows: " + ", ".join(n for n, _ in rows)
if rows and rows[0][1]["world"] == 1:
    one = rows[0][1]["samples_per_s"]
    t += "\n\n" + "\n".join(f"{n} x{r['world']}: {r['samples_per_s'] / (2 * one):.1%} of 2x single-GPU" for n, r in rows[1:] if r["world"] == 2)
t += "\n\n" + "\n".join(f"{n}: opt {r.get('opt_ms')}, host syncs/step {r.get('host_syncs_per_step')}, recompiles {r.get('recompiles')}" for n, r in rows)
prof = out / "prof_d1" / "profile.md"
if prof.exists():
    t += "\n\n### profile d1\n\n" + prof.read_text()
(out / "dist.md").write_text(f"on {rows[0][1]['device'] if rows else '?'}\n\n{t}\n"); print(t)
PY
# at most 8 files come back from the device machine: everything else travels in one tarball
tar czf "$OUT/all.tgz" --exclude='*.json.gz' -C "$OUT" json $(cd "$OUT" && ls -d prof_* 2>/dev/null) && rm -rf "$OUT/json" "$OUT"/prof_*
