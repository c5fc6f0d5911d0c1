"""Finding a checkpoint and reading its files safely: what the model is handed.

The model reads no file itself. It takes tensors by exact key through a `ParamReader`
(model/weights.py: shapes, all-finite and every-key-used checks), configs as dicts and the
tokenizer as JSON text. This module gets them from disk or the hub, hardened against what a
file system can hold:

1. `resolve_model_dir`: a local directory, or a hub repo id fetched (and cached) through
   huggingface_hub with only the files omnicore needs. No network -> ModelNotFoundError that
   says what to download and how, after at most a few seconds.
2. `open_regular` / `read_regular`: only regular files are opened (a FIFO would hang the loader,
   a device never end).
3. `SafetensorsFile`: our own parser of the safetensors format (8-byte little-endian header
   length, a JSON header, then raw little-endian tensor bytes). Every header field is checked
   before any byte is trusted, so a truncated or hostile file fails with a WeightsError that
   names the file and the key instead of a crash deep inside numpy. Tensors are read with
   positioned reads into aligned arrays owned by the process, never memory-mapped: a mapped
   checkpoint truncated or overwritten in place while a model runs kills the process with
   SIGBUS, a short read is a WeightsError. The one table too large to copy (the 151676 x 1024
   text embedding, of which a prompt uses a few hundred rows) is a `RowTable` read row by row
   on use. BF16/F16/F64 tensors are converted to float32 once, here.
4. The parts of a checkpoint: `read_json` / `read_config` (config.json), `load_tokenizer`,
   `open_params` (a ParamReader on a SafetensorsFile), `load_codec` and `load_codec_encoder`.
5. `fingerprint`: a short, stable name for the weights in a folder, read from a few KB of it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import stat
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import ConfigError, ModelNotFoundError, OmniCoreError, WeightsError
from ..model import higgs_codec
from ..model.config import HiggsAudioV2TokenizerConfig, OmniVoiceConfig
from ..model.kernels import all_finite
from ..model.tokenizer import TextTokenizer
from ..model.weights import ParamReader

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

    An existing directory is used as it is, and anything shaped like a path (starting with
    `.`, `/` or `~`, or with more than one `/`) is one: missing, it is "no such directory".
    Only an `owner/name` is taken as a hub repo id: the local HF cache is tried first (so
    HF_HUB_OFFLINE=1 and machines without network work once the files are cached), then a
    download of just `files`.
    """
    name = str(name_or_path)
    if not name.strip():
        raise ModelNotFoundError(f"the model is empty: give a checkpoint directory or a hub "
                                 f"repo id such as '{HUB_REPO}'")
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelNotFoundError(f"{name}: expected a checkpoint directory, found a file")
    if name.count("/") != 1 or name.startswith((".", "/", "~")) or name.endswith("/"):
        raise ModelNotFoundError(
            f"{name}: no such directory (relative to {os.getcwd()}), and not a hub repo id of "
            f"the form 'owner/name' (the OmniVoice checkpoint is '{HUB_REPO}')")
    checkout = Path(__file__).resolve().parents[2]  # a source checkout's root, when it is one
    if (checkout / name).is_dir():  # e.g. weights/tiny-random, run from another folder
        raise ModelNotFoundError(
            f"{name}: no such directory relative to {os.getcwd()}; omnicore's repository has "
            f"it at {checkout / name} (a relative path counts from where you run)")
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
    tiny = checkout / "weights" / "tiny-random"
    raise ModelNotFoundError(
        f"'{name}' is no folder in {os.getcwd()}, and the Hugging Face hub did not give it "
        f"({reason}).\n"
        f"If it is a hub repo: on a machine with network access, download it once with "
        f"huggingface_hub's command\n"
        f"    hf download {name} {' '.join(files)}\n"
        f"(it then lives in the HF cache, ~/.cache/huggingface, and works offline). If it is a "
        f"folder, give its path from here (or an absolute one). For an offline smoke test use "
        f"the tiny random checkpoint (its audio is noise): "
        + (str(tiny) if tiny.is_dir() else "weights/tiny-random in omnicore's repository") + ".")


def resolve_codec_dir(model_dir: Path) -> Path:
    """The Higgs audio tokenizer: `<model>/audio_tokenizer`, else the hub's standalone copy."""
    sub = Path(model_dir) / "audio_tokenizer"
    if sub.is_dir():
        return sub
    return resolve_model_dir(HUB_CODEC_REPO, CODEC_FILES)


