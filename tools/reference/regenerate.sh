#!/usr/bin/env bash
# Rebuild every committed fixture, deterministically, from the reference implementation.
#
#   bash tools/reference/regenerate.sh            # VENV: $OMNICORE_REF_VENV, else .venvs/ref
#
# 1. weights/tiny-random            make_checkpoint.py --size tiny (seeded: byte-identical)
# 2. tests/fixtures/audio           make_speech_clip.py (espeak-ng; kept if present)
# 3. tests/fixtures/onnx            export_onnx.py
# 4. tests/fixtures/reference       dump_reference.py (every dump_*.py, among them dump_voice.py:
#                                  the reference's own VoiceClonePrompt.save .pt files)
#                                  + tests/fixtures/manifest.json
# Then review `git status` / `git diff --stat` and commit the fixtures with the manifest.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${VENV:-${OMNICORE_REF_VENV:-.venvs/ref}}
PY="$VENV/bin/python"
cd "$ROOT"

export PYTHONHASHSEED=0 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

"$PY" tools/reference/make_checkpoint.py --size tiny --out weights/tiny-random
"$PY" tools/reference/make_speech_clip.py
"$PY" tools/reference/export_onnx.py --ckpt weights/tiny-random --out tests/fixtures/onnx
"$PY" tools/reference/dump_reference.py --ckpt weights/tiny-random --out tests/fixtures/reference
