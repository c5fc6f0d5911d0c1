"""Reading a checkpoint (omnicore/machinery/checkpoint.py): the safetensors reader, the hub and offline
handling, the parts of a checkpoint. Good files load, every kind of bad file gets a WeightsError
naming the file (and key), never a numpy traceback. (ParamReader alone: test_weights.py.)"""

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from conftest import read_safetensors
from omnicore.machinery import checkpoint
from omnicore.machinery.checkpoint import RowTable, SafetensorsFile, resolve_model_dir
from omnicore.errors import ConfigError, ModelNotFoundError, OmniCoreError, WeightsError


def _write_raw(path, header: dict, data: bytes, header_len: int | None = None):
    hb = json.dumps(header).encode()
    n = len(hb) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", n) + hb + data)
    return path


def test_tensors_are_private_aligned_read_only_copies(good):
    path, ref = good
    got = read_safetensors(path)
    assert set(got) == set(ref)
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])
        assert got[k].dtype == ref[k].dtype
        # read into process memory (never a view of a memory map, which a file truncated
        # later turns into SIGBUS), 64-byte aligned for SIMD loads, and immutable
        assert not isinstance(got[k].base, np.memmap) and not got[k].flags["WRITEABLE"]
        assert got[k].ctypes.data % 64 == 0


