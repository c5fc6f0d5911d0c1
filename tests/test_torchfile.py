"""Voice prompts saved by the reference (`VoiceClonePrompt.save`, a torch .pt zip) load without
torch through `VoiceClonePrompt.load`, and hostile torch files are refused without running
anything.

The fixtures tests/fixtures/reference/voice_*.pt were written by the reference's own save
(tools/reference/dump_voice.py). The hostile files are assembled here opcode by opcode (pickle
protocol 2, as torch writes it) inside zips built byte by byte, so nothing here needs torch.
"""

import os
import pickle
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from omnicore import OmniVoice, VoiceClonePrompt
from omnicore.machinery import torchfile
from omnicore.apps.cli import main
from omnicore.errors import VoicePromptError

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "fixtures" / "reference"
TINY = ROOT / "weights" / "tiny-random"
NAMES = ["full", "short_zh", "slice"]


@pytest.fixture(scope="module")
def expected():
    with np.load(REF / "voice_expected.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


# --- the reference's files ------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_reference_prompt_loads_exactly(expected, name):
    prompt = VoiceClonePrompt.load(REF / f"voice_{name}.pt")
    want = expected[f"{name}_codes"]
    assert prompt.ref_audio_tokens.dtype == np.int64 and prompt.ref_audio_tokens.shape == want.shape
    np.testing.assert_array_equal(prompt.ref_audio_tokens, want)
    assert prompt.ref_text == str(expected[f"{name}_ref_text"])
    assert prompt.ref_rms == float(expected[f"{name}_ref_rms"])  # the same double, not close
    assert prompt.ref_audio_tokens.flags.c_contiguous and prompt.ref_audio_tokens.flags.writeable


def test_reference_fixtures_cover_views_and_text(expected):
    # voice_slice.pt is a view: the file holds the whole storage, offset 5, strides (72, 1)
    assert int(expected["slice_offset"]) == 5
    assert tuple(expected["slice_stride"]) == (expected["full_codes"].shape[1], 1)
    np.testing.assert_array_equal(expected["slice_codes"], expected["full_codes"][:, 5:17])
    assert not str(expected["short_zh_ref_text"]).isascii()
    assert len({expected[f"{n}_codes"].shape[1] for n in NAMES}) == 3
    # the same reference call on the same clip as the generate fixtures
    with np.load(REF / "generate_clone_prompt.npz", allow_pickle=False) as z:
        np.testing.assert_array_equal(expected["full_codes"], z["ref_audio_tokens"])
        assert float(expected["full_ref_rms"]) == float(z["ref_rms"])


def test_reference_file_contents(expected):
    obj = torchfile.load(REF / "voice_full.pt", 1 << 20)
    assert sorted(obj) == ["format_version", "ref_audio_tokens", "ref_rms", "ref_text"]
    assert obj["format_version"] == 1
    np.testing.assert_array_equal(obj["ref_audio_tokens"], expected["full_codes"])
    assert torchfile.is_torch_file(REF / "voice_full.pt")
    assert not torchfile.is_torch_file(REF / "voice_expected.npz")


def test_generation_with_reference_prompt_equals_omnicore_prompt(model, expected):
    loaded = VoiceClonePrompt.load(REF / "voice_full.pt")
    built = VoiceClonePrompt(expected["full_codes"].copy(), str(expected["full_ref_text"]),
                             float(expected["full_ref_rms"]))
    kw = dict(num_step=4, seed=3, duration=1.0)
    a = model.generate_codes("Hello again.", voice_clone_prompt=loaded, **kw)[0]
    b = model.generate_codes("Hello again.", voice_clone_prompt=built, **kw)[0]
    np.testing.assert_array_equal(a, b)
    other = VoiceClonePrompt.load(REF / "voice_short_zh.pt")
    c = model.generate_codes("Hello again.", voice_clone_prompt=other, **kw)[0]
    assert (a != c).any()  # the prompt conditions the result


def test_cli_say_with_reference_pt(tmp_path, expected):
    npz = tmp_path / "same.npz"
    VoiceClonePrompt(expected["short_zh_codes"], str(expected["short_zh_ref_text"]),
                     float(expected["short_zh_ref_rms"])).save(npz)
    fast = ["--model", str(TINY), "--steps", "2", "-q", "--greedy"]
    a, b = tmp_path / "a.wav", tmp_path / "b.wav"
    assert main(["say", "Hi there.", "--voice", str(REF / "voice_short_zh.pt"), "-o", str(a),
                 *fast]) == 0
    assert main(["say", "Hi there.", "--voice", str(npz), "-o", str(b), *fast]) == 0
    wa, sr = sf.read(a, dtype="float32")
    assert sr == 24000 and len(wa) > 0
    np.testing.assert_array_equal(wa, sf.read(b, dtype="float32")[0])


# --- building torch files by hand -------------------------------------------------------------


def _zip(path: Path, entries) -> Path:
    """A zip from (name, bytes as stored, method, crc, uncompressed size) tuples, written byte by
    byte so that sizes and methods can lie."""
    out, central = bytearray(), bytearray()
    for name, payload, method, crc, usize in entries:
        n = name.encode()
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc,
                           len(payload), usize, len(n), 0) + n + payload
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21,
                               crc, len(payload), usize, len(n), 0, 0, 0, 0, 0, offset) + n
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central),
                       len(out), 0)
    path.write_bytes(bytes(out + central + eocd))
    return path


