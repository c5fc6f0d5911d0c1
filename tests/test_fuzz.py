"""Fuzzing what users and files can hand omnicore: whatever goes in, the only exceptions that come
out are omnicore.errors types (OmniCoreError subclasses), and what does come out is usable.

Targets (each a hypothesis test below, on the tiny checkpoint):
  * generation: text (any unicode: control characters, lone surrogates, over-long), instruct,
    language, seed, duration / speed, ref_text, the sampling knobs at float extremes, and keyword
    arguments of any name, type and value, through `synthesize` / `generate_codes` / `stream`
    (streamed text fragments of any kind too);
  * codes of any dtype, shape and value through `codec.decode`;
  * audio: in-memory arrays of any dtype / shape / value / sample rate through
    `create_voice_clone_prompt` and `codec.encode`; files of random or damaged bytes (truncated
    or rewritten WAV headers) through `loading.load_audio` and `create_voice_clone_prompt`;
  * voice prompts: mutated real .npz files through `VoiceClonePrompt.load`, then generation;
  * configs: mutated copies of the tiny checkpoint's two config.json files through the config
    classes, then through a full load, a short generation and an encode;
  * safetensors: random headers (random JSON, deep nesting, huge or negative numbers, bad dtypes)
    through `read_safetensors`, and mutated copies of the real checkpoint through the loader.
What test_text.py, test_audio.py, test_weights.py and test_pipeline.py already fuzz (the text
front-end's functions, float/int arrays through load_audio, raw random bytes as a safetensors
file, short text/instruct/language through generate_codes) is not repeated here.

Budget: every test draws a fixed number of examples with `derandomize=True` and no example
database, so CI runs the same examples every time, and the file runs in well under a minute on
2 cores. The expensive targets (a generation or an encode per example) skip the shrink phase: a
failure prints the drawn example as it is (still reproducible, since the draw is fixed) instead
of spending minutes re-running variants of a slow example.

Memory and work: a missing size limit shows up as an allocation of many GB, or as work out of
proportion to the example. Every call that could allocate in proportion to its input runs inside
`bounded()`: a soft RLIMIT_AS 2 GiB above the process's current address space (so such an
allocation fails at once with MemoryError, which is not a typed error, so the test fails instead
of the machine swapping). The work is counted, not timed, so a slow or emulated machine runs the
same checks: `typed()` adds up the tokens the engine runs for the call (every row of every pass,
every step) and fails past WORK_TOKENS. A wall-clock alarm remains only as a guard against a hang
(HANG_S, far past any example on any machine). The cap is set on this process, around one
example at a time, and restored after it; a subprocess per example would cost a model load each.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import resource
import signal
import struct
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from conftest import read_safetensors
from omnicore import OmniVoice, VoiceClonePrompt
from omnicore.audio import loading
from omnicore.model import backbone as bb
from omnicore.model.config import GenerationConfig, HiggsAudioV2TokenizerConfig, OmniVoiceConfig, Qwen3Config
from omnicore.errors import OmniCoreError, VoicePromptError
from omnicore.machinery import checkpoint
from omnicore.machinery.warmup import warm_up

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
MODEL_CONFIG = json.loads((TINY / "config.json").read_text("utf-8"))
CODEC_CONFIG = json.loads((TINY / "audio_tokenizer" / "config.json").read_text("utf-8"))

HEADROOM = 2 << 30  # bytes of address space an example may add: ~20x a tiny-model generation
# Engine tokens (every row of every pass, every step) one call may run. The heaviest examples
# drawn here run about 200 (text of any kind, 1 step); a size that nothing bounds (a duration of
# hours: 25 frames a second, a text past the limit) runs orders of magnitude more.
WORK_TOKENS = 5_000
# Only a hang trips this (a tiny example takes well under a second): never a slow machine.
HANG_S = 900
WORK = [0]  # engine tokens run for the call in progress (`watch`)
COUNTED = weakref.WeakKeyDictionary()  # engine -> its iterations counted into WORK so far
SHORT = dict(num_step=1, duration=0.08)  # 2 frames: generation at its cheapest

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
           HealthCheck.large_base_example, HealthCheck.function_scoped_fixture]


def budget(n: int, shrink: bool = True):
    """Fixed draw (derandomize, no database) of `n` examples; no shrinking for slow targets."""
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.reuse, Phase.generate)
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    phases=phases, suppress_health_check=_HEALTH)


class Overrun(Exception):
    """An example ran past HANG_S: a hang."""


def watch(m):
    """Count the tokens `m`'s engine runs into WORK (after each iteration, on its thread)."""
    engine = m.engine
    COUNTED[engine] = engine.iterations

    def count(ids):
        WORK[0] += engine.load().last_tokens
        COUNTED[engine] += 1
    engine.trace = count
    return m


def _counted_all() -> None:
    """Wait until every iteration run so far is in WORK: the engine counts an iteration after
    the call it served may have returned."""
    for engine in COUNTED:
        for _ in range(1000):  # an event wait (the engine's thread is a step behind at most)
            if COUNTED[engine] >= engine.iterations:
                break
            time.sleep(0.01)


def _address_space() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None  # no /proc: only the time limit applies


