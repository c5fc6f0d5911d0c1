"""The device code path, proven on the CPU: the pipeline under OMNICORE_BACKEND=strict.

The strict backend (`omnicore_testing/strictxp.py`) refuses what CuPy refuses (implicit conversion to
numpy, host arrays mixed into device operations, Numba kernels) plus any float64 array on the
device, and counts every host <-> device transfer (`omnicore_testing/transfers.py`). The backend is
chosen once per process, so `tests/device_child.py` runs the tiny checkpoint's pipeline in a child process
under it: generate in auto / design / clone mode, a voice prompt, a packed batch with seeded
sampling, a stream (and the live profile's streams), codec decode (one-shot, batched,
windowed) and encode. Here, on the numpy backend, the same cases run again and the two are
compared:

* codes: token-exact with the reference fixtures, and with the numpy backend (seeded sampling
  included: the noise is drawn from the same generators in the same order);
* audio: within DEVICE_REL of the numpy backend (relative to the peak). The device path runs
  the plain float32 twins instead of the Numba kernels: Snake with xp.sin (the kernel: its own
  float32 polynomial), GroupNorm statistics in float32 (the kernel: float64 accumulators),
  erf-GELU and exp from xp, whole-array GEMMs instead of the kernels' fixed-size chunks;
* transfers: at most MAX_TRANSFERS_PER_STEP per unmasking step, the same for one item or three
  and for short or long targets (the text rows' ids down and their embeddings up, plus one
  copy of the step's Gumbel noise when a temperature is > 0);
* no float64 array was ever made on the device.

OMNICORE_TEST_DEVICE_BACKEND=cupy runs the same checks with CuPy on a CUDA machine
(benchmarks/gpu/run.sh does); the float64 census is the strict backend's alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import device_child  # noqa: E402

pytestmark = pytest.mark.subprocess

DEVICE_BACKEND = os.environ.get("OMNICORE_TEST_DEVICE_BACKEND", "strict")
REF = ROOT / "tests" / "fixtures" / "reference"
# Device vs numpy backend audio, max |diff| / max |numpy|. Measured on strict <= 3.1e-6
# (OpenBLAS Haswell kernels; HuBERT's fused features 6.5e-7): float32 twins vs Numba kernels,
# see the module docstring.
DEVICE_REL = 1e-5
WAVE_TOL = 2e-5  # vs the reference's waveform, as tests/test_pipeline.py
CHUNK_TOL = 2e-5  # windowed vs one-shot decode, as tests/test_higgs_codec.py
# Per unmasking step: text ids to the host and their embedding rows back (the text table is
# read from disk by rows), plus one copy of all items' Gumbel noise when sampling.
MAX_TRANSFERS_PER_STEP = 3
DEVICE_DTYPES = {"bool", "int64", "float32"}


def _child_env(backend: str) -> dict:
    """This process's environment for a child on `backend` that imports this checkout."""
    return dict(os.environ, OMNICORE_BACKEND=backend,
                PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    """What the pipeline made under the device backend (child process)."""
    out = tmp_path_factory.mktemp("device") / "out.npz"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "device_child.py"), str(out)],
                          env=_child_env(DEVICE_BACKEND), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    with np.load(out, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "meta"}
        meta = json.loads(str(z["meta"]))
    assert meta["backend"] == DEVICE_BACKEND
    return arrays, meta


@pytest.fixture(scope="module")
def host():
    """The same cases on the numpy backend, in this process."""
    from omnicore.model import backend

    assert backend.name() == "numpy", "run the suite itself on the numpy backend"
    return device_child.produce(device_checks=False)[0]


# ---------------------------------------------------------------------------------------------
# Against the reference fixtures
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", device_child.FIXTURE_CASES)
def test_generate_is_token_exact_with_the_reference(device, name):
    got = device[0][f"{name}/codes"]
    z = np.load(REF / f"generate_{name}.npz", allow_pickle=False)
    np.testing.assert_array_equal(got, z["codes"])
    assert min(len(np.unique(row)) for row in z["codes"]) >= 5  # a fixture that can fail
    assert len(device[0][f"{name}/audio"]) == int(z["wave_len"])
    if "wave" in z.files:
        assert device_child.rel(device[0][f"{name}/audio"], z["wave"]) <= WAVE_TOL


@pytest.mark.parametrize("name", device_child.FIXTURE_CASES)
def test_fast_profile_with_its_knobs_at_one_is_exact(device, host, name):
    """profile="fast" with prefix_refresh=1 and uncond_every=1 gives exact's codes bit for bit
    (auto, design and clone) on the device path and on numpy; with reuse (FAST_KW) the two
    backends agree with each other (test_same_codes_as_the_numpy_backend)."""
    want = np.load(REF / f"generate_{name}.npz", allow_pickle=False)["codes"]
    for arrays in (device[0], host):
        np.testing.assert_array_equal(arrays[f"{name}/codes_fast1"], want)
        assert not np.array_equal(arrays[f"{name}/codes_fast"], want)  # reuse changes them