def _stored(name, data: bytes):
    return (name, data, 0, zlib.crc32(data), len(data))


def torch_file(path: Path, pkl: bytes, data: dict | None = None, extra=(),
               byteorder=b"little", version=b"3\n", prefix="archive") -> Path:
    entries = [_stored(f"{prefix}/data.pkl", pkl), _stored(f"{prefix}/byteorder", byteorder)]
    entries += [_stored(f"{prefix}/data/{k}", v) for k, v in (data or {}).items()]
    entries += list(extra) + [_stored(f"{prefix}/version", version)]
    return _zip(path, entries)


# Protocol-2 opcodes, as torch's pickler emits them.
def g(module, name):  # GLOBAL
    return b"c" + f"{module}\n{name}\n".encode()


def s(text):  # BINUNICODE
    b = text.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b


def i(n):  # BININT or LONG1
    if -2**31 <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    b = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(b)]) + b


def f(x):  # BINFLOAT
    return b"G" + struct.pack(">d", x)


def tup(*items):
    return b"(" + b"".join(items) + b"t"


def tensor(key="0", numel=16, offset=0, size=(8, 2), stride=(2, 1), stype="LongStorage",
           pid=None):
    pid = pid if pid is not None else tup(s("storage"), g("torch", stype), s(key), s("cpu"), i(numel))
    return (g("torch._utils", "_rebuild_tensor_v2")
            + tup(pid + b"Q", i(offset), tup(*map(i, size)), tup(*map(i, stride)), b"\x89",
                  g("collections", "OrderedDict") + b")R")
            + b"R")


def prompt_pkl(tokens=None, text="hello", rms=0.05, version=1, extra=b""):
    tokens = tensor() if tokens is None else tokens
    return (b"\x80\x02}(" + s("format_version") + i(version) + s("ref_audio_tokens") + tokens
            + s("ref_text") + s(text) + s("ref_rms") + f(rms) + extra + b"u.")


CODES = (np.arange(16, dtype=np.int64) * 61 % 1024)  # [16]: an [8, 2] prompt


def good_file(path, **kw):
    return torch_file(path, prompt_pkl(**kw), {"0": CODES.tobytes()})


