#!/usr/bin/env bash
# Tiny Shakespeare char: AR with keep-best and MDLM variants at equal training compute (5000 steps x 64 x 256
# tokens each), all started together on one GPU (they are small; the GPU time-slices them), then a precise
# NELBO of every MDLM run's best checkpoint (eval.nelbo_reps=16, the bound-vs-T table).
#   VARIANTS="name|preset|overrides;..." CAP=360 OUT=out bash benchmarks/gpu_lm_tune.sh
# Needs gpu_data/tinyshakespeare.txt (carried). Tables and logs land in $OUT.
set -u
source "$(dirname "$0")/gpu_deps.sh"  # tomli_w for genlab train
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
RUNS=/tmp/genlab_tune; rm -rf "$RUNS"; mkdir -p "$RUNS"
G="python3 -m genlab"
CAP=${CAP:-360}
[ -d gpu_data/shakespeare_char ] || $G data prepare text --src gpu_data/tinyshakespeare.txt --tokenizer char \
  --out gpu_data/shakespeare_char > "$OUT/prepare.log" 2>&1 || { echo "prepare failed"; cat "$OUT/prepare.log"; exit 1; }
VARIANTS=${VARIANTS:-"ar|shakespeare_char_ar|log.eval_every=250;mdlm|shakespeare_char_mdlm|log.eval_every=500"}
COMMON="train.out_dir=$RUNS log.keep_best=true log.progress=false log.tensorboard=false eval.nelbo_reps=2"
T0=$(date +%s)
IFS=';' read -ra VS <<< "$VARIANTS"
for v in "${VS[@]}"; do
  IFS='|' read -r name preset ovr <<< "$v"
  timeout "$CAP" $G train "$preset" $COMMON train.name="$name" $ovr > "$RUNS/$name.log" 2>&1 &
done
wait
echo "training done after $(( $(date +%s) - T0 )) s"
for v in "${VS[@]}"; do
  IFS='|' read -r name preset ovr <<< "$v"
  if [ -f "$RUNS/$name/checkpoints/best.pt" ] && grep -q mdlm <<< "$preset"; then
    timeout 60 $G eval "$RUNS/$name/checkpoints/best.pt" eval.nelbo_reps=16 > "$RUNS/$name/eval_best.json" 2> "$RUNS/$name/eval_best.err"
  fi
done
echo "evals done after $(( $(date +%s) - T0 )) s"
python3 - "$RUNS" "$OUT" "$VARIANTS" <<'PY'
import json, math, pathlib, sys
runs, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = ["| run | overrides | status | wall s | tokens/s | final train loss | eval curve (step: nats/char) | best step | best (nats) | best (bits/char) | final (bits/char) | best, 16 draws (bits/char) ± se |",
        "|" + " --- |" * 12]
for v in sys.argv[3].split(";"):
    name, preset, ovr = v.split("|")
    d = runs / name
    s = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
    key = "val_loss" if "ar" in preset.split("_")[-1] else "nelbo_loss"
    curve = []
    if (d / "metrics.jsonl").exists():
        for line in (d / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            if f"eval/{key}" in r:
                curve.append(f"{r['step']}: {r[f'eval/{key}']:.3f}")
    ev = json.loads((d / "eval_best.json").read_text()) if (d / "eval_best.json").exists() else {}
    f = lambda x, spec: "n/a" if x is None else format(x, spec)
    best = s.get(f"{key}_best")
    prec = f"{ev['nelbo_bpc']:.4f} ± {ev['nelbo_stderr_bits']:.4f}" if ev.get("nelbo_bpc") else ""
    rows.append(f"| {name} | {ovr} | {s.get('status', 'killed/failed')} | {f(s.get('wall_time'), '.0f')} | {f(s.get('tokens_per_s'), '.0f')} | "
                f"{f(s.get('loss'), '.4f')} | {', '.join(curve)} | {s.get('best_step', '')} | {f(best, '.4f')} | "
                f"{f(None if best is None else best / math.log(2), '.4f')} | {f(None if s.get(key) is None else s[key] / math.log(2), '.4f')} | {prec} |")
    for fn in ("summary.json", "metrics.jsonl", "eval_best.json", "bound_vs_T.md"):
        pass
txt = "\n".join(rows)
(out / "tune.md").write_text(txt + "\n")
print(txt)
for v in sys.argv[3].split(";"):
    name = v.split("|")[0]
    p = runs / name / "bound_vs_T.md"
    if p.exists():
        print(f"\n{name} (best checkpoint, 16 draws):\n" + p.read_text())
PY
tar czf "$OUT/runs.tgz" --exclude='*.pt' --exclude='tb' -C "$RUNS" . 2>/dev/null
for v in "${VS[@]}"; do IFS='|' read -r name _ _ <<< "$v"; tail -2 "$RUNS/$name.log"; done
