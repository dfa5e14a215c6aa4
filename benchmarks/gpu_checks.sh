#!/usr/bin/env bash
# The device checks in one script, sized for one device session of about 9 minutes with the machine's set-up (a lent
# GPU: ~15 minutes of device time all tries together, no network). Run from the repository root there, with the
# wheels of ../shared/notes/gpu-device.md in .whl/ (carried) and $OUT set; all output to $OUT/gpu_checks.log, JSON
# lines to $OUT/*.jsonl (one line a part in $OUT/parts.jsonl: name, exit code, seconds, limit, timed out, and the
# tests' summary line). On the device: `bash benchmarks/gpu_checks.sh`.
#
# The parts, in priority order (issue 64), each under `timeout` of min(its own limit, the time left): the whole
# script ends within $DEADLINE seconds (480) of its start, and a part with under 20 s left is skipped with a line
# (and a JSON line) saying so.
#   a. make test-gpu's test files (ENTROPY_RFT_TEST_DEVICE=cuda; the list is read from the Makefile), one pytest
#      process per file, all at once (the card and 16 cores hold them), each under the part's limit
#   b. gpu.py decode on the 0.5B shape in bf16 at 32 and 256 rows: the compiled step (CUDA's defaults: fused QKV and
#      gate/up, noise drawn in the step, length buckets) and issue 53's (compile_53), with CUDA kernels per step
#   c. gpu.py decode --rl: RL-length ragged responses (up to 4096 new tokens after 256 prompt tokens) at 32 rows, the
#      same two arms with their kernel counts
#   d. gpu.py decode on the 1.5B shape, bf16, 32 and 256 rows, the compiled step
#   e. gpu.py step-vs-trl, lean: the built-in GRPO step, TRL's GRPOTrainer and its monitor (the adapter's statistics
#      pass in bf16), one warm-up and one measured step each
#   f. gpu.py stats: the streamed statistics' Triton kernels against TRL's
# Without CUDA every part says it needs CUDA (a JSON line each) and the script exits 0: the CPU rehearsal,
# `OUT=/tmp/gpu-rehearsal PY=.venv/bin/python bash benchmarks/gpu_checks.sh`.
# .whl/*.whl are always installed (into $SITE, first on PYTHONPATH); .whl/fallback/*.whl only where the machine has
# no such distribution (packages the image is believed to have: xxhash and requests with their dependencies).
set -uo pipefail
DEADLINE=${DEADLINE:-480}
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; LOG=$OUT/gpu_checks.log; PARTS=$OUT/parts.jsonl
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
SHAPE=Qwen--Qwen2.5-0.5B-Instruct
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

left() { echo $((DEADLINE - SECONDS)); }

# record NAME RC SECONDS LIMIT [SUMMARY]: one JSON line in $PARTS
record() {
  local timed_out=false summary=${5:-}
  { [ "$2" = 124 ] || [ "$2" = 137 ]; } && timed_out=true
  printf '{"part": "%s", "rc": %s, "seconds": %s, "limit": %s, "timed_out": %s, "summary": "%s"}\n' \
    "$1" "$2" "$3" "$4" "$timed_out" "${summary//\"/\'}" >>"$PARTS"
}

# budget LIMIT: min(LIMIT, time left - 10 s for the kill and what follows); prints it
budget() {
  local t=$(($(left) - 10))
  ((t > $1)) && t=$1
  echo "$t"
}

# part NAME LIMIT COMMAND...: COMMAND under timeout of budget(LIMIT), or skipped with under 20 s
part() {
  local name=$1 start=$SECONDS rc t
  t=$(budget "$2")
  shift 2
  if ((t < 20)); then
    echo "== $name: skipped, $(left) s left of $DEADLINE"
    record "$name" '"skipped"' 0 "$t"
    return 0
  fi
  echo "== $name (timeout $t s; $(left) s left) $(date -u +%H:%M:%S)"
  timeout -k 5 "$t" "$@"
  rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s$( ((rc == 124 || rc == 137)) && echo ' (timed out)')"
  record "$name" "$rc" $((SECONDS - start)) "$t"
}

