#!/usr/bin/env bash
# The GPU check in one command: omnicore on CuPy vs the reference on torch CUDA, side by side.
#
#   benchmarks/gpu/run.sh [--dry-run] [--out DIR]
#
# On a CUDA machine without network, in at most 8 minutes (each step has a time limit; a step
# that fails or runs out of time is logged and the next one still runs):
#   1. wheels    installs what the interpreter lacks from benchmarks/gpu/wheels/ into
#                benchmarks/gpu/.site (no system packages touched); omnicore itself runs from
#                this checkout (PYTHONPATH). How to fill the folder: benchmarks/README.md, "GPU".
#   2. checkpoint  builds the full-size random checkpoint (tools/reference/make_checkpoint.py
#                --size full, with torch) in $CKPT (default checkpoints/full) unless it is there,
#                in the background while step 3 runs
#   3. tests     the tiny checkpoint's equivalence tests with the pipeline on CuPy: token-exact
#                codes vs the reference fixtures, audio vs the numpy backend, transfers per step
#                (tests/test_strict_backend.py with OMNICORE_TEST_DEVICE_BACKEND=cupy), and
#                tests/test_pipeline.py's generate cases with OMNICORE_BACKEND=cupy
#   4. sides     benchmarks/gpu/bench_gpu.py: omnicore (CuPy), the reference in float32 and in
#                float16 (torch CUDA), each in its own process; then omnicore's precision
#                profiles tf32, bf16 and fp16 (generate, packed throughput, and every omnicore
#                side's logits against a float64 forward of the same checkpoint on the host)
#   5. report    $OUT/table.md (markdown) and $OUT/timings.json (raw timings of every side)
#
# --dry-run: the same steps on the CPU: the tiny checkpoint, omnicore on the strict backend
# (omnicore_testing/strictxp.py), the reference on CPU torch in float32 if $REF_PYTHON exists (default
# $OMNICORE_REF_VENV/bin/python), smaller sizes. Step 2 then only checks the tiny checkpoint.
#
# Environment: PYTHON (python3), REF_PYTHON (the reference's interpreter; default $PYTHON on a
# GPU), CKPT, NO_REFERENCE=1 (omnicore only), BENCH_SECONDS / BENCH_STEPS / BENCH_BATCH /
# BENCH_REPEATS / BENCH_ENCODE_SECONDS (sizes), BENCH_PRECISIONS (profiles besides fp32, default
# "tf32 bf16 fp16"), BENCH_TESTS (a pytest -k expression for step 3),
# BENCH_FORCE_WHEELS (distributions to install from the wheels folder even when present, e.g.
# "transformers" if the image's is older than omnivoice needs).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
unset OMNICORE_BACKEND  # each step sets its own; the tests' parent process must be numpy
DRY=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT=${2:?--out needs a folder}; shift ;;
    -h|--help) sed -n 2,30p "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OUT" ] || OUT=$ROOT/benchmarks/gpu/out/$(date +%Y%m%d-%H%M%S)$([ $DRY = 1 ] && echo -dry)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
WHEELS=$ROOT/benchmarks/gpu/wheels
SITE=$ROOT/benchmarks/gpu/.site
BENCH="$ROOT/benchmarks/gpu/bench_gpu.py"
T0=$SECONDS
: > "$OUT/steps.txt"

log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/run.log"; }
step() {  # step NAME LIMIT_S CMD...: run with a time limit, output in $OUT/NAME.log
  local name=$1 limit=$2
  shift 2
  log "$name (limit ${limit} s)"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc$([ $rc = 124 ] && echo ' (time limit)')"
  echo "$name $rc" >> "$OUT/steps.txt"
  return $rc
}

if [ $DRY = 1 ]; then
  BACKEND=strict; DEVICE=cpu
  CKPT=${CKPT:-$ROOT/weights/tiny-random}
  REF_PY=${REF_PYTHON:-${OMNICORE_REF_VENV:-.venvs/ref}/bin/python}
  SIZES=(--seconds "${BENCH_SECONDS:-4}" --steps "${BENCH_STEPS:-8}" --batch "${BENCH_BATCH:-4}"
         --repeats "${BENCH_REPEATS:-1}" --encode-seconds "${BENCH_ENCODE_SECONDS:-2}")
else
  BACKEND=cupy; DEVICE=cuda
  CKPT=${CKPT:-$ROOT/checkpoints/full}
  REF_PY=${REF_PYTHON:-$PY}
  SIZES=(--seconds "${BENCH_SECONDS:-10}" --steps "${BENCH_STEPS:-32}" --batch "${BENCH_BATCH:-8}"
         --repeats "${BENCH_REPEATS:-3}" --encode-seconds "${BENCH_ENCODE_SECONDS:-5}")
fi
log "omnicore GPU check: $([ $DRY = 1 ] && echo 'dry run (CPU, strict backend)' || echo 'CuPy'), out $OUT"
{
  echo "date: $(date -u +%FT%TZ)"; echo "git: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null)"
  echo "python: $($PY -VV 2>&1)"; nvidia-smi -L 2>/dev/null; nvidia-smi 2>/dev/null | sed -n 3p
} > "$OUT/env.txt"

# --- 1. wheels ---------------------------------------------------------------------------------
install_wheels() {
  mkdir -p "$SITE"
  local missing=() whl dist
  for whl in "$WHEELS"/*.whl; do
    [ -e "$whl" ] || continue
    dist=$(basename "$whl" | cut -d- -f1)
    if [[ " ${BENCH_FORCE_WHEELS:-} " == *" $dist "* ]] || \
       ! PYTHONPATH="$SITE" $PY -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$dist" 2>/dev/null; then
      missing+=("$whl")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing into $SITE: ${missing[*]##*/}"
    $PY -m pip install -q --no-index --no-deps --disable-pip-version-check --upgrade --target "$SITE" "${missing[@]}" || return 1
  else
    echo "nothing to install from $WHEELS"
  fi
  local check='import importlib.util, sys
