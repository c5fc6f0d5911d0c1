"""Finding a checkpoint and reading its safetensors files safely.

Three jobs, top to bottom:

1. `resolve_model_dir`: a local directory, or a hub repo id fetched (and cached) through
   huggingface_hub with only the files omnicore needs. No network -> ModelNotFoundError that
   says what to download and how, after at most a few seconds.
2. `read_safetensors`: our own parser of the safetensors format (8-byte little-endian header
   length, a JSON header, then raw little-endian tensor bytes). Every header field is checked
   before any byte is trusted, so a truncated or hostile file fails with a WeightsError that
   names the file and the key instead of a crash deep inside numpy. F32/I64 tensors are
   zero-copy views into a read-only memory map: only pages that are actually touched (e.g.
   the few rows of the 151676 x 1024 embedding table a prompt uses) are read from disk.
   BF16/F16/F64 tensors are converted to float32 once, here.
3. `ParamReader`: hands tensors to each stage's `load_params` by exact checkpoint key with
   a shape check, and at the end asserts that every key in the file was used. Each stage's
   `load_params` is the one place its layout changes (transposes, weight-norm folding) happen.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from .errors import ModelNotFoundError, WeightsError

HUB_REPO = "k2-fsa/OmniVoice"
HUB_CODEC_REPO = "eustlb/higgs-audio-v2-tokenizer"

# Files omnicore reads from a checkpoint; everything else in the repo (README, images,
# training state) is never downloaded.
MODEL_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "audio_tokenizer/config.json", "audio_tokenizer/model.safetensors",
               "audio_tokenizer/preprocessor_config.json"]
CODEC_FILES = ["config.json", "model.safetensors", "preprocessor_config.json"]

# ---------------------------------------------------------------------------------------------
# 1. Locating a checkpoint
# ---------------------------------------------------------------------------------------------


def resolve_model_dir(name_or_path: str | os.PathLike, files: list[str] = MODEL_FILES) -> Path:
    """Return a local directory holding the checkpoint `name_or_path`.

    An existing directory is used as it is. Anything else is taken as a hub repo id: the
    local HF cache is tried first (so HF_HUB_OFFLINE=1 and machines without network work
    once the files are cached), then a download of just `files`.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    name = str(name_or_path)
    if path.exists():
        raise ModelNotFoundError(f"{name}: expected a checkpoint directory, found a file")
    if name.count("/") != 1 or name.startswith((".", "/", "~")) or name.endswith("/"):
        raise ModelNotFoundError(
            f"{name}: no such directory, and not a hub repo id of the form 'owner/name' "
            f"(the OmniVoice checkpoint is '{HUB_REPO}')")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - it is a hard dependency
        raise ModelNotFoundError("huggingface_hub is not installed; pip install huggingface-hub") from None

    # Short timeouts: a machine without network must get the offline message quickly,
    # not hang on connection attempts. Users can raise them through the usual HF env vars.
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    try:
        return Path(snapshot_download(name, allow_patterns=files, local_files_only=True))
    except Exception:
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if not offline:
        try:
            return Path(snapshot_download(name, allow_patterns=files, etag_timeout=10))
        except Exception as exc:  # network, auth, 404 ... all end up as one clear message
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:  # pragma: no cover
            reason = ""
    else:
        reason = "HF_HUB_OFFLINE is set and the files are not in the local Hugging Face cache"
    raise ModelNotFoundError(
        f"Could not get the checkpoint '{name}' from the Hugging Face hub ({reason}).\n"
        f"On a machine with network access, download it once with\n"
        f"    huggingface-cli download {name} {' '.join(files)}\n"
        f"(it then lives in the HF cache, ~/.cache/huggingface, and works offline), or pass a "
        f"local directory that holds those files. For an offline smoke test use the tiny "
        f"random checkpoint shipped in weights/tiny-random (its audio is noise).")


def resolve_codec_dir(model_dir: Path) -> Path:
    """The Higgs audio tokenizer: `<model>/audio_tokenizer`, else the hub's standalone copy."""
    sub = Path(model_dir) / "audio_tokenizer"
    if sub.is_dir():
        return sub
    return resolve_model_dir(HUB_CODEC_REPO, CODEC_FILES)


# ---------------------------------------------------------------------------------------------
# 2. Reading safetensors
# ---------------------------------------------------------------------------------------------