@pytest.mark.parametrize("mode", device_child.LIVE_MODES)
def test_live_profile_at_exact_settings_streams_fasts_codes(device, host, mode):
    """A live stream with first_chunk_steps, first_chunk_seconds and first_audio_seconds at
    their exact settings makes fast's codes bit for bit (auto, design, clone) on the device
    path and on numpy; with live's own knobs chunk 0 changes, and the two backends agree on
    it."""
    for arrays in (device[0], host):
        np.testing.assert_array_equal(arrays[f"live_{mode}/live_exact"], arrays[f"live_{mode}/fast"])
        own, fast = arrays[f"live_{mode}/live_chunk0"], arrays[f"live_{mode}/fast_chunk0"]
        assert own.shape != fast.shape or not np.array_equal(own, fast)
    for key in device_child.LIVE_STREAMS:
        np.testing.assert_array_equal(device[0][f"live_{mode}/{key}"], host[f"live_{mode}/{key}"])


def test_voice_prompt_codes_match_the_reference(device):
    want = np.load(REF / "generate_clone_prompt.npz", allow_pickle=False)["ref_audio_tokens"]
    got = device[0]["clone_prompt/codes"]
    assert got.shape == want.shape
    # tests/test_pipeline.py allows picks within rounding of a tie; measured here: all equal
    assert (got != want).sum() <= 1


def test_codec_matches_the_reference(device):
    dec = np.load(REF / "codec_decode.npz")
    enc = np.load(REF / "codec_encode.npz")
    arrays = device[0]
    assert device_child.rel(arrays["decode/wav_50"], dec["wav_50"]) <= WAVE_TOL
    assert device_child.rel(arrays["decode/wav_batch"], dec["wav_batch"]) <= WAVE_TOL
    assert device_child.rel(arrays["decode/wav_chunked_50"], arrays["decode/wav_50"]) <= CHUNK_TOL
    np.testing.assert_array_equal(arrays["encode/codes"], enc["codes"])
    np.testing.assert_array_equal(arrays["encode/codes_api"], enc["codes"])
    assert device_child.rel(arrays["encode/fused"], enc["fused"]) <= 5e-6  # tests/test_higgs_codec.py's bound


# ---------------------------------------------------------------------------------------------
# Against the numpy backend
# ---------------------------------------------------------------------------------------------


def test_same_codes_as_the_numpy_backend(device, host):
    """Greedy and seeded-sampled codes are equal (the noise is drawn from the same generators in
    the same order). Class sampling: on the strict backend only (device_child.CLASS_KW says why)."""
    codes = [k for k in host if k.split("/")[1].startswith("codes")]
    assert len(codes) >= 10
    for k in codes:
        if k.startswith("class_sampled/") and DEVICE_BACKEND != "strict":
            continue
        np.testing.assert_array_equal(device[0][k], host[k], err_msg=k)


def test_audio_within_tolerance_of_the_numpy_backend(device, host):
    waves = [k for k in host if k.split("/")[1].startswith(("audio", "wav"))]
    assert {"batch/audio_0", "stream/audio", "decode/wav_50", "clone_s8/audio"} <= set(waves)
    worst = {k: device_child.rel(device[0][k], host[k]) for k in waves if device[0][k].shape == host[k].shape}
    assert len(worst) == len(waves), "shapes differ"
    assert max(worst.values()) <= DEVICE_REL, worst
    np.testing.assert_array_equal(device[0]["stream/pieces"], host["stream/pieces"])
    assert device_child.rel(device[0]["encode/fused"], host["encode/fused"]) <= DEVICE_REL


# ---------------------------------------------------------------------------------------------
# Transfers and dtypes
# ---------------------------------------------------------------------------------------------


def test_transfers_per_step_are_a_small_constant(device):
    runs = device[1]["transfers_per_step"]
    assert set(runs) == set(device_child.TRANSFER_RUNS)
    totals = {}
    for key, steps in runs.items():
        assert len(steps) >= 3, key  # steps 2..n of a 5-step pass
        per_step = {sum(s.values()) for s in steps}
        assert len(per_step) == 1, (key, steps)  # the same at every step
        totals[key] = per_step.pop()
    assert max(totals.values()) <= MAX_TRANSFERS_PER_STEP, totals
    # independent of the number of items and of T; sampling adds the one noise copy
    assert totals["greedy_1"] == totals["greedy_3"]
    assert totals["sampled_1"] == totals["sampled_3"] == totals["sampled_3_long"]
    assert totals["sampled_1"] <= totals["greedy_1"] + 1