def test_hand_built_file_loads(tmp_path):
    # the builders above make what torch makes (torch.load reads these files to the same values:
    # checked once in the reference environment); omnicore reads them to their values
    p = VoiceClonePrompt.load(good_file(tmp_path / "ok.pt", text="héllo"))
    np.testing.assert_array_equal(p.ref_audio_tokens, CODES.reshape(8, 2))
    assert (p.ref_text, p.ref_rms) == ("héllo", 0.05)
    # a view with an offset and a transposed layout
    pkl = prompt_pkl(tokens=tensor(numel=16, offset=0, size=(8, 2), stride=(1, 8)))
    p = VoiceClonePrompt.load(torch_file(tmp_path / "t.pt", pkl, {"0": CODES.tobytes()}))
    np.testing.assert_array_equal(p.ref_audio_tokens, CODES.reshape(2, 8).T)
    # big-endian files (torch writes byteorder b"big" there) and int32 storages
    p = VoiceClonePrompt.load(torch_file(tmp_path / "be.pt", prompt_pkl(),
                                         {"0": CODES.astype(">i8").tobytes()}, byteorder=b"big"))
    np.testing.assert_array_equal(p.ref_audio_tokens, CODES.reshape(8, 2))
    p = VoiceClonePrompt.load(torch_file(tmp_path / "i4.pt",
                                         prompt_pkl(tokens=tensor(stype="IntStorage")),
                                         {"0": CODES.astype("<i4").tobytes()}))
    assert p.ref_audio_tokens.dtype == np.int64
    np.testing.assert_array_equal(p.ref_audio_tokens, CODES.reshape(8, 2))


# --- hostile files ------------------------------------------------------------------------------


def _payloads(marker: Path) -> dict:
    """name -> (data.pkl bytes, storages, the refusal message). Each would touch `marker` if it
    ran."""
    cmd = s(f"touch {marker}")
    code = s(f"open({str(marker)!r}, 'w').close()")
    storage = {"0": CODES.tobytes()}
    return {
        "os.system": (b"\x80\x02" + g("os", "system") + cmd + b"\x85R.", {}, "global os.system"),
        "posix.system": (b"\x80\x02" + g("posix", "system") + cmd + b"\x85R.", {}, "posix.system"),
        "builtins.eval": (b"\x80\x02" + g("builtins", "eval") + code + b"\x85R.", {},
                          "builtins.eval"),
        "eval in a prompt field": (prompt_pkl(extra=s("x") + g("builtins", "eval") + code
                                              + b"\x85R"), storage, "builtins.eval"),
        # a reduce of os.system nested inside the allowed tensor rebuild's arguments
        "nested reduce": (prompt_pkl(tokens=g("torch._utils", "_rebuild_tensor_v2") + tup(
            g("os", "system") + cmd + b"\x85R", i(0), tup(i(8), i(2)), tup(i(2), i(1)), b"\x89",
            g("collections", "OrderedDict") + b")R") + b"R"), storage, "global os.system"),
        # calling what an allowed callable returned
        "reduce of a result": (b"\x80\x02" + g("collections", "OrderedDict") + b")R" + cmd
                               + b"\x85R.", {}, "not callable"),
        "rebuild of a non-storage": (prompt_pkl(tokens=g("torch._utils", "_rebuild_tensor_v2")
                                                + tup(cmd, i(0), tup(i(8)), tup(i(1)), b"\x89",
                                                      b"}") + b"R"), storage, "not a storage"),
        "INST": (b"\x80\x02(" + cmd + b"ios\nsystem\n.", {}, "opcode INST"),
        "OBJ": (b"\x80\x02(" + g("os", "system") + cmd + b"o.", {}, "opcode OBJ"),
        "NEWOBJ": (b"\x80\x02" + g("os", "system") + tup(cmd) + b"\x81.", {}, "opcode NEWOBJ"),
        "EXT1": (b"\x80\x02\x82\x01" + cmd + b"\x85R.", {}, "opcode EXT1"),
        "STACK_GLOBAL": (b"\x80\x04" + s("builtins") + s("exec") + b"\x93" + code + b"\x85R.", {},
                         "builtins.exec"),
        "BUILD on a storage": (b"\x80\x02" + tup(s("storage"), g("torch", "LongStorage"), s("0"),
                                                 s("cpu"), i(16)) + b"Q}" + s("array") + cmd
                               + b"sb.", storage, "BUILD"),
        "storage as a callable": (b"\x80\x02" + g("torch", "LongStorage") + cmd + b"\x85R.", {},
                                  "not callable"),
        "unknown storage type": (prompt_pkl(tokens=tensor(stype="EvilStorage")), storage,
                                 "torch.EvilStorage"),
        "bfloat16": (prompt_pkl(tokens=tensor(stype="BFloat16Storage")), storage, "bfloat16"),
        "unknown persistent id": (prompt_pkl(tokens=tensor(pid=tup(s("module"), s("os")))),
                                  storage, "unknown persistent id"),
        "persistent id of a string": (prompt_pkl(tokens=tensor(pid=cmd)), storage,
                                      "unknown persistent id"),
        "storage key as a path": (prompt_pkl(tokens=tensor(key="../../etc/passwd")), storage,
                                  "not a number"),
        "missing storage entry": (prompt_pkl(tokens=tensor(key="7")), storage,
                                  "archive/data/7 is missing"),
        "storage size differs from entry": (prompt_pkl(tokens=tensor(numel=17)), storage,
                                            "holds 128 bytes; the pickle says 136"),
        "huge storage": (prompt_pkl(tokens=tensor(numel=2**40)), storage, "over the"),
        "view outside its storage": (prompt_pkl(tokens=tensor(size=(8, 3), stride=(2, 1))),
                                     storage, "reaches element 16"),
        "offset outside its storage": (prompt_pkl(tokens=tensor(offset=15)), storage,
                                       "reaches element"),
        "negative stride": (prompt_pkl(tokens=tensor(size=(8, 2), stride=(-2, 1), offset=14)),
                            storage, "not a valid layout"),
        "zero strides, huge view": (prompt_pkl(tokens=tensor(size=(2**20, 2**20), stride=(0, 0))),
                                    storage, "over the"),
        "negative size": (prompt_pkl(tokens=tensor(size=(-8, 2))), storage, "not a valid layout"),
    }