# ---------------------------------------------------------------------------------------------
# 2. Reading files safely
# ---------------------------------------------------------------------------------------------


def open_regular(path: str | os.PathLike, error: type[OmniCoreError] = WeightsError) -> int:
    """Open `path` read-only and return the descriptor; anything but a regular file is refused.

    Reading a FIFO blocks until some writer appears and a device may never end, so both are
    refused by type before any read (and checked again on the opened descriptor, in case the
    path was swapped in between; O_NONBLOCK keeps even that open from waiting on a FIFO).
    """
    path = Path(path)
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{path}: is a directory, expected a file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "special")
        raise error(f"{path}: not a regular file ({kind}); reading it could block forever. "
                    "Point to the real file (a symlink to a regular file is fine)")
    return fd


def read_regular(path: str | os.PathLike, max_bytes: int, error: type[OmniCoreError],
                 open_error: type[OmniCoreError] | None = None) -> bytes:
    """At most `max_bytes + 1` bytes of a regular file (one more than allowed, so the caller can
    tell a file over its limit); opening is `open_regular`'s (FIFOs and devices refused)."""
    fd = open_regular(path, open_error or error)
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None


# ---------------------------------------------------------------------------------------------
# 3. Safetensors
# ---------------------------------------------------------------------------------------------

# safetensors dtype -> numpy dtype as stored
_DTYPES = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_FLOAT_KINDS = ("F32", "F16", "BF16", "F64")  # handed out as float32
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header
_ALIGN = 64  # bytes: a cache line, and the widest SIMD load BLAS and Numba issue
_MAX_READ = 1 << 30  # bytes per read call (Linux caps one read near 2 GiB)


