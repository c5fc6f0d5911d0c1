"""Read torch's zip checkpoint format without torch, and without running the pickle inside.

What `torch.save(obj, "name.pt")` writes (torch >= 1.6; checked on 2.13) is an uncompressed zip
whose entries all sit under one top folder, the file name's stem (any name is accepted here):

    name/data.pkl               `obj` pickled with protocol 2; every tensor storage in it is a
                                persistent id (below) instead of its bytes
    name/byteorder              b"little" or b"big" (absent in old files: little)
    name/data/<key>             the raw bytes of one storage, in that byte order
    name/version                b"3\\n" (also name/.data/version); accepted: 1 .. 10
    name/.format_version, name/.storage_alignment, name/.data/serialization_id   (ignored)

A tensor is pickled as REDUCE(torch._utils._rebuild_tensor_v2, (storage, storage_offset, size,
stride, requires_grad, backward_hooks[, metadata])), and `storage` as the persistent id
('storage', torch.<Type>Storage, key, location, numel): numel elements of that type in
name/data/<key>. A tensor that is a view (a slice) keeps the whole storage, with its offset and
strides in elements.

Safety rule: unpickling calls whatever callables the pickle names, so a pickle from anyone is
code from anyone. Here nothing is imported and only these names resolve, to functions of this
module: torch._utils._rebuild_tensor_v2 / _rebuild_tensor (-> a numpy copy of the view),
torch.<Type>Storage / torch.UntypedStorage (markers usable only inside a persistent id) and
collections.OrderedDict (a state dict's BUILD sets only its `_metadata`, dropped here),
_codecs.encode(str, 'latin1') (protocol 2's bytes). Any
other global, any opcode that builds or calls other objects (INST, OBJ, NEWOBJ, EXT*,
out-of-band buffers; BUILD on anything but an OrderedDict), a persistent id of another shape,
a missing entry or a layout that does not fit its storage raises `error`. Memory is bounded
before it is spent: the file's size, the declared uncompressed size of every entry read (zip
bombs), each storage and each tensor copy all count against `max_bytes`. The pure-Python
unpickler is used because the C one allocates its memo table up to the largest index a
PUT opcode names.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import pickletools
import re
import stat
import zipfile
from collections import OrderedDict

import numpy as np

from ..errors import OmniCoreError, VoicePromptError

# torch storage classes -> element type (little-endian; byteorder b"big" swaps them).
_STORAGE_DTYPES = {
    "DoubleStorage": "<f8", "FloatStorage": "<f4", "HalfStorage": "<f2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "<i1",
    "ByteStorage": "|u1", "BoolStorage": "|b1", "UntypedStorage": "|u1",
    "ComplexFloatStorage": "<c8", "ComplexDoubleStorage": "<c16",
}

# Opcodes that make primitives and containers, use the memo, or reach the hooks checked here
# (find_class for GLOBAL/STACK_GLOBAL, persistent_load for PERSID/BINPERSID, load_build for
# BUILD). REDUCE can only call what find_class returned. Everything else (INST, OBJ, NEWOBJ,
# NEWOBJ_EX, EXT1/2/4, BYTEARRAY8, NEXT_BUFFER, READONLY_BUFFER) is refused before unpickling
# starts.
_ALLOWED_OPCODES = frozenset("""
    PROTO FRAME STOP MARK POP POP_MARK DUP
    NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT
    STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8
    BINBYTES SHORT_BINBYTES BINBYTES8
    EMPTY_LIST APPEND APPENDS LIST EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3
    EMPTY_DICT DICT SETITEM SETITEMS EMPTY_SET ADDITEMS FROZENSET
    GET BINGET LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE
    GLOBAL STACK_GLOBAL REDUCE PERSID BINPERSID BUILD
""".split())

# The first bytes of a zip (local file header) and of a pre-1.6 torch file (pickle protocol 2
# followed by torch's 10-byte magic number as a LONG1).
_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_MAX_NDIM = 64  # torch's own limit on tensor dimensions


def is_torch_file(path: str | os.PathLike) -> bool:
    """True when `path` holds a torch.save file: a zip whose first entry is <folder>/data.pkl
    (torch writes it first), or a pre-1.6 torch file. By content, not by name: an .npz prompt
    saved as voice.pt is not one. Reads at most the first local header; an unreadable path
    gives False."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(30 + 0xFFFF)
    except (OSError, ValueError, TypeError):
        return False
    if head.startswith(_LEGACY_MAGIC):
        return True
    if not head.startswith(_ZIP_MAGIC) or len(head) < 30:
        return False
    name_len = int.from_bytes(head[26:28], "little")  # [30 + name_len] header bytes, then data
    return head[30:30 + name_len].endswith(b"/data.pkl")


