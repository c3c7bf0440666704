set -u
source "$(dirname "$0")/gpu_deps.sh"  # tomli_w for genlab train
export PYTHONPATH=src:${PYTHONPATH:-}
G="python3 -m genlab"
RUNS=/tmp/r; mkdir -p $RUNS
$G data prepare text --src gpu_data/tinyshakespeare.txt --tokenizer char --out gpu_data/shakespeare_char > /dev/null 2>&1
C="train.out_dir=$RUNS log.every=250 log.progress=false log.tensorboard=false log.eval_every=1000"
timeout 200 $G train shakespeare_char_ar $C train.name=ar 2>&1 | tail -3
python3 -c "
import json
for l in open('$RUNS/ar/metrics.jsonl'):
    r=json.loads(l)
    if 'eval/val_loss' in r or r['step']%1000==0: print(r['step'], round(r.get('loss',0) or 0,4), r.get('eval/val_loss'))
"
timeout 200 $G train shakespeare_char_mdlm $C train.name=mdlm log.eval_every=0 2>&1 | tail -3
timeout 60 $G eval $RUNS/mdlm eval.gen_ppl_model=$RUNS/ar eval.gen_samples=16 > $OUT/eval_mdlm.json 2>$OUT/eval.err; tail -3 $OUT/eval.err
cp $RUNS/ar/summary.json $OUT/ar_summary.json; cp $RUNS/mdlm/summary.json $OUT/mdlm_summary.json; cp $RUNS/ar/metrics.jsonl $OUT/ar_metrics.jsonl
cp $RUNS/mdlm/bound_vs_T.md $OUT/ 2>/dev/null; cp $RUNS/mdlm/bound_vs_T.png $OUT/ 2>/dev/null; cp $RUNS/ar/samples.txt $OUT/ar_samples.txt; cp $RUNS/mdlm/samples.txt $OUT/mdlm_samples.txt 2>/dev/null
cat $OUT/bound_vs_T.md 2>/dev/null; python3 -c "import json; print(json.load(open('$OUT/eval_mdlm.json')).get('gen_ppl'))"