def test_bf16_and_f16_become_float32(tmp_path):
    x = np.array([[1.0, -2.5, 3.140625], [0.0, 1e-3, 65504.0]], np.float32)
    # bf16 = the top 16 bits of the float32 (values chosen to be exact in bf16 / f16)
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)
    f16 = np.array([[0.5, -1.0], [2.0, 1024.0]], np.float16)
    data = bf.tobytes() + f16.tobytes()
    header = {"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, bf.nbytes]},
              "b": {"dtype": "F16", "shape": [2, 2], "data_offsets": [bf.nbytes, len(data)]}}
    got = read_safetensors(_write_raw(tmp_path / "h.safetensors", header, data))
    assert got["a"].dtype == np.float32 and got["b"].dtype == np.float32
    np.testing.assert_array_equal(got["a"], (bf.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_array_equal(got["b"], f16.astype(np.float32))


def test_truncated_file(good, tmp_path):
    path, _ = good
    raw = path.read_bytes()
    for cut in (0, 5, 20, len(raw) - 1):
        p = tmp_path / f"cut{cut}.safetensors"
        p.write_bytes(raw[:cut])
        with pytest.raises(WeightsError, match=str(p.name)):
            read_safetensors(p)


@pytest.mark.parametrize("entry, match", [
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 10**12]}, "outside"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}, "outside"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]}, "outside"),
    ({"dtype": "F32", "shape": [2**39, 2**39], "data_offsets": [0, 16]}, "needs"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}, "needs"),
    ({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}, "bad shape"),
    ({"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}, "bad shape"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0]}, "data_offsets"),
    ({"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}, "dtype"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 16], "evil": 1}, "malformed"),
    ("not an object", "malformed"),
])
def test_hostile_headers(tmp_path, entry, match):
    p = _write_raw(tmp_path / "x.safetensors", {"t": entry}, b"\0" * 16)
    with pytest.raises(WeightsError, match=match) as info:
        read_safetensors(p)
    assert "x.safetensors" in str(info.value)


def test_absurd_header_length_and_bad_json(tmp_path):
    p = _write_raw(tmp_path / "big.safetensors", {"t": {}}, b"", header_len=2**62)
    with pytest.raises(WeightsError, match="header length"):
        read_safetensors(p)
    p = tmp_path / "junk.safetensors"
    p.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{[")
    with pytest.raises(WeightsError, match="JSON"):
        read_safetensors(p)
    p = tmp_path / "list.safetensors"
    p.write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(WeightsError, match="object"):
        read_safetensors(p)


def test_overlapping_tensors(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}
    with pytest.raises(WeightsError, match="overlap"):
        read_safetensors(_write_raw(tmp_path / "o.safetensors", header, b"\0" * 24))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(WeightsError, match="not found"):
        read_safetensors(tmp_path / "nope.safetensors")
    with pytest.raises(WeightsError, match="directory"):
        read_safetensors(tmp_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200), n=st.integers(0, 2**64 - 1))
def test_random_bytes_never_crash(tmp_path, data, n):
    p = tmp_path / "fuzz.safetensors"
    p.write_bytes(struct.pack("<Q", n) + data)
    try:
        read_safetensors(p)
    except WeightsError:
        pass


def test_resolve_model_dir_local_and_errors(tmp_path, monkeypatch):
    assert resolve_model_dir(tmp_path) == tmp_path
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ModelNotFoundError, match="found a file"):
        resolve_model_dir(f)
    with pytest.raises(ModelNotFoundError, match="owner/name"):
        resolve_model_dir(tmp_path / "does" / "not" / "exist")
    # Offline with an empty cache: a fast, explicit message that says what to download.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError, match="hf download k2-fsa/OmniVoice"):
        resolve_model_dir("k2-fsa/OmniVoice")


def _hub_cache(home: Path, repo: str, source: Path) -> Path:
    """A Hugging Face cache under `home` holding `source`'s files as the snapshot of `repo`
    (the layout huggingface_hub writes: refs/main names the snapshot's commit)."""
    commit = "0" * 40
    folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, folder / "snapshots" / commit)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return folder / "snapshots" / commit


@pytest.mark.subprocess
def test_the_offline_message_names_a_command_that_runs(tmp_path, monkeypatch):
    """The command the message prints, run as printed by huggingface_hub's real `hf` (offline,
    from a cache that holds the files), fetches the files the message names."""
    import shlex
    import subprocess
    import sys

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_dir("k2-fsa/OmniVoice")
    command = next(line.strip() for line in str(info.value).splitlines()
                   if line.strip().startswith("hf "))
    argv = shlex.split(command)
    assert argv[:3] == ["hf", "download", "k2-fsa/OmniVoice"] and "model.safetensors" in argv
    hf = Path(sys.executable).with_name("hf")
    hf = str(hf) if hf.is_file() else shutil.which("hf")
    if hf is None:
        pytest.fail("huggingface_hub's `hf` command is not installed beside this Python")
    snapshot = _hub_cache(tmp_path / "hf", "k2-fsa/OmniVoice", TINY)
    done = subprocess.run([hf, *argv[1:]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert Path(done.stdout.split()[-1]) == snapshot  # hf prints where the files are
    assert all((snapshot / name).is_file() for name in argv[3:])
    # and omnicore finds them there (a new process: huggingface_hub reads HF_HOME at import)
    found = subprocess.run([sys.executable, "-c", "from omnicore.machinery.checkpoint import "
                            "resolve_model_dir as r; print(r('k2-fsa/OmniVoice'))"],
                           capture_output=True, text=True, timeout=120, check=True)
    assert Path(found.stdout.strip()) == snapshot


# ---------------------------------------------------------------------------------------------
# Whole checkpoints: the real-layout tiny checkpoint, a BF16 copy, and broken copies of it
# ---------------------------------------------------------------------------------------------

TINY = Path(__file__).resolve().parents[1] / "weights" / "tiny-random"


def _copy_tiny(tmp_path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(TINY, dst)
    return dst


def _rewrite(path: Path, edit) -> None:
    tensors = {k: np.array(v) for k, v in read_safetensors(path).items()}
    save_file(edit(tensors), str(path))


def test_tiny_checkpoint_loads_with_every_key_used():
    from omnicore import OmniVoice

    model = OmniVoice.from_pretrained(TINY)  # ParamReader.finish() ran for the backbone
    raw = read_safetensors(TINY / "model.safetensors")
    assert model.params.embed_tokens.shape == raw["llm.embed_tokens.weight"].shape
    # the codec's full load (decoder + encoder) also audits every key of its file
    cfg, params = checkpoint.load_codec(TINY, encoder=True)
    assert params.encoder is not None


def test_bf16_checkpoint_loads_and_matches_rounded_f32(tmp_path):
    from omnicore import OmniVoice

    ckpt = _copy_tiny(tmp_path)
    src = read_safetensors(TINY / "model.safetensors")
    # write every float tensor as BF16 (round to nearest even), like `--dtype bf16` exports
    header, blobs, offset = {}, [], 0
    for key, arr in src.items():
        if arr.dtype == np.float32:
            bits = arr.view(np.uint32).astype(np.uint64)
            bf = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            data, dtype = bf.tobytes(), "BF16"
        else:
            data, dtype = np.ascontiguousarray(arr).tobytes(), "I64"
        header[key] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    _write_raw(ckpt / "model.safetensors", header, b"".join(blobs))
    model = OmniVoice.from_pretrained(ckpt)
    ref = src["llm.norm.weight"]
    got = np.asarray(model.params.norm)
    assert got.dtype == np.float32
    assert np.abs(got - ref).max() <= np.abs(ref).max() * 2 ** -8
    codes = model.generate_codes("bf16 works.", num_step=2, duration=0.4)[0]
    assert codes.shape == (8, 10)


@pytest.mark.parametrize("breakage, match", [
    ("truncate", "truncated|outside"),
    ("drop_key", "missing tensor 'llm.norm.weight'"),
    ("extra_key", "not used.*'llm.extra.weight'"),
    ("reshape", "llm.layers.0.mlp.up_proj.weight"),
    ("config_hidden", "shape"),
    ("config_json", "invalid JSON"),
    ("no_tokenizer", "tokenizer"),
    ("codec_truncate", "audio_tokenizer"),
])
def test_broken_checkpoints_give_typed_errors(tmp_path, breakage, match):
    from omnicore import OmniVoice

    ckpt = _copy_tiny(tmp_path)
    model_file = ckpt / "model.safetensors"
    if breakage == "truncate":
        raw = model_file.read_bytes()
        model_file.write_bytes(raw[: len(raw) // 2])
    elif breakage == "drop_key":
        _rewrite(model_file, lambda t: {k: v for k, v in t.items() if k != "llm.norm.weight"})
    elif breakage == "extra_key":
        _rewrite(model_file, lambda t: {**t, "llm.extra.weight": np.zeros(3, np.float32)})
    elif breakage == "reshape":
        _rewrite(model_file, lambda t: {**t, "llm.layers.0.mlp.up_proj.weight":
                                        t["llm.layers.0.mlp.up_proj.weight"][:-1]})
    elif breakage == "config_hidden":
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["llm_config"]["intermediate_size"] += 8
        (ckpt / "config.json").write_text(json.dumps(cfg))
    elif breakage == "config_json":
        (ckpt / "config.json").write_text("{ not json")
    elif breakage == "no_tokenizer":
        (ckpt / "tokenizer.json").unlink()
    elif breakage == "codec_truncate":
        f = ckpt / "audio_tokenizer" / "model.safetensors"
        f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(OmniCoreError, match=match) as info:
        OmniVoice.from_pretrained(ckpt)
    assert isinstance(info.value, (WeightsError, ConfigError, ModelNotFoundError))


# ---------------------------------------------------------------------------------------------
# Hostile headers, non-finite weights, the all-finite kernel, tables read by rows
# ---------------------------------------------------------------------------------------------


def test_deeply_nested_header_is_a_weights_error(tmp_path):
    p = tmp_path / "deep.safetensors"
    body = b"[" * 100_000 + b"]" * 100_000
    p.write_bytes(struct.pack("<Q", len(body)) + body)
    with pytest.raises(WeightsError, match="deep.safetensors: header nests JSON too deeply"):
        read_safetensors(p)


@pytest.mark.parametrize("key, where", [
    ("audio_embeddings.weight", (17, 3)),
    ("llm.layers.1.mlp.down_proj.weight", (0, 0)),
    ("audio_heads.weight", (8199, 63)),
    ("llm.norm.weight", (5,)),
])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, key, where, bad):
    from omnicore import OmniVoice

    ckpt = _copy_tiny(tmp_path)

    def poison(t):
        t[key][where] = bad
        return t

    _rewrite(ckpt / "model.safetensors", poison)
    with pytest.raises(WeightsError, match=f"tensor '{key}' holds NaN or infinite values "
                                           f"\\(first at index \\[{', '.join(map(str, where))}\\]"):
        OmniVoice.from_pretrained(ckpt)


def test_non_finite_codec_weights_are_refused(tmp_path):
    from omnicore import OmniVoice

    ckpt = _copy_tiny(tmp_path)
    key = "acoustic_decoder.block.2.res_unit1.conv1.bias"

    def poison(t):
        t[key][0] = np.nan
        return t

    _rewrite(ckpt / "audio_tokenizer" / "model.safetensors", poison)
    with pytest.raises(WeightsError, match=f"tensor '{key}' holds NaN"):
        OmniVoice.from_pretrained(ckpt)


def test_text_embedding_rows_are_checked_as_they_are_read(tmp_path):
    from omnicore import OmniVoice

    ckpt = _copy_tiny(tmp_path)
    model = OmniVoice.from_pretrained(ckpt)
    used = model.tokenizer.special_ids["<|text_start|>"]  # in every prompt
    unused = model.tokenizer.backend.token_to_id("<|im_start|>")  # a Qwen chat token OmniVoice never uses

    def poison(t, row):
        t["llm.embed_tokens.weight"][row, 7] = np.nan
        return t

    _rewrite(ckpt / "model.safetensors", lambda t: poison(t, unused))
    model = OmniVoice.from_pretrained(ckpt)  # the table is not read at load: rows on use
    codes = model.generate_codes("Rows on use.", num_step=2, duration=0.4)[0]
    assert codes.shape == (8, 10) and codes.max() < 1024
    _rewrite(ckpt / "model.safetensors", lambda t: poison(t, used))
    model = OmniVoice.from_pretrained(ckpt)
    with pytest.raises(WeightsError, match=f"row {used} of tensor 'llm.embed_tokens.weight' holds NaN"):
        model.generate_codes("Rows on use.", num_step=2, duration=0.4)


def test_all_finite_kernel_agrees_with_its_numpy_twin():
    from omnicore.model.kernels import all_finite, all_finite_np

    rng = np.random.default_rng(0)
    n = (1 << 16) * 3 + 5  # several early-exit blocks and a ragged tail
    specials = [np.nan, np.inf, -np.inf, np.float32(3.4e38), np.float32(1e-45), -0.0,
                np.float32(np.finfo(np.float32).max), np.float32(-np.finfo(np.float32).max)]
    for value in specials:
        for pos in (0, 1, (1 << 16) - 1, 1 << 16, n - 1):
            x = rng.standard_normal(n).astype(np.float32)
            x[pos] = value
            assert all_finite(x) == all_finite_np(x) == bool(np.isfinite(value)), (value, pos)
    nan_payload = np.array([0x7FC00001, 0xFF800000, 0x7F800001, 0x7F7FFFFF], np.uint32).view(np.float32)
    assert [all_finite(v[None]) for v in nan_payload] == [False, False, False, True]
    x = rng.standard_normal((64, 48)).astype(np.float32)
    x[5, 40] = np.inf
    assert all_finite(x[:, :32]) and not all_finite(x[:, 32:])  # strided views
    assert not all_finite(x.astype(np.float64)) and all_finite(np.zeros(0, np.float32))


def test_row_table_indexes_like_the_array(tmp_path):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 6)).astype(np.float32)
    bf = (table.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bf16
    data = table.tobytes() + bf.tobytes()
    header = {"t": {"dtype": "F32", "shape": [50, 6], "data_offsets": [0, table.nbytes]},
              "b": {"dtype": "BF16", "shape": [50, 6], "data_offsets": [table.nbytes, len(data)]}}
    path = _write_raw(tmp_path / "rows.safetensors", header, data)
    reader = checkpoint.open_params(path)
    rows = reader.take_rows("t", (50, 6))
    assert isinstance(rows, RowTable) and rows.shape == (50, 6) and rows.dtype == np.float32
    for ids in ([3, 3, 49, 0], [[1, 2], [2, -1]], np.array([], np.int64), 7):
        np.testing.assert_array_equal(rows[np.asarray(ids, dtype=np.int64)], table[np.asarray(ids, dtype=np.int64)])
    widened = (bf.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(reader.take_rows("b")[np.array([4, 0, 4])], widened[[4, 0, 4]])
    with pytest.raises(IndexError):
        rows[np.array([50])]
    with pytest.raises(IndexError):
        rows[np.array([0.5])]
    reader.finish()
    with SafetensorsFile(path) as f:
        assert set(f) == {"t", "b"} and f.entries["b"].kind == "BF16"


def test_weight_norm_over_an_all_zero_tap_is_a_weights_error(tmp_path):
    ckpt = _copy_tiny(tmp_path)
    key = "semantic_model.encoder.pos_conv_embed.conv.parametrizations.weight.original1"

    def zero_tap(t):
        t[key][:, :, 3] = 0  # the norm over (out, in) of tap 3 is 0: every folded weight 0/0
        return t

    _rewrite(ckpt / "audio_tokenizer" / "model.safetensors", zero_tap)
    with pytest.raises(WeightsError, match="original1 has a tap whose weights are all zero"):
        checkpoint.load_codec(ckpt, encoder=True)