def load(path: str | os.PathLike, max_bytes: int,
         error: type[OmniCoreError] = VoicePromptError) -> object:
    """The object `torch.save` stored in `path`, with every tensor as a numpy array (a C-order
    copy of the tensor's view; requires_grad and hooks dropped). Refuses, with `error`, anything
    outside the safety rule of the module docstring or over `max_bytes` in all."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except (OSError, ValueError, TypeError) as exc:
        raise error(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from None
    if not stat.S_ISREG(st.st_mode):  # reading a FIFO or device would block or never end
        raise error(f"{path}: not a regular file")
    size = st.st_size
    if size > max_bytes:
        raise error(f"{path}: the file is {size:,} bytes; the limit for this kind of file is "
                    f"{max_bytes:,}")
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc})") from None
    if len(data) > max_bytes:  # it grew after the stat
        raise error(f"{path}: the file is over the {max_bytes:,}-byte limit for this kind of file")
    if data.startswith(_LEGACY_MAGIC):
        raise error(f"{path}: a torch file in the pre-1.6 format, which is not read here; load "
                    "it with torch and save it again (torch.save writes the zip format)")
    try:
        return _Reader(data, max_bytes, str(path), error).load()
    except OmniCoreError:
        raise
    except Exception as exc:  # zip, pickle and struct errors of an untrusted file alike
        raise error(f"{path}: not a readable torch file ({type(exc).__name__}: {exc})") from None


class _Budget:
    """Bytes a file may make us hold, counted before each allocation."""

    def __init__(self, limit: int, what: str, error):
        self.left, self.limit, self.what, self.error = limit, limit, what, error

    def check(self, nbytes: int, item: str) -> None:
        if nbytes > self.left:
            raise self.error(f"{self.what}: {item} needs {nbytes:,} bytes, over the "
                             f"{self.limit:,}-byte limit for this file (damaged or hostile)")

    def charge(self, nbytes: int, item: str) -> None:
        self.check(nbytes, item)
        self.left -= nbytes


class _StorageType:
    """What `torch.<Name>Storage` resolves to: usable only inside a persistent id."""

    def __init__(self, name: str):
        self.name, self.dtype = name, np.dtype(_STORAGE_DTYPES[name])


class _Storage:
    def __init__(self, array: np.ndarray, name: str):
        self.array, self.name = array, name  # [numel] native byte order


class _Reader:
    def __init__(self, data: bytes, max_bytes: int, what: str, error):
        self.what, self.error = what, error
        self.budget = _Budget(max_bytes, what, error)
        self.zip = zipfile.ZipFile(io.BytesIO(data))
        names = self.zip.namelist()
        if len(set(names)) != len(names):
            self.fail("the zip has two entries with the same name")
        pkl = [n for n in names if re.fullmatch(r"[^/]+/data\.pkl", n)]
        if len(pkl) != 1:
            self.fail("no <folder>/data.pkl entry (not written by torch.save)" if not pkl else
                      "more than one <folder>/data.pkl entry")
        self.prefix = pkl[0][:-len("data.pkl")]
        self.storages: dict[str, _Storage] = {}

    def fail(self, why: str):
        raise self.error(f"{self.what}: {why}")

    def entry(self, name: str, required: bool = True, size: int | None = None) -> bytes | None:
        """The bytes of entry prefix+name, its declared size checked (equal to `size` when
        given) and charged before reading."""
        try:
            info = self.zip.getinfo(self.prefix + name)
        except KeyError:
            if required:
                self.fail(f"the entry {self.prefix + name} is missing")
            return None
        if size is not None and info.file_size != size:
            self.fail(f"{info.filename} holds {info.file_size:,} bytes; the pickle says "
                      f"{size:,}")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            self.fail(f"{info.filename} uses zip compression method {info.compress_type}; "
                      "torch writes stored (uncompressed) entries")
        self.budget.charge(info.file_size, f"entry {info.filename}")
        with self.zip.open(info) as fh:
            raw = fh.read(info.file_size + 1)  # zipfile stops at the declared size
        if len(raw) != info.file_size:
            self.fail(f"{info.filename} holds {len(raw):,} bytes, its header says "
                      f"{info.file_size:,}")
        return raw

    def load(self) -> object:
        version = self.entry("version", required=False) or self.entry(".data/version")
        if not re.fullmatch(rb"\s*([1-9]|10)\s*", version):
            self.fail(f"torch file format version {version[:20]!r}; this reader knows 1 to 10")
        order = (self.entry("byteorder", required=False) or b"little").strip()
        if order not in (b"little", b"big"):
            self.fail(f"byteorder {order[:20]!r} (expected b'little' or b'big')")
        self.big_endian = order == b"big"
        pkl = self.entry("data.pkl")
        for op, _, pos in pickletools.genops(pkl):
            if op.name not in _ALLOWED_OPCODES:
                self.fail(f"data.pkl uses the pickle opcode {op.name} at byte {pos}, which builds "
                          "arbitrary objects; refused")
        return _Unpickler(self, pkl).load()

    def storage(self, pid) -> _Storage:
        """The storage a persistent id names: ('storage', type, key, location, numel)."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            self.fail(f"unknown persistent id {_short(pid)} in data.pkl (only torch storages "
                      "are read)")
        _, stype, key, location, numel = pid
        if not isinstance(stype, _StorageType):
            self.fail(f"persistent id {_short(pid)}: {_short(stype)} is not a storage type")
        if not (isinstance(key, str) and re.fullmatch(r"[0-9]{1,9}", key)):
            self.fail(f"persistent id {_short(pid)}: storage key {_short(key)} is not a number")
        if not isinstance(location, str) or type(numel) is not int or numel < 0:
            self.fail(f"persistent id {_short(pid)}: bad location or element count")
        if key in self.storages:
            got = self.storages[key]
            if got.array.dtype != stype.dtype.newbyteorder("=") or got.array.size != numel:
                self.fail(f"storage {key} is named twice with different types or sizes")
            return got
        nbytes = numel * stype.dtype.itemsize
        self.budget.check(nbytes, f"storage {key} ({numel:,} x {stype.name})")
        raw = self.entry(f"data/{key}", size=nbytes)  # charged there
        dtype = stype.dtype.newbyteorder(">") if self.big_endian else stype.dtype
        if dtype.kind == "b":
            arr = np.frombuffer(raw, np.uint8) != 0  # any non-zero byte is True, as in torch
        else:
            arr = np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="), copy=False)
        self.storages[key] = _Storage(arr, stype.name)
        return self.storages[key]

    def rebuild_tensor(self, storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None) -> np.ndarray:
        """torch._utils._rebuild_tensor_v2: the view (offset, size, stride in elements) of
        `storage`, checked to lie inside it, copied out."""
        if not isinstance(storage, _Storage):
            self.fail(f"a tensor's storage is {_short(storage)}, not a storage")
        if not all(isinstance(t, tuple) and len(t) <= _MAX_NDIM
                   and all(type(v) is int and v >= 0 for v in t) for t in (size, stride)) \
                or len(size) != len(stride) or type(storage_offset) is not int \
                or storage_offset < 0 or not isinstance(requires_grad, bool):
            self.fail(f"tensor layout offset={_short(storage_offset)} size={_short(size)} "
                      f"stride={_short(stride)} is not a valid layout")
        if backward_hooks or (metadata is not None and not isinstance(metadata, dict)):
            self.fail("a tensor carries backward hooks or odd metadata; refused")
        arr = storage.array
        numel = math.prod(size)
        self.budget.charge(numel * arr.itemsize, f"a tensor of shape {list(size)}")
        if numel == 0:
            return np.zeros(size, arr.dtype)
        last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= arr.size:
            self.fail(f"a tensor of shape {list(size)}, strides {list(stride)}, offset "
                      f"{storage_offset} reaches element {last:,} of a {arr.size:,}-element "
                      "storage")
        view = np.lib.stride_tricks.as_strided(
            arr[storage_offset:], shape=size, strides=[s * arr.itemsize for s in stride],
            writeable=False)
        return np.array(view, order="C")

    def rebuild_tensor_v1(self, storage, storage_offset, size, stride) -> np.ndarray:
        return self.rebuild_tensor(storage, storage_offset, size, stride)