@contextlib.contextmanager
def bounded(seconds: float = HANG_S):
    """Run a block under a soft address-space cap (current + HEADROOM) and a hang guard."""
    old_limit = resource.getrlimit(resource.RLIMIT_AS)
    used = _address_space()
    if used is not None:
        cap = used + HEADROOM
        if old_limit[1] != resource.RLIM_INFINITY:
            cap = min(cap, old_limit[1])
        resource.setrlimit(resource.RLIMIT_AS, (cap, old_limit[1]))

    def overrun(signum, frame):
        raise Overrun(f"example still running after {seconds} s")

    old_handler = signal.signal(signal.SIGALRM, overrun)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        resource.setrlimit(resource.RLIMIT_AS, old_limit)


def typed(fn, *args, **kwargs):
    """fn(*args, **kwargs) under `bounded`, its engine work within WORK_TOKENS; None when it
    raised an OmniCoreError (which must say something). Any other exception propagates and
    fails the test. The outcome is recorded as a hypothesis event
    (--hypothesis-show-statistics shows how many examples got how far)."""
    name = getattr(fn, "__name__", "call")
    WORK[0] = 0
    with bounded():
        try:
            result, outcome = fn(*args, **kwargs), "ran"
        except OmniCoreError as exc:
            assert str(exc).strip(), f"{type(exc).__name__} without a message"
            result, outcome = None, type(exc).__name__
    _counted_all()  # (an exception of another kind has already failed the test)
    assert WORK[0] <= WORK_TOKENS, f"{name} ran {WORK[0]} engine tokens (budget {WORK_TOKENS})"
    event(f"{name}: {outcome}")
    return result


@pytest.fixture(scope="module")
def model():
    """The tiny model with its kernels compiled first: a cold kernel cache would put the compile
    (seconds to a minute on a slow machine) inside the first example's time limit."""
    model = OmniVoice.from_pretrained(TINY)
    warm_up(model, force=True)
    return watch(model)


def check_synthesis(out, cfg) -> None:
    """What a successful synthesize() must return: real codes (no MASK left), finite audio."""
    for s in out:
        codes = np.asarray(s.codes)
        assert codes.ndim == 2 and codes.shape[0] == cfg.num_audio_codebook and codes.shape[1] > 0
        assert codes.min() >= 0 and codes.max() < cfg.audio_mask_id, \
            f"codes outside [0, {cfg.audio_mask_id}): {codes.min()} .. {codes.max()}"
        assert s.audio.dtype == np.float32 and s.audio.ndim == 1
        assert np.isfinite(s.audio).all(), "non-finite audio"


def check_codes(codes, cfg) -> None:
    for c in codes:
        assert c.ndim == 2 and c.shape[0] == cfg.num_audio_codebook and c.shape[1] > 0
        assert c.min() >= 0 and c.max() < cfg.audio_mask_id, f"codes {c.min()} .. {c.max()}"


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