@pytest.mark.parametrize("name", sorted(_payloads(Path("m"))))
def test_hostile_pickle_refused_without_running(tmp_path, name):
    marker = tmp_path / "marker"
    pkl, data, message = _payloads(marker)[name]
    path = torch_file(tmp_path / "evil.pt", pkl, data)
    tracemalloc.start()
    try:
        with pytest.raises(VoicePromptError, match=message.replace(".", r"\.")):
            VoiceClonePrompt.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not marker.exists()
    assert peak < 8 << 20, peak


def test_hostile_payloads_are_live(tmp_path):
    # the eval payload does run under a plain unpickler: refusing it above is what matters
    marker = tmp_path / "marker"
    pkl, _, _ = _payloads(marker)["builtins.eval"]
    pickle.loads(pkl)
    assert marker.exists()


def test_pure_python_unpickler_memo(tmp_path):
    # a PUT at index 2**32 - 2: the C unpickler would size its memo table to that index
    pkl = prompt_pkl(text="memo")
    pkl = pkl[:2] + b"}r\xfe\xff\xff\xff" + pkl[3:]  # EMPTY_DICT, LONG_BINPUT 4294967294
    tracemalloc.start()
    try:
        p = VoiceClonePrompt.load(torch_file(tmp_path / "memo.pt", pkl, {"0": CODES.tobytes()}))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p.ref_text == "memo" and peak < 8 << 20


# A deflate stream of 2**30 zero bytes in about 1 MB: one compressed MiB repeated (each block
# ends in a full flush, so the blocks are identical), then the empty final block.
GIB = 1 << 30
_MIB_BLOCK = None


