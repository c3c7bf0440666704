#!/usr/bin/env bash
# float8 vs bf16 training loss over 500 steps (issue 5: "loss curve within 1% of bf16"): class-conditional flow on
# MNIST with a DiT-XL/2-width model (XL = width 1152, patch 2 -> 196 tokens), batch 128, same seed and data order,
# one process per precision, then a comparison table of the loss curves (50-step windows).
#   OUT=out PRECISIONS="bf16 float8_tensorwise float8_rowwise" [PARALLEL=1] [CAP=s] bash benchmarks/gpu_float8_loss.sh
# PARALLEL=1 starts the runs together (they compile on the CPU side by side, then share the GPU: the loss curves are
# unaffected, their throughput figures are not speed measurements).
# Needs gpu_data/mnist/*.gz (carried) and the torchao wheel in wheels/.
set -u
source "$(dirname "$0")/gpu_deps.sh"  # tomli_w for genlab train
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
python3 -m pip install --no-deps wheels/*.whl >/dev/null 2>&1 || { echo "needs the torchao wheel in wheels/"; exit 1; }
G="python3 -m genlab"; RUNS=/tmp/genlab_f8loss; rm -rf "$RUNS"
STEPS=${STEPS:-500}
[ -d gpu_data/mnist_prepared ] || $G data prepare mnist --src gpu_data/mnist --out gpu_data/mnist_prepared > "$OUT/prepare.log" 2>&1 \
  || { echo "prepare failed"; tail "$OUT/prepare.log"; exit 1; }
T0=$(date +%s)
for p in ${PRECISIONS:-bf16 float8_tensorwise float8_rowwise}; do
  timeout ${CAP:-200} $G train mnist_flow data.path=gpu_data/mnist_prepared model.size=XL model.patch_size=2 \
    train.precision=$p train.compile=model train.steps=$STEPS train.batch_size=128 train.seed=0 optim.lr=1e-4 optim.warmup_steps=100 \
    log.every=10 log.ckpt_every=0 log.sample_every=0 log.progress=false log.tensorboard=false eval.num_samples=0 \
    train.out_dir=$RUNS train.name=$p > "$OUT/$p.log" 2>&1 || echo "$p failed (rc $?)" &
  [ "${PARALLEL:-0}" = 1 ] || wait
  echo "$p started/done at $(( $(date +%s) - T0 )) s"
done
wait
echo "all done at $(( $(date +%s) - T0 )) s"
python3 - "$RUNS" "$OUT" <<'PY'
import json, pathlib, sys
runs, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
curves = {}
for d in sorted(runs.iterdir()):
    f = d / "metrics.jsonl"
    if f.exists():
        rows = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
        curves[d.name] = {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}
ref = curves.get("bf16", {})
steps = sorted(ref)
wins = [(a, a + 50) for a in range(0, max(steps or [0]), 50)]
def win(c, a, b):
    v = [c[s] for s in c if a < s <= b]
    return sum(v) / len(v) if v else float("nan")
lines = ["| precision | " + " | ".join(f"{a + 1}-{b}" for a, b in wins) + " | max rel. diff of window means |",
         "|" + " --- |" * (len(wins) + 2)]
for name, c in curves.items():
    means = [win(c, a, b) for a, b in wins]
    rel = max((abs(m - win(ref, a, b)) / win(ref, a, b) for m, (a, b) in zip(means, wins)), default=float("nan"))
    lines.append(f"| {name} | " + " | ".join(f"{m:.4f}" for m in means) + f" | {100 * rel:.2f}% |")
t = "mean training loss per 50-step window (logged every 10 steps)\n\n" + "\n".join(lines) + "\n"
(out / "float8_loss.md").write_text(t); print(t)
(out / "curves.json").write_text(json.dumps(curves))
PY
