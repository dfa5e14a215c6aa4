#!/usr/bin/env bash
# The device checks in one script (a lent GPU: ~15 minutes, no network). Run from the repository root there, with the
# wheels of ../shared/notes/gpu-device.md in .whl/ (carried) and $OUT set; all output to $OUT/gpu_checks.log, JSON
# lines to $OUT/*.jsonl. On the device: `bash benchmarks/gpu_checks.sh`.
#
# The parts, in priority order, each under `timeout` of min(its own limit, the time left): the whole script ends
# within $DEADLINE seconds (585) of its start, and a part with under 20 s left is skipped with a line saying so.
#   a. gpu.py decode on the 0.5B shape in bf16 at 32 and 256 rows: the arms static and compile (issue 53's targets)
#   b. gpu.py step-vs-trl: the whole GRPO step against TRL's GRPOTrainer (issue 56)
#   c. make test-gpu's tests (ENTROPY_RFT_TEST_DEVICE=cuda; the list is read from the Makefile)
#   d. with time left: decode's generate and hf arms (same shape, rows, dtype), then gpu.py stats
#   e. with time left: decode on the 1.5B shape, then the 0.5B shape in fp32
# Without CUDA every part says it needs CUDA and the script exits 0 (the CPU rehearsal:
# `OUT=/tmp/gpu-rehearsal PY=.venv/bin/python bash benchmarks/gpu_checks.sh`).
# .whl/*.whl are always installed (into $SITE, first on PYTHONPATH); .whl/fallback/*.whl only where the machine has
# no such distribution (packages the image is believed to have: xxhash and requests with their dependencies).
set -uo pipefail
DEADLINE=${DEADLINE:-585}
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; LOG=$OUT/gpu_checks.log
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
SHAPE=Qwen--Qwen2.5-0.5B-Instruct
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

left() { echo $((DEADLINE - SECONDS)); }

# part NAME LIMIT COMMAND...: COMMAND under timeout of min(LIMIT, time left - 10 s for the kill and what follows)
part() {
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  local t=$(($(left) - 10))
  ((t > limit)) && t=$limit
  if ((t < 20)); then
    echo "== $name: skipped, $(left) s left of $DEADLINE"
    return 0
  fi
  echo "== $name (timeout $t s; $(left) s left) $(date -u +%H:%M:%S)"
  timeout -k 5 "$t" "$@"
  rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s$( ((rc == 124 || rc == 137)) && echo ' (timed out)')"
}

# decode NAME LIMIT SHAPE DTYPE: gpu.py decode with the arms hf, static, compile, generate where this gpu.py has
# them (--arms, --dtypes), else main's decode (its two arms, fp32 and bf16): an unknown option must not cost the part
decode() {
  local name=$1 limit=$2 shape=$3 dtype=$4 arms=${5:-static,compile,generate,hf}
  if "$PY" benchmarks/gpu.py decode --help 2>/dev/null | grep -q -- "--dtypes"; then
    part "$name" "$limit" "$PY" benchmarks/gpu.py decode "$shape" --arms "$arms" --dtypes "$dtype" \
      --rows 32 256 --out "$OUT/decode.jsonl"
  elif [ "$dtype" = fp32 ] && [ "$shape" = "$SHAPE" ]; then
    echo "== $name: this gpu.py decode has no --dtypes; part a ran main's decode, fp32 included"
  else
    echo "== $name: this gpu.py decode has no --arms/--dtypes; main's decode instead (ours and hf_static, fp32 and bf16)"
    part "$name" "$limit" "$PY" benchmarks/gpu.py decode "$shape" --rows 32 256 --reps 2 --out "$OUT/decode.jsonl"
  fi
}

{
  echo "== gpu_checks.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(date -u +%FT%TZ), deadline $DEADLINE s"
  nvidia-smi -L 2>&1 || echo "no nvidia-smi"
  shopt -s nullglob
  wheels=(.whl/*.whl)
  for w in .whl/fallback/*.whl; do
    dist=${w##*/}
    dist=${dist%%-*}
    "$PY" -c "import importlib.metadata as m; m.version('$dist')" 2>/dev/null || wheels+=("$w")
  done
  if ((${#wheels[@]})); then
    echo "== wheels into $SITE: ${wheels[*]##*/}"
    if ! "$PY" -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$SITE" "${wheels[@]}" 2>&1; then
      echo "== the wheels did not install together; one at a time:"
      for w in "${wheels[@]}"; do
        "$PY" -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$SITE" "$w" >/dev/null 2>&1 ||
          echo "   not installed: ${w##*/}"
      done
    fi
  fi
  export PYTHONPATH=$SITE:$PWD
  "$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "transformers", "triton", "accelerate", "peft", "trl", "datasets", "pyarrow", "pandas", "xxhash",
             "requests", "fsspec", "huggingface_hub", "dill", "multiprocess", "pydantic", "pytest", "hypothesis"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '?')}")
    except Exception as err:  # what is missing is what the log must show
        print(f"  {name}: not importable ({type(err).__name__}: {err})")
EOF
  if "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then cuda=1; else cuda=0; fi
  echo "== CUDA: $([ $cuda = 1 ] && echo yes || echo 'no: every part says it needs CUDA')"

  decode "a. decode, $SHAPE, bf16: static and compile" 170 "$SHAPE" bf16 static,compile

  part "b. step-vs-trl, $SHAPE, 2 x 16 rows x 256 tokens" 190 "$PY" benchmarks/gpu.py step-vs-trl "$SHAPE" \
    --out "$OUT/step_vs_trl.jsonl"

  tests=$(sed -n 's/.*ENTROPY_RFT_TEST_DEVICE=cuda $(PY) -m pytest -q \([^;]*\);.*/\1/p' Makefile)
  tests=${tests:-tests/test_kernels.py tests/test_recipe_shapes.py tests/test_decode.py tests/test_gpu.py}
  if [ $cuda = 1 ]; then
    # shellcheck disable=SC2086 # the Makefile's list of test files, split on spaces
    part "c. make test-gpu's tests: $tests" 160 env ENTROPY_RFT_TEST_DEVICE=cuda "$PY" -m pytest -q \
      -p no:cacheprovider $tests
  else
    echo "== c. make test-gpu's tests: skipped, they need CUDA (torch.cuda.is_available() is False)"
  fi

  decode "d. decode, $SHAPE, bf16: transformers' static-cache generate and hf" 120 "$SHAPE" bf16 generate,hf
  part "d. stats" 90 "$PY" benchmarks/gpu.py stats --out "$OUT/stats.jsonl"

  decode "e. decode, Qwen--Qwen2.5-1.5B-Instruct, bf16" 120 Qwen--Qwen2.5-1.5B-Instruct bf16
  decode "e. decode, $SHAPE, fp32" 120 "$SHAPE" fp32
  echo "== done after $SECONDS s"
} 2>&1 | tee "$LOG"
exit 0
