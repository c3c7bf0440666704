#!/usr/bin/env bash
# float8 vs bf16 crossover on ONE H100/H200: compiled 4-layer MLP stack, 32,768 tokens, widths 768..4096,
# bf16 / float8 tensorwise / rowwise, each in its own process; then DiT-XL/2 bs128 end to end.
# Expected wall time: ~420 s (hard stop at 540 s). Run from the repo root: bash benchmarks/gpu_float8.sh
# WIDTHS="4096 768" picks the widths (in that order); XL=0 skips the DiT-XL/2 rows; MLP_BUDGET=s stops the MLP rows.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT/json"
export PYTHONPATH=src:${PYTHONPATH:-}
python3 -m pip install --no-deps wheels/*.whl >/dev/null 2>&1 || { echo "needs the torchao wheel in wheels/"; exit 1; }
START=$(date +%s)
: > "$OUT/json/f8.jsonl"
for w in ${WIDTHS:-768 1152 2048 4096}; do for r in bf16 tensorwise rowwise; do
  (( $(date +%s) - START > ${MLP_BUDGET:-380} )) && break 2
  timeout 60 python3 benchmarks/bench_float8.py --width $w --recipe $r >> "$OUT/json/f8.jsonl" 2> "$OUT/json/f8_${w}_$r.log" \
    || echo "{\"width\": $w, \"recipe\": \"$r\", \"failed\": true}" >> "$OUT/json/f8.jsonl"
  echo "[$(( $(date +%s) - START ))s] width $w $r"
done; done
for p in bf16 float8_tensorwise float8_rowwise; do
  [ "${XL:-1}" = 0 ] && break
  (( $(date +%s) - START > 440 )) && break
  timeout 100 python3 -m genlab bench bench_dit_xl2 train.batch_size=128 train.precision=$p --steps 15 --warmup 5 \
    --json "$OUT/json/xl2_$p.json" > "$OUT/json/xl2_$p.log" 2>&1 || echo "xl2 $p failed"
done
python3 - "$OUT" <<'PY'
import json, sys, pathlib
sys.path.insert(0, "src")
from genlab.bench import format_table
out = pathlib.Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "json/f8.jsonl").read_text().splitlines() if l.strip()]
bf = {r["width"]: r.get("step_ms") for r in rows if r["recipe"] == "bf16"}
lines = ["| width | recipe | step ms | TFLOP/s | speed-up vs bf16 |", "| --- | --- | --- | --- | --- |"]
for r in rows:
    if r.get("failed"):
        lines.append(f"| {r['width']} | {r['recipe']} | failed | | |"); continue
    sp = bf.get(r["width"]) / r["step_ms"] if bf.get(r["width"]) else float("nan")
    lines.append(f"| {r['width']} | {r['recipe']} | {r['step_ms']:.2f} | {r['tflops']:.0f} | {sp:.2f}x |")
xl = [json.loads(p.read_text()) for p in sorted((out / "json").glob("xl2_*.json"))]
text = "float8 crossover (compiled MLP stack)\n\n" + "\n".join(lines) + "\n\nDiT-XL/2 bs128 end to end\n\n" + (format_table(xl) if xl else "(none)") + "\n"
(out / "float8.md").write_text(text); print(text)
PY
echo "total $(( $(date +%s) - START ))s"
