#!/usr/bin/env bash
# The two from-scratch few-step methods on MNIST (cold, one process each), scored at 1, 2, 4, 8 network calls,
# then the few-step GPU tests. usage: bash benchmarks/gpu_few_step_scratch.sh MEANFLOW_SECONDS
set -u
export PYTHONPATH=$PWD/src
test -d data/mnist_test || tar xzf gpu_data/data.tgz
python -c "import tomli_w" 2>/dev/null || python -m pip install --quiet --no-deps wheels/*.whl
R=/tmp/fs_runs; mkdir -p $R
( timeout -s INT "$1" python -m genlab train mnist_meanflow eval.val_path=data/mnist_test log.tensorboard=false \
    train.out_dir=$R train.name=meanflow > $OUT/meanflow_train.log 2>&1 )
python -m genlab eval $R/meanflow eval.val_path=data/mnist_test eval.nfe_list=1,2,4,8 > $OUT/meanflow_eval.log 2>&1
python -m genlab train mnist_shortcut eval.val_path=data/mnist_test log.tensorboard=false train.out_dir=$R \
    train.name=shortcut > $OUT/shortcut_train.log 2>&1
python -m genlab eval $R/shortcut eval.val_path=data/mnist_test eval.nfe_list=1,2,4,8 > $OUT/shortcut_eval.log 2>&1
cat $R/*/eval_nfe.md > $OUT/nfe_scratch.md
for r in meanflow shortcut; do echo "$r $(python -c "import json;s=json.load(open('$R/$r/summary.json'));print({k:s.get(k) for k in ('status','step','wall_time','samples_per_s','sample_accuracy','feature_fd')})")"; done
timeout 90 python -m pytest -q -m gpu tests/test_few_step_meanflow.py tests/test_few_step_adversarial.py 2>&1 | tail -4