def _gib_of_zeros() -> bytes:
    global _MIB_BLOCK
    if _MIB_BLOCK is None:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        _MIB_BLOCK = c.compress(bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    return _MIB_BLOCK * 1024 + zlib.compressobj(9, zlib.DEFLATED, -15).flush()


CRC_GIB_ZEROS = 0x5B64C2B0  # zlib.crc32 of 2**30 zero bytes


def test_gib_of_zeros_is_what_it_claims():
    # After a full flush a block refers to nothing before it, so each of the 1024 identical
    # blocks inflates to what the first one does: one MiB of zeros.
    raw = _gib_of_zeros()
    final = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    assert raw == _MIB_BLOCK * 1024 + final and len(raw) < 1_100_000
    assert zlib.decompress(_MIB_BLOCK + final, -15) == bytes(1 << 20)
    crc, mib = 0, bytes(1 << 20)
    for _ in range(1024):
        crc = zlib.crc32(mib, crc)
    assert crc == CRC_GIB_ZEROS


@pytest.mark.parametrize("where", ["data.pkl", "storage declared", "storage understated"])
def test_zip_bomb_refused_before_inflating(tmp_path, where):
    bomb = _gib_of_zeros()
    if where == "data.pkl":
        entries = [("archive/data.pkl", bomb, 8, CRC_GIB_ZEROS, GIB), _stored("archive/version", b"3\n")]
        message = "entry archive/data.pkl needs 1,073,741,824 bytes"
    else:
        numel = GIB // 8 if where == "storage declared" else 16
        entries = [_stored("archive/data.pkl", prompt_pkl(tokens=tensor(numel=numel))),
                   ("archive/data/0", bomb, 8, CRC_GIB_ZEROS, GIB), _stored("archive/version", b"3\n")]
        message = "over the" if where == "storage declared" else "holds 1,073,741,824 bytes"
    path = _zip(tmp_path / "bomb.pt", entries)
    assert path.stat().st_size < 1_100_000
    tracemalloc.start()
    try:
        with pytest.raises(VoicePromptError, match=message):
            VoiceClonePrompt.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_zip_entry_that_lies_small_is_read_only_to_its_size(tmp_path):
    # the header says 128 bytes, the deflate stream holds 1 GiB: only 128 bytes come out
    codes = bytes(128)
    entries = [_stored("archive/data.pkl", prompt_pkl()),
               ("archive/data/0", _gib_of_zeros(), 8, zlib.crc32(codes), len(codes)),
               _stored("archive/version", b"3\n")]
    tracemalloc.start()
    try:
        p = VoiceClonePrompt.load(_zip(tmp_path / "lie.pt", entries))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(p.ref_audio_tokens, np.zeros((8, 2), np.int64))
    assert peak < 8 << 20, peak


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9, -22, -1])
def test_truncated_file_refused(tmp_path, cut):
    data = (REF / "voice_full.pt").read_bytes()
    n = int(len(data) * cut) if cut > 0 else len(data) + cut
    path = tmp_path / "cut.pt"
    path.write_bytes(data[:n])
    with pytest.raises(VoicePromptError):
        VoiceClonePrompt.load(path)


def test_damaged_storage_refused(tmp_path):
    data = bytearray((REF / "voice_full.pt").read_bytes())
    at = data.index(b"voice_full/data/0") + len(b"voice_full/data/0")
    data[at + 200] ^= 0xFF  # inside the 576 stored bytes, whatever the alignment padding
    path = tmp_path / "flip.pt"
    path.write_bytes(bytes(data))
    with pytest.raises(VoicePromptError, match="CRC|Bad"):
        VoiceClonePrompt.load(path)


def test_other_bad_archives(tmp_path):
    pkl, storage = prompt_pkl(), {"0": CODES.tobytes()}
    cases = {
        "two entries with the same name": torch_file(
            tmp_path / "dup.pt", pkl, storage, extra=[_stored("archive/data/0", bytes(128))]),
        "more than one": torch_file(tmp_path / "two.pt", pkl, storage,
                                    extra=[_stored("other/data.pkl", pkl)]),
        "format version": torch_file(tmp_path / "v.pt", pkl, storage, version=b"99\n"),
        "byteorder": torch_file(tmp_path / "bo.pt", pkl, storage, byteorder=b"middle"),
        "compression method": _zip(tmp_path / "bz.pt", [
            _stored("archive/data.pkl", pkl), ("archive/data/0", CODES.tobytes(), 12,
                                               zlib.crc32(CODES.tobytes()), 128),
            _stored("archive/version", b"3\n")]),
        "pre-1.6 format": tmp_path / "legacy.pt",
    }
    cases["pre-1.6 format"].write_bytes(torchfile._LEGACY_MAGIC + b"junk")
    for message, path in cases.items():
        with pytest.raises(VoicePromptError, match=message):
            VoiceClonePrompt.load(path)
    with pytest.raises(VoicePromptError, match="no <folder>/data.pkl"):
        torchfile.load(_zip(tmp_path / "none.pt", [_stored("x/y", b"")]), 1 << 20)


