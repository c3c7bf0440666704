#!/usr/bin/env bash
# DiT throughput variants on one GPU (issue 5), each `genlab bench` in its own process.
# The runs go one at a time on the otherwise idle GPU, each capped at --per seconds, all within --budget. Results: $OUT/results.md, $OUT/probe.md, $OUT/logs.tgz.
#   OUT=out bash benchmarks/gpu_dit_speed.sh VARIANTS_FILE [--probe] [--warm] [--budget SECONDS] [--per SECONDS]
# VARIANTS_FILE: one variant a line, "name|preset overrides...|extra bench args|ENV=VALUE ..." (e.g. "|--profile DIR").
set -u
OUT=${OUT:-out}; mkdir -p "$OUT/j"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
VF=$1; shift
PROBE=0; BUDGET=360; WARM=0; PER=150
while [ $# -gt 0 ]; do case $1 in --probe) PROBE=1;; --warm) WARM=1;; --budget) BUDGET=$2; shift;; --per) PER=$2; shift;; esac; shift; done
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv > "$OUT/j/gpu.txt" 2>&1
if [ $PROBE = 1 ]; then
  timeout 90 python3 benchmarks/probe_dit_parts.py > "$OUT/probe.md" 2> "$OUT/j/probe.err" || echo "probe failed" >> "$OUT/probe.md"
fi
# 1) optional warm (--warm): compile every variant at once (1 step), filling the inductor caches. Measured on an
#    H100 with 6 variants: 306 s, slower than compiling them one by one, so it is off by default.
if [ $WARM = 1 ]; then
  while IFS='|' read -r name args extra envs; do
    [ -z "$name" ] && continue; case $name in \#*) continue;; esac
    timeout $(( $(left) - 60 )) env $envs python3 -m genlab bench $args --steps 1 --warmup 1 > "$OUT/j/warm_$name.log" 2>&1 &
  done < "$VF"
  wait
  echo "warm done at $(( $(date +%s) - T0 )) s"
fi
# 2) timed, one at a time
while IFS='|' read -r name args extra envs; do
  [ -z "$name" ] && continue; case $name in \#*) continue;; esac
  l=$(left); if [ "$l" -lt 40 ]; then echo "$name: skipped (budget)"; continue; fi
  extra=${extra//\$OUT/$OUT}
  timeout $(( l < PER ? l : PER )) env $envs python3 -m genlab bench $args --steps 20 --warmup 10 --json "$OUT/j/$name.json" $extra \
    > "$OUT/j/$name.log" 2>&1 || echo "$name: failed (rc $?)"
  echo "$name done at $(( $(date +%s) - T0 )) s"
done < "$VF"
python3 - "$OUT" "$VF" <<'PY'
import json, sys, pathlib
sys.path.insert(0, "src")
from genlab.bench import format_table
out, vf = pathlib.Path(sys.argv[1]), sys.argv[2]
names = [l.split("|")[0] for l in open(vf) if l.strip() and not l.startswith("#")]
rows, lines = [], []
for n in names:
    f = out / "j" / f"{n}.json"
    if f.exists():
        r = json.loads(f.read_text()); rows.append(r)
        lines.append(f"{n}: {r['switches']}  graphs {r['graphs']} recompiles {r['recompiles']} host syncs/step {r.get('host_syncs_per_step')}")
    else:
        lines.append(f"{n}: no result")
t = format_table(rows) + "\n\nrows in order: " + ", ".join(n for n in names if (out / "j" / f"{n}.json").exists()) + "\n\n" + "\n".join(lines)
for p in sorted(out.glob("j/*/profile.md")):
    t += f"\n\n### {p.parent.name}\n\n" + p.read_text()
(out / "results.md").write_text(t + "\n"); print(t)
PY
tar czf "$OUT/logs.tgz" --exclude='*.json.gz' -C "$OUT" j 2>/dev/null
ls -la "$OUT"
