#!/usr/bin/env bash
# The device checks in one script (a lent GPU: ~15 minutes, no network). Run from the repository root there, with the
# wheels of ../shared/notes/gpu-device.md in .whl/ (carried) and $OUT set; every part under its own timeout, all
# output to $OUT/gpu_checks.log. On the device: `bash benchmarks/gpu_checks.sh`.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; LOG=$OUT/gpu_checks.log
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{
  nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "== make test-gpu's tests (ENTROPY_RFT_TEST_DEVICE=cuda)"
  ENTROPY_RFT_TEST_DEVICE=cuda timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    tests/test_recipe_shapes.py tests/test_decode.py tests/test_gpu.py 2>&1 | tail -40
  echo "== benchmarks/gpu.py decode (0.5B shape, 32 and 256 rows, fp32 and bf16)"
  timeout 200 python3 benchmarks/gpu.py decode --reps 2 --out "$OUT/decode.jsonl" 2>&1 | tail -30
} 2>&1 | tee "$LOG"