# Any unicode, lone surrogates and control characters included.
any_text = st.text(st.characters(exclude_categories=()), max_size=40)
# Over-long text: a random piece repeated up to past the 20,000-character limit.
huge_text = st.builds(lambda s, n: (s * (n // max(1, len(s)) + 1))[:n],
                      st.text(st.characters(exclude_categories=()), min_size=1, max_size=12),
                      st.sampled_from([5_000, 19_999, 20_000, 20_001, 100_000]))

odd_ints = st.one_of(st.integers(-3, 3), st.integers(2**31 - 2, 2**31 + 2),
                     st.integers(2**63 - 2, 2**64 + 2), st.integers(-(2**64), -(2**63)),
                     st.sampled_from([2**1024, -(2**1024), 10**400]))
odd_floats = st.one_of(st.floats(), st.sampled_from([
    0.0, -0.0, 5e-324, 1e-300, 1e-45, 1e-10, 1e10, 1e38, 3.5e38, 1e300, 1.7976931348623157e308,
    -1e300, math.nan, math.inf, -math.inf]))
numpy_scalars = st.one_of(
    odd_floats.map(np.float32), odd_floats.map(np.float64), st.integers(-2**31, 2**31 - 1).map(np.int32),
    st.integers(-2**63, 2**63 - 1).map(np.int64), st.booleans().map(np.bool_))
scalars = st.one_of(st.none(), st.booleans(), odd_ints, odd_floats, any_text, st.binary(max_size=8),
                    numpy_scalars)
# Any value a caller could pass: scalars, and lists / tuples / dicts of them.
junk = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)
# Values that survive a JSON round trip (config.json, npz meta): NaN/Infinity included, since
# Python's json module writes and reads them.
json_junk = st.recursive(
    st.one_of(st.none(), st.booleans(), odd_ints, odd_floats, any_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)

DTYPES = ["float16", "float32", "float64", "longdouble", "int8", "int16", "int32", "int64", "uint8",
          "uint16", "uint32", "uint64", "bool", "complex64", "object", "U3", "S3", "V4"]

# A usual value for every keyword of `synthesize` (num_step at most 3: larger valid values only
# cost time, 30 ms a step here).
USUAL = {
    "num_step": st.integers(1, 3), "guidance_scale": st.floats(0, 5), "t_shift": st.floats(0.01, 1),
    "layer_penalty_factor": st.floats(0, 10), "position_temperature": st.floats(0, 10),
    "class_temperature": st.floats(0, 2), "denoise": st.booleans(), "preprocess_prompt": st.booleans(),
    "postprocess_output": st.booleans(), "audio_chunk_duration": st.floats(0.1, 20),
    "audio_chunk_threshold": st.floats(0.1, 40), "pad_duration": st.floats(0, 1),
    "fade_duration": st.floats(0, 1), "profile": st.sampled_from(["exact", "fast", "live"]),
    "prefix_refresh": st.integers(1, 3), "uncond_every": st.integers(1, 3),
    "first_chunk_steps": st.integers(0, 3), "first_chunk_seconds": st.floats(0.5, 3),
    "first_chunk_max_seconds": st.sampled_from([0.0, 0.5, 2.0, 6.0]),
    "first_audio_seconds": st.sampled_from([0.0, 0.5, 3.5]),
    "language": st.sampled_from([None, "en", "zh", "French"]),
    "instruct": st.sampled_from([None, "female", "male, low pitch, british accent"]),
    "duration": st.floats(0.04, 0.3), "speed": st.floats(0.5, 2), "seed": st.integers(0, 2**64 - 1),
    "on_step": st.sampled_from([None, lambda step, total: None]), "ref_text": st.none(),
    "ref_audio": st.none(), "voice_clone_prompt": st.none(),
    "generation_config": st.one_of(st.none(), st.builds(GenerationConfig, num_step=st.integers(1, 3))),
}
assert set(USUAL) >= set(GenerationConfig.__dataclass_fields__), "a new knob needs a usual value"


@st.composite
def kwarg_dicts(draw):
    """Up to 4 keyword arguments: known names (half of them with a usual value, half with
    anything) and unknown names."""
    names = draw(st.lists(st.one_of(st.sampled_from(sorted(USUAL)), st.text(max_size=10)),
                          max_size=4, unique=True))
    kwargs = {}
    for name in names:
        if name.startswith("_"):
            continue  # private parameters (`_decode`) are not part of the API
        value = draw(st.one_of(USUAL[name], junk) if name in USUAL else junk)
        if name == "num_step" and isinstance(value, int) and not isinstance(value, bool) and 4 <= value <= 1000:
            value = 3
        kwargs[name] = value
    return kwargs


# ---------------------------------------------------------------------------------------------
# Generation inputs
# ---------------------------------------------------------------------------------------------


@budget(40, shrink=False)
@given(text=st.one_of(any_text, huge_text, junk, st.lists(any_text, min_size=1, max_size=3)))
@example(text="word " * 4000)  # the longest valid text, all of it in one 2-frame pass
def test_text_of_any_kind(model, text):
    codes = typed(model.generate_codes, text, **SHORT)
    if codes is not None:
        check_codes(codes, model.config)


@budget(25, shrink=False)
@given(instruct=st.one_of(any_text, junk))
def test_instruct_of_any_kind(model, instruct):
    codes = typed(model.generate_codes, "Hello there.", instruct=instruct, **SHORT)
    if codes is not None:
        check_codes(codes, model.config)


@budget(25, shrink=False)
@given(language=st.one_of(any_text, junk, st.sampled_from(["en", "zh", "English", "yue", ""])))
def test_language_of_any_kind(model, language):
    codes = typed(model.generate_codes, ["Hello.", "Bonjour."], language=language, **SHORT)
    if codes is not None:
        check_codes(codes, model.config)


@budget(30, shrink=False)
@given(seed=st.one_of(odd_ints, junk, st.lists(odd_ints, min_size=1, max_size=3),
                      st.integers(0, 2**32)))
def test_seed_of_any_kind(model, seed):
    # position_temperature > 0 (the default) so the seed is used
    codes = typed(model.generate_codes, ["Hello.", "Hi."], seed=seed, **SHORT)
    if codes is not None:
        check_codes(codes, model.config)


@budget(40, shrink=False)
@example(duration=2**1024, speed=None, text="Hi.")  # too big for a float
@example(duration=None, speed=10**400, text="Hi.")
@example(duration=None, speed=5e-324, text="Hi.")  # frames = estimate / speed overflows
@given(duration=st.one_of(st.none(), odd_floats, odd_ints, junk, st.floats(0.01, 0.3)),
       speed=st.one_of(st.none(), odd_floats, odd_ints, junk, st.floats(0.5, 3.0)),
       text=st.sampled_from(["Hi.", "A longer sentence, with a pause. And a second one!"]))
def test_duration_and_speed_of_any_kind(model, duration, speed, text):
    codes = typed(model.generate_codes, text, duration=duration, speed=speed, num_step=1)
    if codes is not None:
        check_codes(codes, model.config)


@budget(30, shrink=False)
@given(kwargs=kwarg_dicts(), text=st.one_of(st.just("Hello there."), st.just(["Hello.", "Hi there."])))
def test_generation_kwargs_of_any_kind(model, kwargs, text):
    out = typed(model.synthesize, text, **{**SHORT, **kwargs})
    if out is not None:
        check_synthesis(out, model.config)


@budget(20, shrink=False)
@given(kwargs=kwarg_dicts())
def test_stream_kwargs_of_any_kind(model, kwargs):
    def consume():
        return [np.asarray(p) for p in model.stream("Hello there.", **{**SHORT, **kwargs})]

    pieces = typed(consume)
    if pieces is not None:
        assert all(p.dtype == np.float32 and p.ndim == 1 and np.isfinite(p).all() for p in pieces)


def _knobs(**kw):
    return dict(dict(num_step=3, guidance_scale=2.0, t_shift=0.1, layer_penalty_factor=5.0,
                     position_temperature=5.0, class_temperature=0.0), **kw)


@budget(15, shrink=False)
@example(**_knobs(guidance_scale=1e308))
@example(**_knobs(layer_penalty_factor=1e308))
@example(**_knobs(position_temperature=1e-40))  # 0 in float32
@example(**_knobs(class_temperature=1e-40))
@example(**_knobs(t_shift=1e308))
@given(num_step=st.integers(1, 3), guidance_scale=odd_floats, t_shift=odd_floats,
       layer_penalty_factor=odd_floats, position_temperature=odd_floats,
       class_temperature=odd_floats)
def test_sampling_knobs_at_extremes(model, **knobs):
    """Every numeric knob at once at extreme values: typed refusal, or real codes (the scoring
    runs in float32: an overflow to inf/NaN there must not leave MASK cells or crash)."""
    codes = typed(model.generate_codes, "Hello there.", duration=0.2, seed=0, **knobs)
    if codes is not None:
        check_codes(codes, model.config)


@budget(20, shrink=False)
@given(ref_text=st.one_of(any_text, huge_text, junk), preprocess=st.booleans())
def test_ref_text_of_any_kind(model, ref_text, preprocess):
    """The transcript goes into every prompt row next to the text: through the prompt maker,
    then through a generation with the prompt (an over-long one must be refused up front)."""
    clip = (0.2 * np.sin(np.arange(12000) / 5.0)).astype(np.float32)  # 0.5 s
    prompt = typed(model.create_voice_clone_prompt, (clip, 24000), ref_text=ref_text,
                   preprocess_prompt=preprocess)
    if prompt is not None:
        assert isinstance(prompt.ref_text, str)
        out = typed(model.synthesize, "Hello there.", voice_clone_prompt=prompt, **SHORT)
        if out is not None:
            check_synthesis(out, model.config)


@budget(12, shrink=False)
@given(fragments=st.lists(st.one_of(any_text, any_text, junk, st.sampled_from(
           ["a" * 20_000, "word, " * 10, "\u3002" * 30])), min_size=1, max_size=4),
       decode_frames=st.one_of(st.just(25), st.integers(1, 3), junk),
       lookahead=st.one_of(st.just(1), st.integers(0, 3), junk))
def test_stream_text_fragments_of_any_kind(model, fragments, decode_frames, lookahead):
    """Streamed text input: fragments of any kind (a reader thread chunks them; errors it meets
    come out of next()), one unbroken 20,000-character run among them, and the stream's own
    arguments of any value. (The total is kept small: a stream has no total length limit, and a
    long one only takes long.)"""
    def consume():
        stream = model.stream(iter(fragments), num_step=1, decode_frames=decode_frames,
                              lookahead=lookahead)
        return [np.asarray(p) for p in stream]

    pieces = typed(consume)
    if pieces is not None:
        assert all(p.dtype == np.float32 and p.ndim == 1 and np.isfinite(p).all() for p in pieces)


@st.composite
def code_arrays(draw):
    """Codes for the decoder: usual [C, T] / [B, C, T] int arrays, or any dtype, shape, value."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(8, 3), (1, 8, 2), (2, 8, 3), (4, 5), (0, 8, 3), (8, 0)]))
        dtype = draw(st.sampled_from(["int64", "int32", "int16", "uint16", "float64"]))
        return rng.integers(0, 1024, shape).astype(dtype)
    shape = draw(st.lists(st.integers(0, 9), max_size=4).map(tuple))
    lo, hi = draw(st.sampled_from([(0, 1023), (1024, 1024), (-3, -1), (-2**62, 2**62)]))
    arr = rng.integers(lo, hi, shape, endpoint=True)
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    with np.errstate(all="ignore"):
        arr = arr.astype(dtype) if dtype.kind not in "fc" else arr * draw(st.sampled_from([1.0, 0.5, np.nan]))
    return draw(st.one_of(st.just(arr), st.just(arr.tolist()), junk))


@budget(30)
@given(codes=code_arrays())
def test_codec_decode_any_codes(model, codes):
    wav = typed(model.codec.decode, codes)
    if wav is not None:
        arr = np.asarray(codes)
        assert wav.dtype == np.float32 and np.isfinite(wav).all()
        assert wav.shape[-1] == arr.shape[-1] * model.codec.hop_length


# ---------------------------------------------------------------------------------------------
# Audio: arrays and files
# ---------------------------------------------------------------------------------------------

COMMON_RATES = [8000, 16000, 22050, 24000, 44100, 48000]
ODD_RATES = st.one_of(
    st.sampled_from([1, 7, 7919, 96000, 192000, 999_999, 1_000_000, 1_000_001]),
    odd_ints, odd_floats, st.integers(8000, 48000).map(np.int64), st.just(np.float32(24000.0)),
    st.sampled_from([None, True, "24000", b"24000", (24000,), [24000]]))


def _signal(rng, shape, scale) -> np.ndarray:
    return rng.standard_normal(shape) * scale


@st.composite
def audio_inputs(draw):
    """(samples, sample_rate). Half of the draws are plausible clips (float / int16, mono or
    stereo either way round, 0.1-1.2 s at a usual rate), so that the encoder runs; the others
    are anything: any dtype (object, strings, complex, bool, every int width), any shape (0-d,
    empty, 3-D, 70 channels), values from silence to 1e30 with NaN / inf, any rate value."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if draw(st.booleans()):
        sr = draw(st.sampled_from(COMMON_RATES))
        n = int(sr * draw(st.floats(0.1, 1.2)))
        shape = draw(st.sampled_from([(n,), (1, n), (2, n), (n, 2)]))
        dtype = np.dtype(draw(st.sampled_from(["float32", "float64", "int16"])))
        values = _signal(rng, shape, draw(st.sampled_from([0.1, 0.5])))
        if draw(st.integers(0, 3)) == 0:  # one bad sample
            values.reshape(-1)[rng.integers(0, values.size)] = draw(st.sampled_from([np.nan, np.inf]))
    else:
        sr = draw(st.one_of(st.sampled_from(COMMON_RATES), ODD_RATES))
        if draw(st.integers(0, 4)) == 0:
            return draw(junk), sr
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = draw(st.one_of(
            st.just(()), st.tuples(st.integers(0, 30_000)),
            st.tuples(st.integers(0, 3), st.integers(0, 9_000)),
            st.tuples(st.integers(0, 9_000), st.integers(0, 3)),
            st.tuples(st.integers(60, 80), st.integers(0, 300)),
            st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 500))))
        values = _signal(rng, shape, draw(st.sampled_from([0.0, 1e-30, 1e-4, 0.1, 1.0, 1e3, 1e30])))
        if draw(st.booleans()) and values.size:
            spots = rng.integers(0, values.size, draw(st.integers(1, 3)))
            values.reshape(-1)[spots] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    if dtype.kind in "iu":
        if dtype == np.int16:  # int16 PCM of the same signal
            return (np.clip(np.nan_to_num(values), -1, 1) * 32767).astype(np.int16), sr
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True), sr
    if dtype.kind == "b":
        return values > 0, sr
    with np.errstate(all="ignore"):
        return values.astype(dtype), sr