def test_steps_after_the_first_replay_as_recorded_work(device):
    """Every multi-step pass above reruns its layers and heads through backend.replay: on the
    strict backend each rerun is checked for host round trips (none may happen there), on CuPy
    each is a CUDA graph replay, and no capture may fail. The codes compared above are then
    those of the replayed work."""
    graphs = device[1]["graphs"]
    assert graphs["failed"] == 0, graphs
    if DEVICE_BACKEND == "strict":
        assert graphs["captured"] >= 10, graphs
    else:
        assert graphs["captured"] >= 1 and graphs["replayed"] >= 10, graphs


def test_backend_matmul_on_every_layout(device):
    """backend.matmul (on CuPy: cuBLAS called directly, so that graphs can record it) gives the
    product on transposed, batched and strided operands (float32 rounding of a float64 product)."""
    assert device[1]["matmul_rel_err"] < 1e-5


def test_backbone_kernels_agree_with_their_twins(device):
    """The kernels as the device backend dispatches them (CuPy: one CUDA kernel each, see the
    end of omnicore/model/kernels.py) against the plain xp twins, on fresh inputs."""
    errs = device[1]["kernel_rel_err"]
    assert set(errs) == {"rms_norm", "add_rms_norm", "qk_norm_rope", "softmax_rows", "swiglu"}
    assert max(errs.values()) < 2e-6, errs


