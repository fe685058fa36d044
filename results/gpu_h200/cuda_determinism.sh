#!/usr/bin/env bash
# Is a CUDA training run bit-repeatable, and did it run on CUDA (its run.json's environment)? Run from
# the repository root on a GPU machine: bash results/gpu_h200/cuda_determinism.sh. Where dmlbench's
# dependencies are not installed there, put their wheels in .whl/ (Python and platform of that machine).
set -u
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1
T=$(mktemp -d)
tiny=('data.options={max_classes: 40, augmentations_per_font: 0, image_size: 16}' model.embedding_dim=16 'model.options={width: 8}' training.epochs=3 training.batch_size=32 'evaluation.metrics=[precision_at_1, map_at_r]')
for run in cuda1:cuda cuda2:cuda cpu:cpu auto:auto; do
  python3 -m dmlbench train configs/glyphs.yaml "${tiny[@]}" training.device=${run#*:} -o $T/${run%%:*} 2>&1 | tail -1
  python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['environment']; print(sys.argv[2], e['device'], e['device_name'])" $T/${run%%:*}/run.json ${run%%:*}
done
for pair in cuda1:cuda2 cuda1:cpu cuda1:auto; do
  a=${pair%%:*}; b=${pair#*:}
  for f in checkpoint_best.pt checkpoint_last.pt; do cmp -s $T/$a/$f $T/$b/$f && echo "SAME $a $b $f" || echo "DIFFERENT $a $b $f"; done
done
python3 -m dmlbench evaluate $T/cuda1 --json $T/e1.json > /dev/null 2>&1; python3 -m dmlbench evaluate $T/cuda2 --json $T/e2.json > /dev/null 2>&1
cmp -s $T/e1.json $T/e2.json && echo "SAME evaluate json cuda1 cuda2" || echo "DIFFERENT evaluate json cuda1 cuda2"