def _ordered_dict(*args) -> dict:
    """collections.OrderedDict(): torch pickles a tensor's (empty) hooks this way; state dicts
    are OrderedDicts of tensors. Only a list of (key, value) pairs is taken."""
    if not args:
        return OrderedDict()
    if len(args) != 1 or not isinstance(args[0], (list, tuple)) \
            or not all(isinstance(p, tuple) and len(p) == 2 for p in args[0]):
        raise pickle.UnpicklingError("OrderedDict called with something other than pairs")
    return OrderedDict(args[0])


def _latin1_bytes(text, encoding) -> bytes:
    """_codecs.encode(text, 'latin1'): how protocol 2 pickles a bytes object."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is only taken as (str, 'latin1')")
    return text.encode("latin1")


class _Unpickler(pickle._Unpickler):  # the pure-Python one: its memo is a dict
    def __init__(self, reader: _Reader, data: bytes):
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.reader = reader

    def find_class(self, module: str, name: str):
        allowed = {
            ("torch._utils", "_rebuild_tensor_v2"): self.reader.rebuild_tensor,
            ("torch._utils", "_rebuild_tensor"): self.reader.rebuild_tensor_v1,
            ("collections", "OrderedDict"): _ordered_dict,
            ("_codecs", "encode"): _latin1_bytes,
        }
        if (module, name) in allowed:
            return allowed[module, name]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if module == "torch" and name == "BFloat16Storage":
            self.reader.fail("it holds a bfloat16 tensor, which is not read here (numpy has no "
                             "bfloat16)")
        self.reader.fail(f"data.pkl names the global {module[:60]}.{name[:60]}; only "
                         "torch tensors, storages and plain containers are read, so it was "
                         "refused without being imported or called")

    def persistent_load(self, pid):
        return self.reader.storage(pid)

    def load_build(self):
        # A state dict is an OrderedDict with a `_metadata` attribute, set by BUILD; that is the
        # one BUILD taken (its state dropped). On anything else BUILD would set attributes of
        # this reader's own objects.
        state = self.stack.pop()
        if not (type(self.stack[-1]) is OrderedDict and isinstance(state, dict)):
            self.reader.fail(f"data.pkl sets the state of a {type(self.stack[-1]).__name__} "
                             "(pickle BUILD); only an OrderedDict's is accepted")

    dispatch = dict(pickle._Unpickler.dispatch)
    dispatch[pickle.BUILD[0]] = load_build


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------------------------
# The reference's voice prompt files
# ---------------------------------------------------------------------------------------------

# `omnivoice` 0.2.1's VoiceClonePrompt.save stores torch.save({"format_version": 1,
# "ref_audio_tokens": int64 tensor [C, R], "ref_text": str, "ref_rms": float}). 60 s of codes
# are 96 KB; a saved slice keeps its whole storage, so allow a few minutes' worth.
REFERENCE_PROMPT_VERSION = 1
MAX_REFERENCE_PROMPT_BYTES = 4 << 20


def read_reference_voice_prompt(path: str | os.PathLike) -> tuple[np.ndarray, object, object]:
    """(ref_audio_tokens, ref_text, ref_rms) of a prompt the reference saved, values as stored:
    the caller validates them. VoicePromptError when the file is not such a prompt."""
    try:
        obj = load(path, MAX_REFERENCE_PROMPT_BYTES, VoicePromptError)
    except VoicePromptError as exc:
        raise VoicePromptError(
            f"{exc}. Not a usable voice prompt: re-create it from the audio (`omnicore "
            "clone-prompt ref.wav --ref-text '...' -o voice.npz`, or omnivoice's "
            "VoiceClonePrompt.save)") from None
    if not isinstance(obj, dict):
        raise VoicePromptError(f"{path}: a torch file holding a {type(obj).__name__}, not a "
                               "voice prompt saved by omnivoice's VoiceClonePrompt.save")
    missing = [k for k in ("ref_audio_tokens", "ref_text", "ref_rms") if k not in obj]
    if missing:
        raise VoicePromptError(f"{path}: a torch file without {', '.join(missing)}; not a voice "
                               "prompt saved by omnivoice's VoiceClonePrompt.save")
    if obj.get("format_version") != REFERENCE_PROMPT_VERSION:
        raise VoicePromptError(
            f"{path}: omnivoice voice prompt format_version {_short(obj.get('format_version'))} "
            f"is not supported (this omnicore reads version {REFERENCE_PROMPT_VERSION})")
    tokens = obj["ref_audio_tokens"]
    if not isinstance(tokens, np.ndarray):
        raise VoicePromptError(f"{path}: ref_audio_tokens is a {type(tokens).__name__}, not a "
                               "tensor")
    return tokens, obj["ref_text"], obj["ref_rms"]
