"""Run the tiny checkpoint's pipeline under a device backend and save what it made.

    OMNICORE_BACKEND=strict python3 tests/device_child.py OUT.npz     (or =cupy on a GPU)

The backend is chosen once per process (omnicore.machinery.settings.configure, at the model's load), so
`tests/test_strict_backend.py` runs this
in a child process and compares its outputs, in the parent (numpy backend), with the reference
fixtures and with the numpy backend's own outputs. Saved arrays are named `<case>/<what>`;
`meta` is a JSON string (backend, per-step transfer counts, dtypes seen on the device, timings).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
REF = ROOT / "tests" / "fixtures" / "reference"

# Fixture cases generated under the device backend: auto, design and clone (its clip encoded
# on the device too); 8-step cases where the fixture has no waveform to keep the run short.
FIXTURE_CASES = ("auto_s32_pp0", "design_s8", "clone_s8")
BATCH_TEXTS = ["Two requests packed together.", "The second one is a little longer than that.",
               "And a third."]
# Seeded sampling in one packed pass: position noise for every item, drawn in one transfer.
BATCH_KW = dict(num_step=6, seed=[3, 4, 5], position_temperature=5.0, postprocess_output=False)
# Class sampling too (codes only). Its top-10 % candidates come from argpartition, whose order
# is numpy's introselect on the strict backend but a full sort on CuPy, and the noise is matched
# to candidates in that order: seeded class sampling is the same on numpy and strict, not CuPy.
CLASS_KW = dict(num_step=4, seed=[6, 7], position_temperature=5.0, class_temperature=0.5)
# The fast profile's reuse within the fixtures' steps: prompt kept for 3 steps, the
# unconditional logits for 2.
FAST_KW = dict(prefix_refresh=3, uncond_every=2)
STREAM_TEXT = ("Hello there, this is a small test of streaming speech. The second sentence is "
               "here, and it goes on for a while! Is this the third one?")
STREAM_KW = dict(num_step=3, seed=7)
# The live profile's streams, per mode: at its own knobs (chunk 0 in 2 steps, cut after 1 s),
# at their exact settings (fast's stream), and fast itself; codes only.
LIVE_MODES = ("auto", "design", "clone")
LIVE_STREAMS = {"live": dict(profile="live", first_chunk_steps=2),
                "live_exact": dict(profile="live", first_chunk_steps=0, first_chunk_seconds=2.0,
                                   first_chunk_max_seconds=0.0, first_audio_seconds=0.0),
                "fast": dict(profile="fast")}
# Transfer counting: greedy and sampled settings, one item and three of different lengths.
TRANSFER_RUNS = {
    "greedy_1": (BATCH_TEXTS[:1], dict(num_step=5, position_temperature=0.0, class_temperature=0.0)),
    "greedy_3": (BATCH_TEXTS, dict(num_step=5, position_temperature=0.0, class_temperature=0.0)),
    "sampled_1": (BATCH_TEXTS[:1], dict(num_step=5, seed=1, class_temperature=0.5)),
    "sampled_3": (BATCH_TEXTS, dict(num_step=5, seed=1, class_temperature=0.5)),
    "sampled_3_long": (BATCH_TEXTS, dict(num_step=5, seed=1, class_temperature=0.5, duration=4.0)),
}


def fixture_inputs(name):
    z = np.load(REF / f"generate_{name}.npz", allow_pickle=False)
    inp = json.loads(str(z["inputs_json"]))
    kwargs = inp.pop("kwargs", {})
    if "ref_audio" in inp:
        inp["ref_audio"] = str(ROOT / inp["ref_audio"])
    return inp, kwargs


def matmul_cases(rng):
    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    w = r(48, 32)
    return [(r(7, 32), w.T), (r(5, 6), r(6, 9)), (r(1, 32), w.T), (r(6, 1), r(1, 5)),
            (r(4, 3, 10, 8), r(3, 10, 4, 8).transpose(2, 0, 3, 1)),
            (r(4, 3, 10, 10), r(3, 10, 4, 8).transpose(2, 0, 1, 3)),
            (r(3, 5, 7)[:, 1:4], r(7, 2)), (r(2, 5, 6).transpose(0, 2, 1), r(2, 5, 3))]


def rel(a, b) -> float:
    """max |a - b| / max |b| (either may be a device array)."""
    from omnicore.model import backend

    a, b = backend.to_numpy(a), backend.to_numpy(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def kernel_errors(rng) -> dict:
    """Each backbone kernel as dispatched on this backend (CuPy: the CUDA twins) against its
    plain xp twin, on fresh device inputs: max |diff| / max |twin| per kernel."""
    from omnicore.model import backend, kernels

    def d(*shape, scale=1.0):
        return backend.to_device((rng.standard_normal(shape) * scale).astype(np.float32))

    errs = {}
    N, D, H, K, E = 37, 1024, 16, 8, 128
    x, w = d(N, D, scale=3.0), d(D)
    errs["rms_norm"] = rel(kernels.rms_norm(x, w, 1e-6), kernels.rms_norm_np(x, w, 1e-6))
    x1, y = d(N, D), d(N, D)
    x2 = x1.copy()
    o1, o2 = d(N, D), d(N, D)
    kernels.add_rms_norm(x1, y, w, 1e-6, o1)
    kernels.add_rms_norm_np(x2, y, w, 1e-6, o2)
    errs["add_rms_norm"] = max(rel(o1, o2), rel(x1, x2))
    q, k, qw, kw = d(N, H * E), d(N, K * E), d(E), d(E)
    ang = rng.uniform(0, 6.3, (N, E)).astype(np.float32)
    cos, sin = backend.to_device(np.cos(ang)), backend.to_device(np.sin(ang))
    k2, qg1, qg2 = k.copy(), d(K, N, H // K * E), d(K, N, H // K * E)
    kernels.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, qg1)
    kernels.qk_norm_rope_np(q, k2, qw, kw, cos, sin, 1e-6, qg2)
    errs["qk_norm_rope"] = max(rel(qg1, qg2), rel(k, k2))
    s1 = d(300, 173, scale=20.0)
    s2, i1, i2 = s1.copy(), d(300), d(300)
    kernels.softmax_rows(s1, 0.088, i1)
    kernels.softmax_rows_np(s2, 0.088, i2)
    errs["softmax_rows"] = max(rel(s1, s2), rel(i1, i2))
    g1, u = d(N, 3072, scale=4.0), d(N, 3072)
    g2 = g1.copy()
    errs["swiglu"] = rel(kernels.swiglu(g1, u), kernels.swiglu_np(g2, u))
    return errs


def produce(device_checks: bool = True) -> tuple[dict, dict]:
    """Every output of the cases above as numpy arrays, and the meta dict. Runs under whatever
    backend this process has (the parent test calls it too, on the numpy backend, without the
    device checks: transfers per step, backend.matmul and the kernels against their twins)."""
    from omnicore import OmniVoice
    from omnicore.machinery import settings
    from omnicore.model import backend
    from omnicore.model import higgs_codec
    from omnicore_testing import transfers as counter

    settings.configure()
    counter.start()
    out, meta, timings = {}, {"backend": backend.name()}, {}
    t0 = time.perf_counter()
    model = OmniVoice.from_pretrained(TINY)
    timings["load"] = time.perf_counter() - t0

    for name in FIXTURE_CASES:
        t0 = time.perf_counter()
        inp, kwargs = fixture_inputs(name)
        r = model.synthesize(**inp, **kwargs)[0]
        out[f"{name}/codes"], out[f"{name}/audio"] = r.codes, r.audio
        # The fast profile: with its knobs at 1 (exact's codes), and reusing rows (FAST_KW)
        for key, fast in (("codes_fast1", dict(prefix_refresh=1, uncond_every=1)), ("codes_fast", FAST_KW)):
            out[f"{name}/{key}"] = model.synthesize(**inp, **kwargs, profile="fast", **fast)[0].codes
        timings[name] = time.perf_counter() - t0

    t0 = time.perf_counter()
    z = np.load(REF / "generate_clone_prompt.npz", allow_pickle=False)
    inp = json.loads(str(z["inputs_json"]))
    p = model.create_voice_clone_prompt(str(ROOT / inp["ref_audio"]), ref_text=inp["ref_text"],
                                        preprocess_prompt=inp["preprocess_prompt"])
    out["clone_prompt/codes"] = p.ref_audio_tokens
    timings["clone_prompt"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    res = model.synthesize(BATCH_TEXTS, **BATCH_KW)
    for i, r in enumerate(res):
        out[f"batch/codes_{i}"], out[f"batch/audio_{i}"] = r.codes, r.audio
    timings["batch"] = time.perf_counter() - t0

    for i, c in enumerate(model.generate_codes(BATCH_TEXTS[:2], **CLASS_KW)):
        out[f"class_sampled/codes_{i}"] = c

    t0 = time.perf_counter()
    pieces = list(model.stream(STREAM_TEXT, **STREAM_KW))
    out["stream/audio"] = np.concatenate(pieces)
    out["stream/pieces"] = np.array([len(x) for x in pieces])
    timings["stream"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    for mode in LIVE_MODES:
        voice = {"auto": {}, "design": {"instruct": "female, low pitch"},
                 "clone": {"voice_clone_prompt": p}}[mode]
        for key, kw in LIVE_STREAMS.items():
            st = model.stream(STREAM_TEXT, **STREAM_KW, **voice, **kw)
            list(st)
            out[f"live_{mode}/{key}"] = np.concatenate([c["codes"] for c in st.chunk_stats], axis=1)
            out[f"live_{mode}/{key}_chunk0"] = st.chunk_stats[0]["codes"]
    timings["live"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    dec = np.load(REF / "codec_decode.npz")
    codec = model.codec
    for key in ("50", "batch"):
        out[f"decode/wav_{key}"] = higgs_codec.decode(codec.params, dec[f"codes_{key}"], codec.cfg)
    out["decode/wav_chunked_50"] = higgs_codec.decode_chunked(codec.params, dec["codes_50"], codec.cfg,
                                                        chunk_frames=20)
    enc = np.load(REF / "codec_encode.npz")
    feats = higgs_codec.encode_features(codec.params, enc["input"], codec.cfg)
    out["encode/fused"] = feats["fused"]
    out["encode/codes"] = higgs_codec.quantize(codec.params, feats["fused"], codec.cfg)
    out["encode/codes_api"] = codec.encode(enc["input"], codec.sampling_rate)
    timings["codec"] = time.perf_counter() - t0

    # Transfers between the ends of consecutive engine iterations (a step's forward, scoring,
    # noise and id updates), read from the backend's counter on the engine thread through its
    # trace hook. The last iteration also copies each pass's codes and fill steps back once (its
    # retirement), so it is left out.
    t0 = time.perf_counter()
    transfers = {}
    for key, (texts, kw) in TRANSFER_RUNS.items() if device_checks else ():
        marks = []
        model.engine.trace = lambda ids: marks.append(counter.transfers())
        try:
            model.synthesize(texts, _decode=False, **kw)
        finally:
            model.engine.trace = None
        transfers[key] = [{k: b[k] - a[k] for k in a} for a, b in zip(marks[:-1], marks[1:-1])]
    meta["transfers_per_step"] = transfers
    timings["transfers"] = time.perf_counter() - t0

    # backend.matmul on the layouts the backbone hands it (transposed weights, batched
    # attention operands, strided views), against numpy's float64 product
    if device_checks:
        rng = np.random.default_rng(3)
        meta["matmul_rel_err"] = max(
            rel(backend.matmul(backend.to_device(a), backend.to_device(b)),
                np.matmul(a.astype(np.float64), b.astype(np.float64)))
            for a, b in matmul_cases(rng))
        meta["kernel_rel_err"] = kernel_errors(rng)
        meta["graphs"] = backend.graph_stats()
    if backend.name() == "strict":
        from omnicore_testing import strictxp

        meta["device_dtypes"] = sorted(strictxp.seen_dtypes())
    meta["timings"] = timings
    return out, meta


if __name__ == "__main__":
    arrays, info = produce()
    np.savez(sys.argv[1], meta=json.dumps(info), **arrays)
