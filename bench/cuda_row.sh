#!/usr/bin/env bash
# Issue 18's CUDA row: this engine on one GPU against HF generate on the same
# GPU, on a machine lent through the `device` tool (it reaches no registry and
# takes a working tree of at most 64 MiB, so the model's weights cannot go:
# the rows run on the default model's shape with seeded random weights; speed
# does not depend on their values).
#
# Here, once:   .venv/bin/python -m bench.random_model stage --out .device/model-shape
# There:        device run, carry [".device"], command: bash bench/cuda_row.sh
#               (about 5 minutes after the machine starts; results in $OUT)
# A dry run on a CPU, smaller:
#   DEVICE=cpu PYTHON=.venv/bin/python BENCH_ARGS="--requests 8" \
#   FAIRNESS_ARGS="--long-tokens 1024 --streams 4" bash bench/cuda_row.sh
set -euo pipefail
out=${OUT:-build/bench/cuda}
mkdir -p "$out"
export PYTHONPATH=backends:. PYTHONUNBUFFERED=1
shape=${SHAPE:-.device/model-shape}
if [ ! -f "$shape/config.json" ]; then
    echo "no $shape: stage it here first (python -m bench.random_model stage --out $shape)" >&2
    exit 2
fi
device=${DEVICE:-cuda}
python=${PYTHON:-python3}   # the device image's python3 holds torch
read -r -a extra <<< "${BENCH_ARGS:-}"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no nvidia-smi"
  "$python" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.version.cuda)"; } | tee "$out/machine.txt"
common=(--device "$device" --model-dir "$shape" --random-weights 0 --markdown "${extra[@]}")
# fp32: the engine, HF one at a time (its outputs judged against the engine's)
# and HF static batches; then bf16, the dtype a GPU serves in
# (the timeouts add up to 510 s, inside one call's 600; expected ~3 minutes)
timeout 240 "$python" -m bench "${common[@]}" --only engine,hf-single,hf-batch --hf-batch-sizes 16,64 \
    --json "$out/cuda_fp32.json" 2>&1 | tee "$out/cuda_fp32.log" || echo "fp32 run: exit $?"
timeout 150 "$python" -m bench "${common[@]}" --dtype bfloat16 --only engine,hf-batch --hf-batch-sizes 64 \
    --json "$out/cuda_bf16.json" 2>&1 | tee "$out/cuda_bf16.log" || echo "bf16 run: exit $?"
# and the fairness point: 16 streams decoding, a context-length prompt arrives
read -r -a fairness_extra <<< "${FAIRNESS_ARGS:-}"
timeout 120 "$python" -m bench.fairness --device "$device" --model-dir "$shape" --random-weights 0 --points default \
    "${fairness_extra[@]}" --json "$out/fairness.json" 2>&1 | tee "$out/fairness.log" || echo "fairness run: exit $?"