def test_omnicore_prompt_named_pt_still_loads(tmp_path, expected):
    # the format is told by content, not by the file name
    path = tmp_path / "voice.pt"
    VoiceClonePrompt(expected["full_codes"], "hi", 0.1).save(path)
    assert not torchfile.is_torch_file(path)
    np.testing.assert_array_equal(VoiceClonePrompt.load(path).ref_audio_tokens,
                                  expected["full_codes"])


def test_oversized_file_refused_before_reading(tmp_path):
    path = torch_file(tmp_path / "big.pt", prompt_pkl(), {"0": CODES.tobytes()},
                      extra=[_stored("archive/padding", bytes(torchfile.MAX_REFERENCE_PROMPT_BYTES))])
    with pytest.raises(VoicePromptError, match="the limit for this kind of file"):
        VoiceClonePrompt.load(path)


def test_torch_files_that_are_not_prompts(tmp_path):
    storage = {"0": CODES.tobytes()}
    cases = {
        "holding a list": b"\x80\x02]" + i(1) + b"a.",
        "without ref_rms": b"\x80\x02}(" + s("format_version") + i(1) + s("ref_audio_tokens")
                           + tensor() + s("ref_text") + s("x") + b"u.",
        "format_version 2": prompt_pkl(version=2),
        "ref_audio_tokens is a str": prompt_pkl(tokens=s("codes")),
        # the values go through the same checks as an omnicore .npz prompt
        "integer numpy array": prompt_pkl(tokens=tensor(stype="DoubleStorage")),
        r"lie in \[0, 1023\]": None,
        r"shape \[8, frames\]": prompt_pkl(tokens=tensor(size=(16,), stride=(1,))),
        "ref_rms is 0": prompt_pkl(rms=0.0),
        "ref_rms must be a finite number": prompt_pkl(rms=float("nan")),
        "ref_text is empty": prompt_pkl(text="  "),
    }
    for message, pkl in cases.items():
        data = storage
        if pkl is None:  # a code of 1024 (the model's MASK id)
            pkl, data = prompt_pkl(), {"0": np.full(16, 1024, np.int64).tobytes()}
        path = torch_file(tmp_path / "p.pt", pkl, data)
        with pytest.raises(VoicePromptError, match=message):
            VoiceClonePrompt.load(path)


def test_mutated_pickles_raise_only_voice_prompt_error(tmp_path):
    # Flip, drop or insert bytes of a valid data.pkl (the zip rebuilt around it, CRC valid):
    # every outcome is a prompt or a VoicePromptError, and nothing runs.
    base = prompt_pkl(text="mutant")
    rng = np.random.default_rng(0)
    outcomes = {"loaded": 0, "refused": 0}
    for trial in range(300):
        pkl = bytearray(base)
        at = int(rng.integers(0, len(pkl)))
        kind = trial % 3
        if kind == 0:
            pkl[at] = int(rng.integers(0, 256))
        elif kind == 1:
            del pkl[at]
        else:
            pkl.insert(at, int(rng.integers(0, 256)))
        path = torch_file(tmp_path / "m.pt", bytes(pkl), {"0": CODES.tobytes()})
        try:
            VoiceClonePrompt.load(path)
            outcomes["loaded"] += 1
        except VoicePromptError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100 and outcomes["loaded"] > 0, outcomes
    assert not list(tmp_path.glob("marker*"))


def test_not_a_regular_file(tmp_path):
    fifo = tmp_path / "voice.pt"
    os.mkfifo(fifo)
    with pytest.raises(VoicePromptError, match="not a regular file"):
        VoiceClonePrompt.load(fifo)
    with pytest.raises(VoicePromptError, match="not a regular file"):
        torchfile.load(fifo, 1 << 20)