def _aligned_empty(n: int, dtype) -> np.ndarray:
    """A fresh 1-D array of `n` items whose data starts on an _ALIGN-byte boundary."""
    dtype = np.dtype(dtype)
    buf = np.empty(n * dtype.itemsize + _ALIGN, np.uint8)
    start = -buf.ctypes.data % _ALIGN
    return buf[start:start + n * dtype.itemsize].view(dtype)


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in a safetensors file, from its checked header entry."""

    kind: str  # the safetensors dtype, e.g. "F32"
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


class SafetensorsFile(Mapping):
    """An open safetensors file: the header parsed and checked, tensors read on request.

    A mapping from key to tensor: `f[key]` reads that tensor from disk into a fresh 64-byte
    aligned array owned by this process (float dtypes as float32), read-only. Nothing is ever
    memory-mapped: a mapped file that is truncated or rewritten in place while a model uses it
    kills the process with SIGBUS at the next access, whereas a read just comes up short.

    The descriptor stays open so that rows of a table too large to copy can be read later
    (`read_rows`). After every read the file's size and mtime are compared with those at open:
    a file truncated or rewritten in place is a WeightsError ("reload the model"), never a
    silent mix of old and new weights. A file renamed over this one changes nothing: the open
    descriptor keeps reading the old contents.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd = open_regular(self.path, WeightsError)
        self._closer = weakref.finalize(self, os.close, self._fd)
        self._lock = threading.Lock()  # only for the seek + read fallback without os.preadv
        st = os.fstat(self._fd)
        self.stamp = (st.st_size, st.st_mtime_ns)  # what says it is still the same file
        try:
            self.entries = self._parse_header(st.st_size)
        except BaseException:
            self.close()
            raise

    # -- Mapping -------------------------------------------------------------------------------

    def __getitem__(self, key: str) -> np.ndarray:
        return self.read(key)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key) -> bool:
        return key in self.entries

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closer()
        self._fd = -1  # later reads fail (EBADF) instead of reading whatever reuses the number

    # -- header --------------------------------------------------------------------------------

    def _parse_header(self, size: int) -> dict[str, TensorInfo]:
        path = self.path
        if size < 8:
            raise WeightsError(f"{path}: truncated: {size} bytes, not even a safetensors header")
        n = int.from_bytes(self._read_exact(8, 0, what="the header length"), "little")
        if n < 2 or n > _MAX_HEADER or 8 + n > size:
            raise WeightsError(f"{path}: header length {n} is impossible for a file of "
                               f"{size} bytes: the file is truncated or not safetensors")
        header_bytes = self._read_exact(n, 8, what="the header")
        try:
            header = json.loads(header_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise WeightsError(f"{path}: header is not valid JSON: the file is corrupt or not safetensors") from None
        except RecursionError:  # e.g. "[[[[...]]]]" 100,000 deep: no real header nests past 3
            raise WeightsError(f"{path}: header nests JSON too deeply: the file is corrupt or hostile") from None
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
            kind = info.get("dtype")
            dtype = _DTYPES.get(kind) if isinstance(kind, str) else None
            if dtype is None:
                raise WeightsError(f"{where}: unsupported dtype {kind!r}")
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
                                   f"of {kind} needs {nbytes}")
            spans.append((begin, end, key, kind, tuple(shape)))

        spans.sort()
        for (b0, e0, k0, *_), (b1, e1, k1, *_) in zip(spans, spans[1:]):
            if b1 < e0:
                raise WeightsError(f"{path}: tensors {k0!r} and {k1!r} overlap in the file")
        return {key: TensorInfo(kind, shape, data_start + begin, end - begin)
                for begin, end, key, kind, shape in spans}

    # -- reading -------------------------------------------------------------------------------

    def _changed(self, detail: str) -> WeightsError:
        return WeightsError(
            f"{self.path}: the checkpoint file changed on disk after it was opened ({detail}); "
            "reload the model. To update a checkpoint in use, write the new file elsewhere and "
            "rename it over the old one instead of truncating or copying into it")

    def _check_unchanged(self) -> None:
        st = os.fstat(self._fd)
        if (st.st_size, st.st_mtime_ns) != self.stamp:
            raise self._changed(f"size {self.stamp[0]} -> {st.st_size} bytes" if st.st_size != self.stamp[0]
                                else "rewritten in place")

    def _read_into(self, out: np.ndarray, offset: int, check: bool = True) -> None:
        """Fill the contiguous array `out` with the file's bytes from `offset`: no extra copy.
        Then (unless `check` is false: the caller checks once after many reads) make sure the
        file has not changed since it was opened."""
        mv = memoryview(out).cast("B")
        done = 0
        while done < len(mv):
            chunk = mv[done:done + _MAX_READ]
            if hasattr(os, "preadv"):
                got = os.preadv(self._fd, [chunk], offset + done)
            else:  # pragma: no cover - platforms without preadv (Windows)
                with self._lock, io.FileIO(self._fd, "rb", closefd=False) as raw:
                    raw.seek(offset + done)
                    got = raw.readinto(chunk) or 0
            if got <= 0:
                raise self._changed(f"truncated: it ends before byte {offset + len(mv)}")
            done += got
        if check:
            self._check_unchanged()

    def _read_exact(self, n: int, offset: int, what: str) -> bytes:
        buf = bytearray(n)
        view = np.frombuffer(buf, np.uint8)
        try:
            self._read_into(view, offset)
        except OSError as exc:
            raise WeightsError(f"{self.path}: cannot read {what} ({exc.strerror or exc})") from None
        return bytes(buf)

    def _as_float32(self, raw: np.ndarray, kind: str) -> np.ndarray:
        if kind == "BF16":  # bfloat16 is the top half of a float32: widen by shifting the bits up
            out = _aligned_empty(raw.size, np.uint32)
            out[...] = raw
            out <<= 16
            return out.view(np.float32)
        out = _aligned_empty(raw.size, np.float32)
        out[...] = raw
        return out

    def read(self, key: str) -> np.ndarray:
        """The whole tensor `key`, read now (float dtypes widened to float32), read-only."""
        info = self.entries[key]
        raw = _aligned_empty(info.nbytes // _DTYPES[info.kind].itemsize, _DTYPES[info.kind])
        try:
            self._read_into(raw, info.offset)
        except OSError as exc:
            raise WeightsError(f"{self.path}: cannot read tensor {key!r} ({exc.strerror or exc})") from None
        if info.kind in ("BF16", "F16", "F64"):
            raw = self._as_float32(raw, info.kind)
        elif raw.dtype.byteorder == ">":  # pragma: no cover - only on big-endian hosts
            raw = raw.astype(raw.dtype.newbyteorder("="))
        arr = raw.reshape(info.shape)
        arr.flags.writeable = False
        return arr

    def read_rows(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` (int [n], each in range) of the tensor `key`, as float32 [n, *row shape]."""
        info = self.entries[key]
        item = _DTYPES[info.kind]
        row_items = math.prod(info.shape[1:])
        unique, where = np.unique(rows, return_inverse=True)
        raw = _aligned_empty(unique.size * row_items, item).reshape(unique.size, row_items)
        try:
            for i, r in enumerate(unique.tolist()):  # one positioned read per distinct row
                self._read_into(raw[i], info.offset + r * row_items * item.itemsize, check=False)
            self._check_unchanged()
        except OSError as exc:
            raise WeightsError(f"{self.path}: cannot read rows of {key!r} ({exc.strerror or exc})") from None
        if info.kind in _FLOAT_KINDS and info.kind != "F32":
            raw = self._as_float32(raw.reshape(-1), info.kind).reshape(unique.size, row_items)
        return raw[where.reshape(-1)].reshape((rows.size, *info.shape[1:]))

    # -- what ParamReader asks of a checkpoint file --------------------------------------------

    def shape_of(self, key: str) -> tuple[int, ...]:
        """The tensor's shape from the checked header, before any byte of it is read."""
        return self.entries[key].shape

    def row_table(self, key: str) -> "RowTable":
        """The 2-D float tensor `key` left on disk, read by rows when indexed."""
        info = self.entries[key]
        if info.kind not in _FLOAT_KINDS or len(info.shape) < 2:
            raise WeightsError(f"{self.path}: tensor {key!r} is {info.kind} {list(info.shape)}, "
                               "expected a 2-D float table")
        return RowTable(self, key)




class RowTable:
    """A 2-D tensor left on disk and read by rows: `table[ids]` equals `array[ids]` for int ids.

    For the text embedding table (151676 x 1024 float32 = 620 MB, of which a prompt uses a few
    hundred rows): a copy in memory would cost 620 MB of RAM and a full read at load, a memory
    map risks SIGBUS. Each distinct row costs one positioned read (cheap from the page cache;
    benchmarks/README.md) and is checked for NaN/inf as it arrives.
    """

    def __init__(self, file: SafetensorsFile, key: str):
        self.file, self.key = file, key
        info = file.entries[key]
        self.shape = info.shape
        self.ndim = len(info.shape)
        self.dtype = np.dtype(np.float32) if info.kind in _FLOAT_KINDS else _DTYPES[info.kind]

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):  # np.asarray(table): the whole table, read now
        arr = self[np.arange(self.shape[0])]
        return arr if dtype is None else arr.astype(dtype)

    def __getitem__(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise IndexError(f"rows of {self.key!r} are indexed by integers, got dtype {ids.dtype}")
        n = self.shape[0]
        flat = ids.reshape(-1).astype(np.int64)
        flat = np.where(flat < 0, flat + n, flat)  # negative ids count from the end, as in numpy
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise IndexError(f"row id out of range for {self.key!r} with {n} rows")
        rows = self.file.read_rows(self.key, flat)  # [len(flat), *row shape]
        if rows.dtype.kind == "f" and not all_finite(rows):
            bad = int(flat[np.nonzero(~np.isfinite(rows.reshape(flat.size, -1)).all(axis=1))[0][0]])
            raise WeightsError(f"{self.file.path}: row {bad} of tensor {self.key!r} holds NaN or "
                               "infinite values: the checkpoint is corrupt; download it again")
        return rows.reshape(ids.shape + self.shape[1:])


# ---------------------------------------------------------------------------------------------
# 4. The parts of a checkpoint
# ---------------------------------------------------------------------------------------------

# A config file is a few KB; anything far larger is not one (and must not be read whole).
MAX_JSON_BYTES = 64 * 1024 * 1024
# Qwen's tokenizer.json is about 11 MB; a file far larger is not one (and would be read whole).
MAX_TOKENIZER_BYTES = 256 << 20


def read_json(path: str | os.PathLike) -> dict:
    """Read a JSON object from `path`, turning every failure into a ConfigError.

    Only a regular file is opened (a FIFO would block forever, a device never end)."""
    path = Path(path)
    data = read_regular(path, MAX_JSON_BYTES, ConfigError)
    if len(data) > MAX_JSON_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_JSON_BYTES // 2**20} MB; is this really a config.json?")
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; is this really a config.json?") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply to be a config file") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    return obj


def read_config(path: str | os.PathLike, kind=OmniVoiceConfig):
    """`kind` (OmniVoiceConfig, or HiggsAudioV2TokenizerConfig for audio_tokenizer/) from the
    JSON file `path`; ConfigError naming the file and field for anything omnicore cannot run."""
    return kind.from_dict(read_json(path), str(path))


def load_tokenizer(model_dir: str | os.PathLike) -> TextTokenizer:
    """The text tokenizer of the checkpoint in `model_dir` (its tokenizer.json)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        raise ModelNotFoundError(f"{path}: tokenizer.json not found; the checkpoint "
                                 "directory must contain the model's tokenizer.json")
    # Read through the loader's opener: a FIFO or device would block the Rust reader forever.
    raw = read_regular(path, MAX_TOKENIZER_BYTES, WeightsError, ModelNotFoundError)
    if len(raw) > MAX_TOKENIZER_BYTES:
        raise WeightsError(f"{path}: over {MAX_TOKENIZER_BYTES >> 20} MB, not a tokenizer.json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WeightsError(f"{path}: cannot load the tokenizer (not UTF-8 text)") from None
    return TextTokenizer.from_json(text, path)


def open_params(path: str | os.PathLike) -> ParamReader:
    """A ParamReader over the safetensors file `path` (tensors read as they are taken)."""
    return ParamReader(SafetensorsFile(path), path)


def _codec_folder(path: str | os.PathLike) -> Path:
    """An audio tokenizer directory: `path/audio_tokenizer` when there is one, else `path`."""
    path = Path(path)
    sub = path / "audio_tokenizer"
    return sub if sub.is_dir() else path


def load_codec(path: str | os.PathLike, *, encoder: bool = True):
    """(cfg, params) of the codec in an audio tokenizer directory (or a checkpoint directory
    with one in `audio_tokenizer/`): `config.json` and `model.safetensors`, every key checked.

    Every tensor is copied into process memory and the file is closed: nothing stays mapped,
    so the file may change on disk afterwards without harming the loaded codec. encoder=False
    reads the decoder half only (`load_codec_encoder` adds the rest later)."""
    folder = _codec_folder(path)
    cfg = read_config(folder / "config.json", HiggsAudioV2TokenizerConfig)
    with open_params(folder / "model.safetensors") as reader:
        params = higgs_codec.load_params(reader, cfg, encoder=encoder)
        source = reader.tensors.stamp
    return cfg, replace(params, source=source)


def load_codec_encoder(params, cfg, path: str | os.PathLike):
    """`params` with the encoder half loaded from `path` if it is not there yet.

    The file must still be the one the decoder half came from (same size and mtime), or the
    two halves would belong to different checkpoints: otherwise a WeightsError says to reload."""
    if params.encoder is not None:
        return params
    file = _codec_folder(path) / "model.safetensors"
    with open_params(file) as reader:
        if params.source is not None and reader.tensors.stamp != params.source:
            raise WeightsError(f"{file}: the checkpoint file changed on disk since the codec's decoder "
                               "half was loaded from it; reload the model to use the new file")
        return higgs_codec.load_encoder_params(reader, cfg, params)


# ---------------------------------------------------------------------------------------------
# 5. Fingerprints
# ---------------------------------------------------------------------------------------------

FINGERPRINT_HEAD = 64  # bytes of each tensor's data that go into a fingerprint


def fingerprint(folder: str | os.PathLike) -> str:
    """16 hex digits that name the weights in `folder` (a checkpoint's, or its codec's):
    sha256 over its config.json and, for each *.safetensors file, its header (every tensor's
    name, dtype, shape and place) and the first FINGERPRINT_HEAD bytes of every tensor.

    Why not a hash of the whole file: the full checkpoint is 2.45 GB, a minute of reading on a
    small machine. Why not the size and header alone: a random checkpoint in the real layout
    has the real one's header byte for byte. A tensor's first bytes differ between any two
    trainings, fine-tunes or random draws, so a few KB tell them apart; a change that leaves
    the head of every tensor as it was goes unseen. Stable across copies, downloads and
    touches: no mtime, inode or path goes in."""
    folder = Path(folder)
    digest = hashlib.sha256()
    digest.update(read_regular(folder / "config.json", MAX_JSON_BYTES, ConfigError))
    for path in sorted(folder.glob("*.safetensors")):
        with SafetensorsFile(path) as f:
            n = int.from_bytes(f._read_exact(8, 0, what="the header length"), "little")
            digest.update(path.name.encode() + f._read_exact(n, 8, what="the header"))
            for info in sorted(f.entries.values(), key=lambda i: i.offset):
                take = min(info.nbytes, FINGERPRINT_HEAD)
                digest.update(f._read_exact(take, info.offset, what="a tensor's first bytes"))
    return digest.hexdigest()[:16]