@budget(24, shrink=False)
@given(clip=audio_inputs(), preprocess=st.booleans())
@example(clip=(np.full(4800, 0.1, np.float32), 10**400), preprocess=True)  # too big for a float
def test_voice_clone_prompt_from_any_array(model, clip, preprocess):
    prompt = typed(model.create_voice_clone_prompt, clip, ref_text="Hello there.",
                   preprocess_prompt=preprocess)
    if prompt is not None:
        tokens = prompt.ref_audio_tokens
        assert tokens.dtype == np.int64 and tokens.shape[0] == model.config.num_audio_codebook
        assert tokens.shape[1] > 0 and tokens.min() >= 0 and tokens.max() < 1024
        assert math.isfinite(prompt.ref_rms) and prompt.ref_rms >= 0


@budget(25, shrink=False)
@given(clip=audio_inputs())
@example(clip=(np.full(4800, 0.1, np.float32), 10**400))
def test_codec_encode_any_array(model, clip):
    codes = typed(model.codec.encode, *clip)
    if codes is not None:
        assert codes.dtype == np.int64 and codes.ndim == 2 and codes.shape[1] > 0
        assert codes.min() >= 0 and codes.max() < model.codec.cfg.codebook_size


def _wav_bytes(n: int, sr: int = 16000, channels: int = 1, subtype: str = "PCM_16") -> bytes:
    t = np.arange(n) / sr
    x = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.stack([x] * channels, axis=1), sr, format="WAV", subtype=subtype)
    return buf.getvalue()


