#!/usr/bin/env bash
# Issue 49's targets on one GPU, in under 10 minutes. Run from the repository root on a GPU machine:
# bash results/gpu_h200/gpu_targets.sh. Each part has its own time limit, so a slow one cannot take the
# others' time; what each printed is written under results/gpu_h200/ (commit those files):
#   gpu_targets.txt          benchmarks/gpu.py: steps against the tuned loop, train epochs and GPU busy,
#                            evaluation of 1,000,000 x 128 and its check against the CPU path
#   cuda_determinism_49.txt  the default CUDA path (bf16, channels_last, deterministic) repeats bit for bit
#   cub_shaped_dry_run.txt   seed 001's protocol on the CUB-shaped workload, estimated on this GPU
#   builtin_jobs_auto.txt    the built-in benchmark with --jobs auto on this GPU, timed, its folds as units of
#                            work (protocol.fold_units: the same results, up to 10 workers busy in its search)
# Where dmlbench's dependencies are not installed there, put their wheels in .whl/ (Python and
# platform of that machine).
set -u
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1
OUT=results/gpu_h200
T=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/gpu_targets.txt 2>&1
# One compiled dmlbench setting and the compiled anchor: each compilation of ResNet-50 takes about a minute.
timeout 360 python3 benchmarks/gpu.py --modes default,fp32,bf16,fast,fast+compile --steps 15 2>&1 | tee -a $OUT/gpu_targets.txt
echo "exit ${PIPESTATUS[0]}" >> $OUT/gpu_targets.txt
timeout 50 bash $OUT/cuda_determinism.sh 2>&1 | tee $OUT/cuda_determinism_49.txt
# The glyphs at 224 px are cached by the train above, so the estimate pays for no generation.
( time timeout 80 python3 -m dmlbench benchmark configs/cub_shaped_glyphs.yaml --dry-run -o $T/cub ) 2>&1 | tee $OUT/cub_shaped_dry_run.txt
( time timeout 100 python3 -m dmlbench benchmark src/dmlbench/configs/benchmark.yaml protocol.fold_units=true --jobs auto -o $T/builtin -q ) 2>&1 | tee $OUT/builtin_jobs_auto.txt
python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['environment'])" $T/builtin/benchmark.json >> $OUT/builtin_jobs_auto.txt 2>&1
# The GPU each of its runs trained on (worker k of --jobs on cuda:(k mod GPUs)).
python3 -c "import collections,json,pathlib,sys; print('runs per device:', dict(collections.Counter(json.loads(p.read_text()).get('environment', {}).get('device') for p in pathlib.Path(sys.argv[1]).rglob('run.json'))))" $T/builtin >> $OUT/builtin_jobs_auto.txt 2>&1
