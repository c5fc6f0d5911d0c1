#!/usr/bin/env bash
# Recreate the reference venv (CPU torch + transformers + omnivoice) that tools/reference/ runs in.
#
#   bash tools/reference/setup_env.sh [VENV_DIR]        # default $OMNICORE_REF_VENV, else .venvs/ref
#
# Python 3.11 is expected (PYTHON=... to choose another interpreter). Unless pip already finds
# the CPU build of torch (a local wheel folder in its configuration), take it from PyTorch's CPU
# index, otherwise PyPI's default (CUDA) wheel comes in:
#
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash tools/reference/setup_env.sh
#
# Order matters: torch first, then everything else, then omnivoice and torchaudio with --no-deps
# so that neither pulls a CUDA torch (nor gradio, librosa, ... which inference does not need).
# Finally torchaudio's compiled extension is moved aside: PyPI's torchaudio 2.11 is built against
# CUDA torch and cannot load beside the CPU one; only the pure-python
# torchaudio.functional.resample is used (by OmniVoice and the Higgs encoder).
set -euo pipefail

VENV=${1:-${OMNICORE_REF_VENV:-.venvs/ref}}
PY=${PYTHON:-python3.11}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REQ="$HERE/requirements.txt"

pin() {  # pin NAME -> the NAME==VERSION line of requirements.txt
    grep -E "^$1==" "$REQ" | head -n 1
}

"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)

# 1. torch (CPU)
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "${PIP[@]}" install --index-url "$TORCH_INDEX_URL" "$(pin torch)"
else
    "${PIP[@]}" install "$(pin torch)"
fi

# 2. everything else that has ordinary dependencies
REST=$(mktemp)
trap 'rm -f "$REST"' EXIT
grep -vE '^(torch|torchaudio|omnivoice)==' "$REQ" | grep -vE '^[[:space:]]*(#|$)' > "$REST"
"${PIP[@]}" install -r "$REST" "$(pin torch)"

# 3. the two packages whose declared dependencies would drag in a CUDA torch / training extras
"${PIP[@]}" install --no-deps "$(pin torchaudio)" "$(pin omnivoice)"

# 4. move torchaudio's compiled extension aside (kept in torchaudio/_disabled_so/)
"$VENV/bin/python" - <<'PY'
import importlib.util, pathlib, shutil
root = pathlib.Path(importlib.util.find_spec("torchaudio").origin).parent
aside = root / "_disabled_so"
aside.mkdir(exist_ok=True)
for so in sorted(p for p in root.rglob("*.so*") if aside not in p.parents):
    shutil.move(str(so), str(aside / so.name))
    print(f"moved aside: {so.relative_to(root)}")
PY

# 5. smoke check: the pieces the oracle uses import and run on CPU
"$VENV/bin/python" - <<'PY'
import warnings
warnings.filterwarnings("ignore")
import torch, torchaudio, transformers, onnxruntime
from omnivoice.models.omnivoice import OmniVoice  # noqa: F401
from transformers import HiggsAudioV2TokenizerModel  # noqa: F401
y = torchaudio.functional.resample(torch.zeros(1, 2400), 24000, 16000)
assert y.shape[-1] == 1600, y.shape
print("reference env ok:", torch.__version__, transformers.__version__, onnxruntime.__version__)
PY