# needs_cuda NAME: the JSON line and the log line of a part that needs CUDA, on a machine without it
needs_cuda() {
  echo "== $1: skipped, it needs CUDA (torch.cuda.is_available() is False)"
  record "$1" '"needs CUDA"' 0 0
}

# tests LIMIT FILE...: one pytest process per file, at once, each under timeout of budget(LIMIT); a line each
tests() {
  local t start=$SECONDS pids=() files=() f i rc summary
  t=$(budget "$1")
  shift
  if ((t < 20)); then
    echo "== a. tests: skipped, $(left) s left of $DEADLINE"
    record "a. tests" '"skipped"' 0 "$t"
    return 0
  fi
  echo "== a. tests, $# files at once (timeout $t s each; $(left) s left) $(date -u +%H:%M:%S)"
  for f in "$@"; do
    timeout -k 5 "$t" env ENTROPY_RFT_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} "$f" \
      >"$OUT/test_$(basename "$f" .py).log" 2>&1 &
    pids+=($!)
    files+=("$f")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    f=${files[$i]}
    summary=$(grep -E '(passed|failed|error|skipped|no tests ran)' "$OUT/test_$(basename "$f" .py).log" | tail -1)
    echo "== a. $f: exit $rc after $((SECONDS - start)) s: $summary$( ((rc == 124 || rc == 137)) && echo ' (timed out)')"
    record "a. $f" "$rc" $((SECONDS - start)) "$t" "$summary"
  done
  tail -n 30 "$OUT"/test_*.log | grep -E '^(FAILED|ERROR)' || true
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
  echo "== set-up done after $SECONDS s"

  files=$(sed -n 's/.*ENTROPY_RFT_TEST_DEVICE=cuda $(PY) -m pytest -q \([^;]*\);.*/\1/p' Makefile)
  files=${files:-tests/test_kernels.py tests/test_recipe_shapes.py tests/test_decode.py tests/test_gpu.py}
  decode=("$PY" benchmarks/gpu.py decode --dtypes bf16 --reps 1 --kernels --out "$OUT/decode.jsonl")
  if [ $cuda = 1 ]; then
    # shellcheck disable=SC2086 # the Makefile's list of test files, split on spaces
    tests 120 $files
    part "b. decode, $SHAPE, bf16, 32 and 256 rows" 130 "${decode[@]}" "$SHAPE" --arms compile,compile_53 --rows 32 256
    part "c. decode --rl, $SHAPE, bf16, 32 rows" 110 "${decode[@]}" "$SHAPE" --rl --arms compile,compile_53 --rows 32
    part "d. decode, Qwen--Qwen2.5-1.5B-Instruct, bf16" 70 "${decode[@]}" Qwen--Qwen2.5-1.5B-Instruct --arms compile \
      --rows 32 256
    part "e. step-vs-trl lean, $SHAPE" 80 "$PY" benchmarks/gpu.py step-vs-trl "$SHAPE" --arms ours_grpo,trl_grpo,trl_none \
      --steps 1 --warmup 1 --out "$OUT/step_vs_trl.jsonl"
    part "f. stats" 45 "$PY" benchmarks/gpu.py stats --out "$OUT/stats.jsonl"
  else
    for name in "a. tests" "b. decode 32/256" "c. decode --rl" "d. decode 1.5B" "e. step-vs-trl lean" "f. stats"; do
      needs_cuda "$name"
    done
    # what the CPU can check of the parts: the parallel test runner on the CUDA tests of two files (they skip
    # cleanly), the decode script's options and its smoke run
    TEST_K=cuda tests 120 tests/test_decode.py tests/test_compile_decode.py
    part "b/c. decode --smoke (CPU check of the script)" 120 "$PY" benchmarks/gpu.py decode --smoke --rl --response 24 \
      --rl-mean 8 --arms compile,compile_53 --rows 4 --reps 1 --kernels --out "$OUT/decode_smoke.jsonl"
  fi
  echo "== done after $SECONDS s"
} 2>&1 | tee "$LOG"
exit 0