# safetensors dtype -> (numpy dtype as stored, itemsize)
_DTYPES = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 is the top half of a float32: widen by shifting the bits up."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors file as numpy (float tensors as float32).

    F32 and integer tensors are read-only views into a memory map of the file.
    Raises WeightsError (naming file and key) for anything malformed.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise WeightsError(f"{path}: truncated: {size} bytes, not even a safetensors header")
            n = int.from_bytes(head, "little")
            if n < 2 or n > _MAX_HEADER or 8 + n > size:
                raise WeightsError(f"{path}: header length {n} is impossible for a file of "
                                   f"{size} bytes: the file is truncated or not safetensors")
            header_bytes = f.read(n)
    except FileNotFoundError:
        raise WeightsError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise WeightsError(f"{path}: is a directory, expected a .safetensors file") from None
    except OSError as exc:
        raise WeightsError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WeightsError(f"{path}: header is not valid JSON: the file is corrupt or not safetensors") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: header is not a JSON object")

    data_start = 8 + n
    data_size = size - data_start
    header.pop("__metadata__", None)
    spans = []
    for key, info in header.items():
        where = f"{path}: tensor {key!r}"
        if not isinstance(info, dict) or set(info) - {"dtype", "shape", "data_offsets"}:
            raise WeightsError(f"{where}: malformed header entry")
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise WeightsError(f"{where}: unsupported dtype {info.get('dtype')!r}")
        shape, offs = info.get("shape"), info.get("data_offsets")
        if (not isinstance(shape, list) or len(shape) > 8
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape)):
            raise WeightsError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise WeightsError(f"{where}: bad data_offsets {offs!r}")
        begin, end = offs
        nbytes = math.prod(shape) * dtype.itemsize
        if not 0 <= begin <= end <= data_size:
            raise WeightsError(f"{where}: data_offsets {offs} fall outside the {data_size} data "
                               "bytes of the file (truncated download?)")
        if end - begin != nbytes:
            raise WeightsError(f"{where}: data_offsets span {end - begin} bytes but shape {shape} "
                               f"of {info['dtype']} needs {nbytes}")
        spans.append((begin, end, key, dtype, tuple(shape)))

    spans.sort()
    for (b0, e0, k0, *_), (b1, e1, k1, *_) in zip(spans, spans[1:]):
        if b1 < e0:
            raise WeightsError(f"{path}: tensors {k0!r} and {k1!r} overlap in the file")

    if not spans:
        return {}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, np.ndarray] = {}
    for begin, end, key, dtype, shape in spans:
        offset = data_start + begin
        count = (end - begin) // dtype.itemsize
        if offset % dtype.itemsize:  # unaligned data: copy rather than hand out a slow view
            arr = np.frombuffer(mm[offset:offset + end - begin].tobytes(), dtype=dtype, count=count)
        else:
            arr = np.ndarray((count,), dtype=dtype, buffer=mm, offset=offset)
        arr = arr.reshape(shape)
        kind = [k for k, v in _DTYPES.items() if v == dtype][0]
        if kind == "BF16":
            arr = _bf16_to_f32(arr)
        elif kind in ("F16", "F64"):
            arr = arr.astype(np.float32)
        elif dtype.byteorder == ">":  # pragma: no cover - only on big-endian hosts
            arr = arr.astype(dtype.newbyteorder("="))
        out[key] = arr
    return out


# ---------------------------------------------------------------------------------------------
# 3. Handing tensors to the stages
# ---------------------------------------------------------------------------------------------


class ParamReader:
    """Take tensors by exact checkpoint key, with shape checks and an all-keys-used audit.

    `take` is the only way model code gets a tensor, so a renamed, missing or mis-shaped
    tensor always surfaces as a WeightsError naming the file and key. `finish` then checks
    that nothing in the file was silently ignored (a sign of a mismatched config).
    """

    def __init__(self, tensors: dict[str, np.ndarray], file: str | os.PathLike = "<memory>"):
        self.tensors = tensors
        self.file = str(file)
        self.used: set[str] = set()
        self.skipped: set[str] = set()

    @classmethod
    def open(cls, path: str | os.PathLike) -> "ParamReader":
        return cls(read_safetensors(path), path)

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def take(self, key: str, shape: tuple[int, ...] | None = None, dtype=None) -> np.ndarray:
        """The tensor stored under `key`, checked against `shape` (None entries match any size)."""
        arr = self.tensors.get(key)
        if arr is None:
            raise WeightsError(f"{self.file}: missing tensor {key!r}; the file does not match "
                               "this model's config (wrong or truncated checkpoint?)")
        if shape is not None:
            ok = len(shape) == arr.ndim and all(s is None or s == a for s, a in zip(shape, arr.shape))
            if not ok:
                raise WeightsError(f"{self.file}: tensor {key!r} has shape {list(arr.shape)}, "
                                   f"the config implies {list(shape)}: checkpoint and config.json "
                                   "do not belong together")
        if dtype is not None:
            if np.dtype(dtype).kind != arr.dtype.kind:
                raise WeightsError(f"{self.file}: tensor {key!r} has dtype {arr.dtype}, expected {np.dtype(dtype)}")
            arr = arr.astype(dtype, copy=False)
        self.used.add(key)
        return arr

    def skip(self, prefix: str) -> None:
        """Mark every key under `prefix` as deliberately unused (e.g. the codec's encoder half
        when only decoding) so that `finish` accepts them."""
        self.skipped.update(k for k in self.tensors if k.startswith(prefix))

    def finish(self) -> None:
        unused = sorted(set(self.tensors) - self.used - self.skipped)
        if unused:
            shown = ", ".join(repr(k) for k in unused[:5])
            more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
            raise WeightsError(f"{self.file}: {len(unused)} tensor(s) not used by the model: "
                               f"{shown}{more}; the checkpoint does not match its config.json")