@st.composite
def audio_files(draw):
    """Bytes of a file: random, a real WAV cut short, or a real WAV with header fields rewritten
    (channels, rate, byte rate, block align, bits per sample, chunk sizes)."""
    kind = draw(st.sampled_from(["random", "truncated", "header", "header", "riff-junk"]))
    if kind == "random":
        return draw(st.binary(max_size=2000))
    base = _wav_bytes(draw(st.integers(0, 12_000)),
                      channels=draw(st.sampled_from([1, 2])),
                      subtype=draw(st.sampled_from(["PCM_16", "PCM_U8", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"])))
    if kind == "truncated":
        return base[:draw(st.integers(0, len(base)))]
    if kind == "riff-junk":
        return base[:12] + draw(st.binary(max_size=300))
    data = bytearray(base)
    # canonical 44-byte header: (offset, struct format) of each numeric field
    fields = [(4, "<I"), (16, "<I"), (20, "<H"), (22, "<H"), (24, "<I"), (28, "<I"), (32, "<H"),
              (34, "<H"), (40, "<I")]
    for _ in range(draw(st.integers(1, 3))):
        off, fmt = draw(st.sampled_from(fields))
        top = 2 ** (8 * struct.calcsize(fmt)) - 1
        value = draw(st.one_of(st.sampled_from([0, 1, 2, 3, 7, 8, 100, 255, 65535, top]),
                               st.integers(0, top)))
        struct.pack_into(fmt, data, off, value)
    return bytes(data)


@budget(40, shrink=False)
@given(data=audio_files())
def test_audio_files_of_any_bytes(model, tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz-audio") / "clip.wav"
    path.write_bytes(data)
    wav = typed(loading.load_audio, path)
    if wav is not None:
        assert wav.dtype == np.float32 and wav.ndim == 1 and wav.size > 0 and np.isfinite(wav).all()
    prompt = typed(model.create_voice_clone_prompt, str(path), ref_text="Hello there.")
    if prompt is not None:
        assert prompt.ref_audio_tokens.shape[0] == model.config.num_audio_codebook
        assert math.isfinite(prompt.ref_rms) and prompt.ref_rms >= 0


# ---------------------------------------------------------------------------------------------
# Voice prompt files
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompt_parts(model):
    """A real voice prompt (codes [8, R], transcript, loudness) to mutate."""
    rng = np.random.default_rng(0)
    t = np.arange(24000) / 24000
    clip = (0.2 * np.sin(2 * np.pi * 150 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
    return model.create_voice_clone_prompt((clip, 24000), ref_text="A short reference.")


def _prompt_arrays(prompt) -> dict:
    """The arrays VoiceClonePrompt.save writes, with meta still a dict (edited, then encoded)."""
    meta = {"format": "omnicore-voice-prompt", "version": 1, "ref_text": prompt.ref_text,
            "ref_rms": prompt.ref_rms}
    return {"ref_audio_tokens": prompt.ref_audio_tokens.copy(), "meta": meta}


BENIGN_PROMPT_EDITS = st.one_of(
    st.tuples(st.just("tokens"), st.sampled_from(["int16", "int32", "int64", "uint16"]),
              st.tuples(st.just(8), st.integers(1, 60)), st.just("valid"), st.integers(0, 2**16)),
    st.tuples(st.just("meta"), st.just("extra"), json_junk),
    st.tuples(st.just("meta"), st.just("ref_text"), st.text(max_size=60)),
    st.tuples(st.just("meta"), st.just("ref_rms"), st.floats(1e-4, 1.0)),
    st.tuples(st.just("array-key"), st.just("extra")))


@st.composite
def prompt_mutations(draw):
    """A list of edits to a real prompt's arrays / meta / bytes: half of the draws only edits a
    valid prompt may have (other codes, transcript, loudness, extra keys), so that generation
    runs on them; the others anything."""
    if draw(st.booleans()):
        return draw(st.lists(BENIGN_PROMPT_EDITS, min_size=1, max_size=3))
    return draw(st.lists(st.one_of(
        st.tuples(st.just("tokens"), st.sampled_from(DTYPES[:13]),
                  st.one_of(st.just(()), st.lists(st.integers(0, 10), min_size=1, max_size=3).map(tuple),
                            st.sampled_from([(8, 0), (0, 20), (8, 20_000), (7, 20), (9, 20), (1, 8, 20)])),
                  st.sampled_from(["valid", "mask", "negative", "huge", "random"]),
                  st.integers(0, 2**16)),
        st.tuples(st.just("meta"), st.sampled_from(["format", "version", "ref_text", "ref_rms", "extra"]),
                  st.one_of(json_junk, st.just(None), st.sampled_from([-1.0, 0.0, 1e38, 1e308, -0.05]))),
        st.tuples(st.just("drop-meta-key"), st.sampled_from(["format", "version", "ref_text", "ref_rms"])),
        st.tuples(st.just("meta-raw"), st.one_of(st.binary(max_size=40), json_junk.map(
            lambda v: json.dumps(v).encode()))),
        st.tuples(st.just("meta-array"), st.sampled_from(["2d", "float", "scalar", "empty"])),
        st.tuples(st.just("array-key"), st.sampled_from(["drop-tokens", "drop-meta", "extra"])),
        st.tuples(st.just("bytes"), st.integers(0, 2**31), st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("truncate"), st.integers(0, 2**31)),
    ), min_size=1, max_size=3))


def _write_mutated_prompt(path: Path, prompt, edits) -> None:
    arrays = _prompt_arrays(prompt)
    meta_raw = None
    byte_edits = []
    for edit in edits:
        kind = edit[0]
        if kind == "tokens":
            _, dtype, shape, values, seed = edit
            rng = np.random.default_rng(seed)
            lo, hi = {"valid": (0, 1023), "mask": (1024, 1024), "negative": (-5, -1),
                      "huge": (2**40, 2**62), "random": (-2**62, 2**62)}[values]
            vals = rng.integers(lo, hi, shape, endpoint=True)
            with np.errstate(all="ignore"):
                arrays["ref_audio_tokens"] = vals.astype(np.dtype(dtype))
        elif kind == "meta":
            arrays["meta"][edit[1]] = edit[2]
        elif kind == "drop-meta-key":
            arrays["meta"].pop(edit[1], None)
        elif kind == "meta-raw":
            meta_raw = np.frombuffer(edit[1], np.uint8)
        elif kind == "meta-array":
            good = np.frombuffer(json.dumps(arrays["meta"]).encode(), np.uint8)
            meta_raw = {"2d": good[None, :], "float": good.astype(np.float32), "scalar": np.uint8(7),
                        "empty": np.zeros(0, np.uint8)}[edit[1]]
        elif kind == "array-key":
            if edit[1] == "extra":
                arrays["__extra"] = np.arange(3)
            else:
                arrays[edit[1][5:]] = None
        else:
            byte_edits.append(edit)
    if isinstance(arrays.get("meta"), dict):
        arrays["meta"] = (meta_raw if meta_raw is not None else
                          np.frombuffer(json.dumps(arrays["meta"]).encode("utf-8", "surrogatepass"),
                                        np.uint8))
    with open(path, "wb") as f:
        np.savez(f, **{k: v for k, v in arrays.items() if v is not None})
    if byte_edits:
        data = bytearray(path.read_bytes())
        for edit in byte_edits:
            if edit[0] == "bytes":
                pos = edit[1] % max(1, len(data))
                data[pos:pos + len(edit[2])] = edit[2]
            else:
                del data[edit[1] % max(1, len(data)):]
        path.write_bytes(bytes(data))


@budget(20, shrink=False)
@given(edits=prompt_mutations())
def test_voice_prompt_files_of_any_content(model, prompt_parts, tmp_path_factory, edits):
    path = tmp_path_factory.mktemp("fuzz-prompt") / "voice.npz"
    _write_mutated_prompt(path, prompt_parts, edits)
    try:
        prompt = VoiceClonePrompt.load(path)
    except VoicePromptError as exc:
        assert str(exc).strip()
        return
    # what load() accepts is usable: values read from the file are checked there
    assert isinstance(prompt.ref_text, str)
    prompt.ref_text.encode("utf-8")  # a lone surrogate would fail only later, in the tokenizer
    assert math.isfinite(prompt.ref_rms) and prompt.ref_rms >= 0, f"ref_rms {prompt.ref_rms!r} loaded"
    out = typed(model.synthesize, "Hello there.", voice_clone_prompt=prompt, **SHORT)
    if out is not None:
        tokens = prompt.ref_audio_tokens
        # codes outside the codebooks would index other rows of the embedding table
        assert tokens.shape[0] == model.config.num_audio_codebook
        assert tokens.min() >= 0 and tokens.max() < model.config.audio_mask_id, \
            f"generation ran on reference codes {tokens.min()} .. {tokens.max()}"
        check_synthesis(out, model.config)


# ---------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------


def _key_paths(d, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _key_paths(v, prefix + (k,))


@st.composite
def mutated_config(draw, base: dict):
    """`base` with 1-3 edits: a value replaced by any JSON value, a key removed, a junk key added."""
    d = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_key_paths(d))))
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
        if op == "set":
            parent[path[-1]] = draw(st.one_of(json_junk, st.sampled_from(
                [0, -1, 1, 2, 3, 48, 10**6, 2**31, 2**63, 1e-300, 1e300, 0.5, "64", True, None, [], {}])))
        elif op == "delete":
            del parent[path[-1]]
        else:
            parent[draw(st.text(max_size=8))] = draw(json_junk)
    return d


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _positive_real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def check_llm_config(q: Qwen3Config) -> None:
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim"):
        assert _positive_int(getattr(q, name)), f"{name} = {getattr(q, name)!r} accepted"
    assert _positive_real(q.rms_norm_eps), f"rms_norm_eps = {q.rms_norm_eps!r} accepted"
    assert _positive_real(q.rope_theta), f"rope_theta = {q.rope_theta!r} accepted"


@budget(150)
@given(d=mutated_config(MODEL_CONFIG))
def test_model_config_dicts(d):
    try:
        cfg = OmniVoiceConfig.from_dict(d)
    except OmniCoreError as exc:
        assert str(exc).strip()
        return
    check_llm_config(cfg.llm_config)
    for name in ("audio_vocab_size", "num_audio_codebook"):
        assert _positive_int(getattr(cfg, name)), f"{name} = {getattr(cfg, name)!r} accepted"
    assert isinstance(cfg.audio_mask_id, int) and not isinstance(cfg.audio_mask_id, bool)
    assert 0 <= cfg.audio_mask_id < cfg.audio_vocab_size


@budget(150)
@given(d=mutated_config(CODEC_CONFIG))
def test_codec_config_dicts(d):
    try:
        cfg = HiggsAudioV2TokenizerConfig.from_dict(d)
    except OmniCoreError as exc:
        assert str(exc).strip()
        return
    for name in ("sample_rate", "semantic_sample_rate", "downsample_factor", "codebook_size",
                 "codebook_dim", "kernel_size", "unit_kernel_size"):
        assert _positive_int(getattr(cfg, name)), f"{name} = {getattr(cfg, name)!r} accepted"
    dac, hub = cfg.acoustic_model_config, cfg.semantic_model_config
    for obj, names in ((dac, ("encoder_hidden_size", "decoder_hidden_size", "hidden_size")),
                       (hub, ("hidden_size", "num_hidden_layers", "num_attention_heads",
                              "intermediate_size"))):
        for name in names:
            assert _positive_int(getattr(obj, name)), f"{name} = {getattr(obj, name)!r} accepted"
    assert _positive_real(hub.layer_norm_eps), f"layer_norm_eps = {hub.layer_norm_eps!r} accepted"
    assert cfg.hop_length > 0 and cfg.frame_rate > 0 and cfg.num_quantizers >= 1


def _checkpoint_copy(folder: Path, model_cfg: dict | None = None, codec_cfg: dict | None = None) -> Path:
    """The tiny checkpoint as symlinks, with the given config.json contents written in."""
    (folder / "audio_tokenizer").mkdir(parents=True)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).symlink_to(TINY / name)
    for name in ("model.safetensors", "preprocessor_config.json"):
        (folder / "audio_tokenizer" / name).symlink_to(TINY / "audio_tokenizer" / name)
    (folder / "config.json").write_text(json.dumps(model_cfg or MODEL_CONFIG))
    (folder / "audio_tokenizer" / "config.json").write_text(json.dumps(codec_cfg or CODEC_CONFIG))
    return folder


@budget(8, shrink=False)
@given(model_cfg=st.one_of(st.none(), mutated_config(MODEL_CONFIG)),
       codec_cfg=st.one_of(st.none(), mutated_config(CODEC_CONFIG)))
def test_checkpoints_with_mutated_configs_load_and_run_or_refuse(tmp_path_factory, model_cfg, codec_cfg):
    folder = _checkpoint_copy(tmp_path_factory.mktemp("fuzz-ckpt"), model_cfg, codec_cfg)
    m = typed(OmniVoice.from_pretrained, str(folder))
    if m is None or typed(watch, m) is None:  # (its engine is made here)
        return
    out = typed(m.synthesize, "Hello there.", seed=0, **SHORT)
    if out is not None:
        check_synthesis(out, m.config)
    clip = (0.2 * np.sin(np.arange(24000) / 7.0)).astype(np.float32)
    codes = typed(m.codec.encode, clip, 24000)
    if codes is not None:
        assert codes.ndim == 2 and codes.shape[1] > 0 and codes.min() >= 0


# ---------------------------------------------------------------------------------------------
# safetensors headers
# ---------------------------------------------------------------------------------------------

ST_DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"]
ST_SIZES = dict(zip(ST_DTYPES, [4, 2, 2, 8, 8, 4, 2, 1, 1, 1]))
big_numbers = st.one_of(st.integers(-3, 40), st.sampled_from([-1, 2**31, 2**32, 2**40, 2**63 - 1, 2**63,
                                                            2**64, 2**64 + 8, 10**30, -(2**63)]))


@st.composite
def safetensors_files(draw):
    """(header bytes, data bytes): consistent headers of small tensors, then 0-3 entries or
    fields replaced by junk (bad dtypes, negative / huge / non-integer shapes and offsets,
    entries that are not objects, junk __metadata__)."""
    entries, offset = {}, 0
    for i in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from(ST_DTYPES))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        n = math.prod(shape) * ST_SIZES[dtype]
        entries[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    data = draw(st.binary(min_size=offset, max_size=offset)) + draw(st.binary(max_size=16))
    for _ in range(draw(st.integers(0, 3))):
        what = draw(st.sampled_from(["dtype", "shape", "data_offsets", "entry", "extra-field",
                                     "metadata", "new-entry"]))
        key = draw(st.sampled_from(sorted(entries))) if entries else "t0"
        entry = entries.setdefault(key, {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})
        if not isinstance(entry, dict):
            continue
        if what == "dtype":
            entry["dtype"] = draw(st.one_of(st.sampled_from(ST_DTYPES + ["F8_E4M3", "f32", "", "U64"]),
                                            json_junk))
        elif what == "shape":
            entry["shape"] = draw(st.one_of(st.lists(big_numbers, max_size=10), json_junk))
        elif what == "data_offsets":
            entry["data_offsets"] = draw(st.one_of(st.lists(big_numbers, max_size=3), json_junk))
        elif what == "entry":
            entries[key] = draw(json_junk)
        elif what == "extra-field":
            entry[draw(st.text(max_size=6))] = draw(json_junk)
        elif what == "metadata":
            entries["__metadata__"] = draw(json_junk)
        else:
            entries[draw(st.text(max_size=6))] = draw(json_junk)
    header = json.dumps(entries).encode("utf-8", "surrogatepass")
    return header, data


@budget(200)
@given(parts=safetensors_files(), length_delta=st.sampled_from([0, 0, 0, -1, 1, 2**40]))
def test_safetensors_headers(tmp_path_factory, parts, length_delta):
    header, data = parts
    path = tmp_path_factory.mktemp("fuzz-st") / "x.safetensors"
    path.write_bytes(struct.pack("<Q", max(0, len(header) + length_delta)) + header + data)
    try:
        with bounded():
            tensors = read_safetensors(path)
    except OmniCoreError as exc:
        assert str(exc).strip()
        return
    declared = json.loads(header)
    for key, arr in tensors.items():
        spec = declared[key]
        assert list(arr.shape) == spec["shape"]
        want = np.float32 if spec["dtype"] in ("F32", "F16", "BF16", "F64") else None
        if want is not None:
            assert arr.dtype == want


@budget(8)
@given(depth=st.sampled_from([100, 1_000, 10_000, 100_000, 1_000_000]),
       opener=st.sampled_from(["[", '{"a":', '{"a":[']))
def test_safetensors_deeply_nested_header(tmp_path_factory, depth, opener):
    closer = {"[": "]", '{"a":': "}", '{"a":[': "]}"}[opener]
    header = (opener * depth + "0" + closer * depth).encode()
    path = tmp_path_factory.mktemp("fuzz-st-deep") / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    typed(read_safetensors, path)  # a typed error (or an empty file's {}), never RecursionError


@pytest.fixture(scope="module")
def real_checkpoint():
    raw = (TINY / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


@budget(60, shrink=False)
@given(data=st.data())
def test_mutated_real_checkpoint_loads_or_refuses(tmp_path_factory, real_checkpoint, data):
    """One or two entries of the tiny checkpoint's own header changed; the loader (all keys and
    shapes checked against the config) gives a WeightsError or a working set of parameters."""
    header, body = copy.deepcopy(real_checkpoint[0]), real_checkpoint[1]
    keys = sorted(k for k in header if k != "__metadata__")
    for _ in range(data.draw(st.integers(1, 2))):
        key = data.draw(st.sampled_from(keys))
        field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", "rename", "drop"]))
        if field == "rename":
            header[key + data.draw(st.sampled_from([".x", "_", ""]))] = header.pop(key)
        elif field == "drop":
            header.pop(key)
        else:
            header[key][field] = data.draw(st.one_of(
                st.sampled_from(ST_DTYPES) if field == "dtype" else st.lists(big_numbers, max_size=4),
                json_junk))
        keys = sorted(k for k in header if k != "__metadata__")
        if not keys:
            break
    body = body[:data.draw(st.sampled_from([len(body), len(body), len(body) - 1, 4096, 0]))]
    raw = json.dumps(header).encode("utf-8", "surrogatepass")
    path = tmp_path_factory.mktemp("fuzz-ckpt-st") / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)
    cfg = OmniVoiceConfig.from_dict(MODEL_CONFIG)

    def load():
        reader = checkpoint.open_params(path)
        params = bb.load_params(reader, cfg)
        reader.finish()
        return params

    typed(load)