def test_replay_refuses_host_round_trips():
    """The strict backend's check itself: recorded work that reads a scalar, moves data or
    makes a data-sized result is refused from the second call on (a graph could not hold it)."""
    code = """
import numpy as np
from omnicore.machinery import settings
from omnicore.model import backend
from omnicore.model.backend import xp
from omnicore_testing.transfers import CaptureError
settings.configure()
a = backend.to_device(np.arange(6, dtype=np.float32))
out = backend.to_device(np.zeros(6, dtype=np.float32))
for name, fn in {"fine": lambda: xp.multiply(a, 2, out=out),
                 "scalar": lambda: a * float(a.sum()),
                 "transfer": lambda: a + backend.to_device(np.ones(6, np.float32)),
                 "sync": lambda: a[a > 2]}.items():
    store = {}
    backend.replay(store, 0, fn)
    try:
        backend.replay(store, 0, fn)
        print(name, "ran")
    except CaptureError:
        print(name, "refused")
print(backend.to_numpy(backend.replay({}, 0, lambda: a + 1)).tolist())
"""
    proc = subprocess.run([sys.executable, "-c", code], env=_child_env("strict"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split("\n")
    assert lines[:4] == ["fine ran", "scalar refused", "transfer refused", "sync refused"], proc.stdout
    assert lines[4] == "[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]"


def test_no_float64_on_the_device(device):
    if DEVICE_BACKEND != "strict":
        pytest.skip("the dtype census is kept by the strict backend")
    seen = set(device[1]["device_dtypes"])
    assert "float64" not in seen and seen <= DEVICE_DTYPES, seen


# ---------------------------------------------------------------------------------------------
# The walls themselves (the strict array type works without selecting the backend)
# ---------------------------------------------------------------------------------------------


def test_strict_arrays_refuse_what_cupy_refuses_and_float64():
    from omnicore_testing import strictxp

    counts = []
    xp = strictxp.make_namespace(counts.append)
    a = strictxp.from_host(np.arange(6, dtype=np.float32)).reshape(2, 3)
    assert not isinstance(a, np.ndarray) and isinstance(a, xp.ndarray)
    for bad in (lambda: np.asarray(a), lambda: np.array(a), lambda: np.exp(a),
                lambda: np.concatenate([a, a]), lambda: a + np.ones(3, np.float32),
                lambda: xp.asarray(np.ones(3, np.float32)), lambda: a[np.array([0])],
                lambda: a[[0, 1]], lambda: a.__setitem__(0, np.zeros(3, np.float32)),
                lambda: memoryview(a), lambda: a.get(), lambda: xp.random.default_rng(0)):
        with pytest.raises((TypeError, AttributeError)):
            bad()
    for f64 in (lambda: xp.zeros(3), lambda: a.astype(np.float64), lambda: a * np.float64(2),
                lambda: xp.arange(3) * 0.5, lambda: strictxp.from_host(np.zeros(2))):
        with pytest.raises(strictxp.Float64OnDevice):
            f64()
    # what is allowed: xp functions, operators with scalars (numpy scalars too), views, out=
    b = xp.exp(a) * np.float32(2) + 1
    assert b.dtype == np.float32 and isinstance(b, strictxp.StrictArray)
    xp.multiply(a, a, out=b)
    s = b.sum()
    assert isinstance(s, strictxp.StrictArray) and s.shape == ()  # 0-d, as CuPy's reductions
    assert counts == []
    assert float(s) == 55.0 and int(a[1, 2]) == 5 and bool(a[0, 1]) and a[1].tolist() == [3, 4, 5]
    assert counts == ["scalar"] * 4  # each a device -> host read, counted
    np.testing.assert_array_equal(strictxp.to_host(b), np.arange(6, dtype=np.float32).reshape(2, 3) ** 2)


# ---------------------------------------------------------------------------------------------
# Precision profiles: their dtype flow on the device path
# ---------------------------------------------------------------------------------------------

_PROFILE_CHILD = r"""
import json, sys
import numpy as np
from omnicore import OmniVoice
from omnicore.errors import ConfigError
from omnicore.model import backend
from omnicore_testing import strictxp
gemms, real = [], backend.matmul_half


def spy(a, b, precision, out=None):
    r = real(a, b, precision, out)
    gemms.append([a.dtype.name, b.dtype.name, r.dtype.name])
    return r


backend.matmul_half = spy
out = {}
for precision in backend.PRECISIONS:
    gemms.clear()
    try:
        m = OmniVoice.from_pretrained(sys.argv[1], precision=precision)
    except ConfigError as exc:  # int8 on a device backend
        out[precision] = {"refused": str(exc)}
        continue
    strict = backend.name() == "strict"
    codes = m.generate_codes("Rounded on the way in.", duration=1.5, num_step=6,
                             position_temperature=0.0, class_temperature=0.0)[0]
    out[precision] = {"codes": np.asarray(codes).tolist(),
                      "dtypes": sorted(strictxp.seen_dtypes()) if strict else [],
                      "half_gemms": gemms[:],
                      "weights": getattr(m.params.layers[0].q_proj, "q",
                                         m.params.layers[0].q_proj).dtype.name,
                      "layers": len(m.params.layers)}
print("RESULT " + json.dumps(out))
"""


def test_precision_profiles_run_their_dtype_flow_on_the_device_path():
    """Each profile on the strict backend: what it rounds is made on the device, never float64.
    bf16 and fp16 run the tensor cores' flow there: weights stored as half-precision arrays
    (float16; bfloat16's bits as uint16), every GEMM of the forward (7 projections and 2
    attention products per layer, the heads) fed half-precision arrays and returning float32
    (backend.matmul_half); tf32 rounds float32 bits (uint32). On numpy the rounding stands in
    and no half array exists. fp32's greedy codes are the numpy backend's token for token; a
    rounded profile's nearly so: the device path's float32 twins differ from the Numba kernels
    in the last bits, and a value that straddles a rounding boundary of the format moves by a
    whole unit of it (measured: 1 cell of 296). int8 is the CPU's profile (its kernels are
    Numba's, on the CPU's int8 units): a device backend refuses it with a ConfigError that
    says what to use instead, and the numpy backend runs it (int8 weights)."""
    if DEVICE_BACKEND != "strict":
        pytest.skip("the dtype census is kept by the strict backend")
    runs = {}
    for backend_name in ("strict", "numpy"):
        proc = subprocess.run([sys.executable, "-c", _PROFILE_CHILD, str(ROOT / "weights" / "tiny-random")],
                              env=_child_env(backend_name), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[backend_name] = json.loads(proc.stdout.split("RESULT ", 1)[1])
    strict, host = runs["strict"], runs["numpy"]
    assert strict["fp32"]["codes"] == host["fp32"]["codes"]
    for precision in ("tf32", "bf16", "fp16"):
        same = np.mean(np.array(strict[precision]["codes"]) == np.array(host[precision]["codes"]))
        assert same >= 0.95, (precision, same)
    assert "float64" not in strict["fp16"]["dtypes"]
    assert "float16" in strict["fp16"]["dtypes"] and "uint32" in strict["tf32"]["dtypes"]
    for precision, half in (("bf16", "uint16"), ("fp16", "float16")):
        run = strict[precision]
        assert run["weights"] == half and half in run["dtypes"]
        assert len(run["half_gemms"]) == 6 * (9 * run["layers"] + 1)  # every GEMM of 6 steps
        assert all(g == [half, half, "float32"] for g in run["half_gemms"])
        assert host[precision]["weights"] == "float32" and not host[precision]["half_gemms"]
    for precision in ("fp32", "tf32"):
        assert not strict[precision]["half_gemms"] and strict[precision]["weights"] == "float32"
    assert host["bf16"]["codes"] != host["fp32"]["codes"]  # the profile changes the numbers
    assert set(strict["int8"]) == {"refused"} and "CPU profile" in strict["int8"]["refused"]
    assert "bf16 or fp16" in strict["int8"]["refused"]
    assert host["int8"]["weights"] == "int8" and not host["int8"]["half_gemms"]
    assert host["int8"]["codes"] != host["fp32"]["codes"]