bad = [m for m in sys.argv[2:] if importlib.util.find_spec(m) is None]
print(sys.argv[1] + ":", "MISSING " + ", ".join(bad) if bad else "every module is there")'
  PYTHONPATH="$ROOT:$SITE" $PY -c "$check" "omnicore side and tests ($PY)" numpy numba safetensors \
    tokenizers soundfile huggingface_hub omnicore pytest hypothesis
  if [ "${NO_REFERENCE:-0}" = 1 ]; then
    echo "reference side: not checked (NO_REFERENCE=1)"
  elif ! command -v "$REF_PY" >/dev/null 2>&1; then
    echo "reference side: no interpreter at $REF_PY (set REF_PYTHON or OMNICORE_REF_VENV)"
  else
    PYTHONPATH="$ROOT:$SITE" $REF_PY -c "$check" "reference side ($REF_PY)" torch transformers \
      omnivoice pydub accelerate soundfile
  fi
}
export -f install_wheels
export ROOT PY REF_PY WHEELS SITE NO_REFERENCE
step wheels 60 bash -c install_wheels
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
REF_PATH=$PYTHONPATH
if ! $REF_PY -c 'import torchaudio' 2>/dev/null; then
  REF_PATH="$PYTHONPATH:$ROOT/benchmarks/gpu/shim"  # only resample is used; see shim/torchaudio
  echo "torchaudio: not importable, the reference uses benchmarks/gpu/shim/torchaudio (resample only)" >> "$OUT/env.txt"
fi

# --- 2. checkpoint -----------------------------------------------------------------------------
if [ -f "$CKPT/model.safetensors" ]; then
  log "checkpoint: $CKPT is there"
  echo "checkpoint 0" >> "$OUT/steps.txt"
elif [ $DRY = 1 ]; then
  log "checkpoint: $CKPT missing"; echo "checkpoint 1" >> "$OUT/steps.txt"
else
  # built on the CPU while step 3 uses the GPU; the sides wait for it
  PYTHONPATH=$REF_PATH step checkpoint 150 $REF_PY tools/reference/make_checkpoint.py --size full --out "$CKPT" &
  CKPT_PID=$!
fi

# --- 3. equivalence tests on the tiny checkpoint ------------------------------------------------
TESTS_K=()
[ -n "${BENCH_TESTS:-}" ] && TESTS_K=(-k "$BENCH_TESTS")
OMNICORE_TEST_DEVICE_BACKEND=$BACKEND step tests 150 $PY -m pytest -q -p no:cacheprovider \
  tests/test_strict_backend.py "${TESTS_K[@]}"
if [ $DRY = 0 ]; then
  OMNICORE_BACKEND=cupy step tests_pipeline 90 $PY -m pytest -q -p no:cacheprovider -x \
    tests/test_pipeline.py -k "test_generate_matches_reference"
fi

# --- 4. the sides ------------------------------------------------------------------------------
[ -n "${CKPT_PID:-}" ] && wait "$CKPT_PID"
rm -f "$OUT"/*.skipped
OMNICORE_BACKEND=$BACKEND step omnicore 110 $PY "$BENCH" side omnicore --model "$CKPT" \
  --json "$OUT/omnicore.json" --budget-s 90 "${SIZES[@]}"
for P in ${BENCH_PRECISIONS:-tf32 bf16 fp16}; do
  OMNICORE_BACKEND=$BACKEND step omnicore_$P 50 $PY "$BENCH" side omnicore --model "$CKPT" \
    --precision "$P" --generate-only --json "$OUT/omnicore_$P.json" --budget-s 35 "${SIZES[@]}"
done
if [ "${NO_REFERENCE:-0}" = 1 ]; then
  echo "NO_REFERENCE=1" > "$OUT/reference_float32.skipped"
elif ! [ -x "$(command -v "$REF_PY")" ]; then
  echo "no reference interpreter at $REF_PY (set REF_PYTHON)" > "$OUT/reference_float32.skipped"
else
  PYTHONPATH=$REF_PATH step reference_float32 90 $REF_PY "$BENCH" side reference --model "$CKPT" \
    --device $DEVICE --dtype float32 --json "$OUT/reference_float32.json" --budget-s 70 "${SIZES[@]}"
fi
if [ "${NO_REFERENCE:-0}" = 1 ] || ! [ -x "$(command -v "$REF_PY")" ]; then
  echo "reference skipped" > "$OUT/reference_float16.skipped"
elif [ $DRY = 1 ]; then
  echo "float16 is the reference's CUDA setting; not run on the CPU" > "$OUT/reference_float16.skipped"
else
  PYTHONPATH=$REF_PATH step reference_float16 60 $REF_PY "$BENCH" side reference --model "$CKPT" \
    --device $DEVICE --dtype float16 --generate-only --json "$OUT/reference_float16.json" \
    --budget-s 45 "${SIZES[@]}"
fi

# --- 5. report ---------------------------------------------------------------------------------
step report 30 $PY "$BENCH" report "$OUT"
cat "$OUT/table.md" 2>/dev/null
log "done in $((SECONDS - T0)) s; steps (name exit): $(tr '\n' ' ' < "$OUT/steps.txt")"
# exit status: 0 only when every step passed
! grep -qv ' 0$' "$OUT/steps.txt"
