#!/usr/bin/env bash
# One GPU call of the shipped few_step sweep (resumable: run it again on the same machine to continue).
# usage: bash benchmarks/gpu_few_step_sweep.sh ONLY MAX_TIME [extra sweep args]; writes $OUT/report.md and $OUT/sweep.tgz
set -u
ONLY=$1; MAX=$2; shift 2
export PYTHONPATH=$PWD/src
test -d data/mnist_test || tar xzf gpu_data/data.tgz
python -c "import tomli_w" 2>/dev/null || python -m pip install --quiet --no-deps wheels/*.whl
python -m genlab sweep few_step --only "$ONLY" --max-time "$MAX" "$@" 2>&1 | tail -40
d=sweeps/few_step
cp $d/report.md $OUT/report.md 2>/dev/null
cp $d/nfe.md $OUT/nfe.md 2>/dev/null
tar czf $OUT/sweep.tgz --exclude='*/checkpoints' --exclude='*.pt' --exclude='*.safetensors' --exclude='*.npy' --exclude='*/dcp' $d 2>/dev/null
ls -la $OUT
