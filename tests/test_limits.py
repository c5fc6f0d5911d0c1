"""Nothing may exhaust memory: every input that once asked for tens or hundreds of GiB is refused
with a typed error before anything large is allocated.

Each reproducer runs in a child process under a 3 GiB address-space limit and a time limit, so
a regression fails the test (MemoryError, a timeout) instead of taking the machine down. The
limits themselves live in omnicore.text; the memory estimate behind the per-pass budget is
checked against what a pass really allocates.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from omnicore import OmniVoice
from omnicore.text import limits
from omnicore.model import config as config_mod, cost, packed_unmasking, tokenizer as tok, unmasking
from omnicore.model.config import FRAME_RATE, GenerationConfig, OmniVoiceConfig
from omnicore.errors import InputError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "weights" / "tiny-random"
CHILD_MEMORY = 3 << 30  # address space of a child: far below what any reproducer used to want
CHILD_SECONDS = 60  # model load is ~2 s; a refusal must come at once

PARAGRAPH = "The quick brown fox jumps over the lazy dog, and the dog does not mind. " * 6


# The reproducers run one after another in one child interpreter (the tiny model loaded once,
# under the same limits): a fresh interpreter per reproducer cost a Python, Numba and model
# start each, eighteen times. A child that dies or runs past CHILD_SECONDS fails its test and
# is replaced, so the next test starts in a fresh one, as before.
_WORKER = textwrap.dedent("""
    import gc, json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({mem}, {mem}))
    import numpy as np
    from omnicore import OmniVoice, VoiceClonePrompt
    m = OmniVoice.from_pretrained({tiny!r})
    for line in sys.stdin:
        scope = dict(np=np, m=m, OmniVoice=OmniVoice, VoiceClonePrompt=VoiceClonePrompt)
        try:
            exec(json.loads(line), scope)
            out = {{"ok": repr(scope["result"])[:200]}}
        except BaseException as exc:
            out = {{"error": type(exc).__name__, "message": str(exc)}}
        del scope
        gc.collect()  # nothing one reproducer made is left to the next
        print("RESULT " + json.dumps(out), flush=True)
""").format(mem=CHILD_MEMORY, tiny=str(TINY))
_child: list = []  # the running child: (process, its stdout lines, its stderr file)


def _start_child():
    import queue
    import tempfile
    import threading

    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-c", _WORKER], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
    lines: queue.Queue = queue.Queue()

    def read():  # a thread, so that a hung child is noticed by the timeout below
        for ln in proc.stdout:
            lines.put(ln)
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    _child[:] = [(proc, lines, err)]


def _stop_child() -> str:
    """Kill the child; what it wrote to stderr."""
    proc, _, err = _child.pop()
    proc.kill()
    proc.wait()
    err.seek(0)
    return err.read().decode(errors="replace")


@pytest.fixture(scope="module", autouse=True)
def _child_ends_with_the_module():
    yield
    if _child:
        _stop_child()


def _in_child(body: str) -> dict:
    """Run `body` (which sets `result`) in the child interpreter, where the tiny model is loaded
    as `m`, under CHILD_MEMORY, within CHILD_SECONDS; returns {"error": type, "message": str}
    or {"ok": repr(result)}."""
    import queue
    import time

    if not _child:
        _start_child()
    proc, lines, _ = _child[0]
    proc.stdin.write(json.dumps(textwrap.dedent(body)) + "\n")
    proc.stdin.flush()
    deadline = time.monotonic() + CHILD_SECONDS + 30  # + the child's start (model load)
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:  # the child died, or ran past the time limit
            code = proc.poll()
            pytest.fail(f"child died (exit {code}) or ran past {CHILD_SECONDS} s:\n"
                        f"{_stop_child()[-3000:]}")
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])


def _refused(out: dict, *words: str, error: str = "InputError") -> None:
    assert out.get("error") == error, out
    for w in words:
        assert w in out["message"], out["message"]


# ---------------------------------------------------------------------------------------------
# The reproducers
# ---------------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_explicit_two_hour_duration_on_one_word():
    # Used to pass validation and ask for ~518 GiB of attention scores in one pass.
    out = _in_child("result = m.generate('Hello.', duration=7200)")
    _refused(out, f"{limits.MAX_PASS_S:g} s per pass", "punctuation")


@pytest.mark.subprocess
def test_demo_sized_duration_on_one_word():
    # duration=600 on one word: 5.4 GB and 41 s per step on the tiny model.
    out = _in_child("result = m.generate('Hello.', duration=600, num_step=1)")
    _refused(out, "per pass")


@pytest.mark.subprocess
def test_very_slow_speed_on_a_paragraph():
    # speed=1e-4 on a paragraph: about 1.2 TiB.
    out = _in_child(f"result = m.generate({PARAGRAPH!r}, speed=1e-4)")
    _refused(out, "minutes", f"{limits.MAX_DURATION_S / 60:g}")


@pytest.mark.subprocess
def test_huge_pad_duration():
    # pad_duration=1e6: 89 GiB of zeros.
    out = _in_child("result = m.generate('Hello.', pad_duration=1e6, num_step=1)")
    _refused(out, "pad_duration", f"{limits.MAX_EDGE_S:g}")
    out = _in_child("result = m.generate('Hello.', fade_duration=float('inf'), num_step=1)")
    _refused(out, "fade_duration")


@pytest.mark.subprocess
def test_huge_reference_transcript():
    # ref_text='word ' * 20000: 54 GiB.
    out = _in_child("""
        p = VoiceClonePrompt(np.zeros((8, 75), np.int64), 'word ' * 20000, 0.05)
        result = m.generate('Hello.', voice_clone_prompt=p, num_step=1)
    """)
    _refused(out, "ref_text", f"{limits.MAX_REF_TEXT_CHARS:,}")
    # with a clip to encode, the transcript is refused before the (costly) encode
    out = _in_child(f"""
        result = m.generate('Hello.', ref_audio={str(ROOT / 'tests/fixtures/audio/speech_24k.wav')!r},
                            ref_text='word ' * 20000, num_step=1)
    """)
    _refused(out, "ref_text")


@pytest.mark.subprocess
def test_voice_prompt_with_fifteen_thousand_frames(tmp_path):
    # A 125 KB npz with 15,000 reference frames ran out of memory.
    path = tmp_path / "long.npz"
    meta = {"format": "omnicore-voice-prompt", "version": 1, "ref_text": "Hi.", "ref_rms": 0.05}
    np.savez_compressed(path, ref_audio_tokens=np.zeros((8, 15_000), np.int64),
                        meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    out = _in_child(f"result = VoiceClonePrompt.load({str(path)!r})")
    # refused from its zip directory, before a byte is inflated: larger than any voice prompt
    _refused(out, "ref_audio_tokens.npy", "expanded", error="VoicePromptError")
    out = _in_child("""
        p = VoiceClonePrompt(np.zeros((8, 15_000), np.int64), 'Hi.', 0.05)
        result = m.generate('Hello.', voice_clone_prompt=p, num_step=1)
    """)
    _refused(out, "600.0 s", f"{limits.MAX_REF_S:g} s")


@pytest.mark.subprocess
def test_npz_declaring_a_giant_array_is_refused_from_its_header(tmp_path):
    # The header says [8, 10**9] (64 GB); the data is never read.
    path = tmp_path / "bomb.npz"
    meta = {"format": "omnicore-voice-prompt", "version": 1, "ref_text": "Hi.", "ref_rms": 0.05}
    np.savez(path, ref_audio_tokens=np.zeros((8, 4), np.int64),
             meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    import zipfile
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["ref_audio_tokens.npy"] = members["ref_audio_tokens.npy"].replace(
        b"(8, 4)", b"(8, 1000000000)")
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    out = _in_child(f"result = VoiceClonePrompt.load({str(path)!r})")
    _refused(out, "frames", error="VoicePromptError")


@pytest.mark.subprocess
def test_one_long_unpunctuated_sentence():
    # The reference never cuts a sentence: 900 words without a mark are one ~4.5-minute pass.
    words = " ".join(["word"] * 900)
    out = _in_child(f"result = m.generate({words!r}, num_step=1)")
    _refused(out, "per pass", "punctuation")


@pytest.mark.subprocess
def test_huge_chunk_threshold_keeps_long_text_in_one_pass():
    out = _in_child(f"result = m.generate({PARAGRAPH * 10!r}, audio_chunk_threshold=1e9, num_step=1)")
    _refused(out, "per pass")


@pytest.mark.subprocess
def test_stream_with_two_hour_duration_is_refused_at_the_call():
    out = _in_child("result = m.stream('Hello.', duration=7200)")
    _refused(out, "per pass")
    out = _in_child("result = list(m.stream(iter(['Hello ', 'there.']), speed=1e-3, num_step=1))")
    _refused(out, "per pass")


@pytest.mark.subprocess
def test_codec_decode_and_encode_lengths():
    out = _in_child("result = m.codec.decode(np.zeros((8, 10**6), np.int64))")
    _refused(out, "minutes", "in parts")
    out = _in_child("result = m.codec.encode(np.zeros(24000 * 600, np.float32), 24000)")
    _refused(out, "600.0 s", f"{limits.MAX_REF_S:g} s", error="AudioError")


@pytest.mark.subprocess
def test_reference_clip_over_the_limit_is_refused_before_encoding(tmp_path):
    rng = np.random.default_rng(0)
    clip = (0.1 * rng.standard_normal(24000 * 70)).astype(np.float32)  # 70 s of noise
    path = tmp_path / "clip.npy"
    np.save(path, clip)
    out = _in_child(f"""
        clip = np.load({str(path)!r})
        result = m.create_voice_clone_prompt((clip, 24000), 'Hi.', preprocess_prompt=False)
    """)
    _refused(out, "70.0 s", error="AudioError")


# ---------------------------------------------------------------------------------------------
# The limits and the memory estimate
# ---------------------------------------------------------------------------------------------


def _released_config() -> OmniVoiceConfig:
    """The dimensions of k2-fsa/OmniVoice (Qwen3-0.6B backbone)."""
    return OmniVoiceConfig.from_dict({"llm_config": {
        "vocab_size": 151676, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128}})


def test_budget_fits_normal_use_and_refuses_the_extremes():
    cfg = _released_config()
    # Default use: a 10 s clone reference, 30 s target, ~100 text tokens: well under 1 GB.
    normal = cost.forward_bytes(cfg, [100 + 250 + 750, 750], [750, 750])
    assert normal < 0.6e9
    # The longest pass with a 12 s reference fits the budget...
    longest = limits.MAX_PASS_FRAMES
    assert cost.check_pass_memory(cfg, [300 + 300 + longest, longest], [longest, longest])
    # ...but not with the longest reference and its transcript on top.
    with pytest.raises(InputError, match="GiB of working memory"):
        L = 1500 + limits.MAX_REF_FRAMES + longest
        cost.check_pass_memory(cfg, [L, longest], [longest, longest])


@pytest.mark.parametrize("frames,ref,class_temperature,guidance", [
    (100, 0, 0.0, 2.0), (1200, 0, 0.0, 2.0), (1200, 400, 0.0, 0.0), (800, 200, 0.7, 2.0)])
def test_memory_estimate_bounds_what_a_pass_allocates(frames, ref, class_temperature, guidance):
    """forward_bytes is an upper bound of a pass's peak allocations (numpy reports them to
    tracemalloc) in the loop the engine runs (packed_unmasking.iterate), and a close one
    (measured 75-90 %), so the budget means what it says."""
    m = _model()
    # three steps: a step's logits and scores overlap with the next step's forward
    gen = GenerationConfig(num_step=3, class_temperature=class_temperature,
                           guidance_scale=guidance)
    item = tok.prepare_item(m.tokenizer, m.config, "A pass whose memory is measured.", frames,
                            ref_text="Hi." if ref else None,
                            ref_codes=np.zeros((8, ref), np.int64) if ref else None)

    def run():  # the engine's loop: two passes packed, one cache, every step
        states = [unmasking.PassState(item, gen, 0, m.config) for _ in range(2)]
        cache = packed_unmasking.PackCache()
        for _ in range(gen.num_step):
            packed_unmasking.iterate(m.params, m.config, states, cache)

    run()  # compile first
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        run()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    L = item.input_ids.shape[1]
    rows, outs = ([L, L, frames, frames], [frames] * 4) if guidance else ([L, L], [frames] * 2)
    estimate = cost.forward_bytes(m.config, rows, outs, class_temperature > 0)
    assert peak <= estimate <= 1.5 * peak, (peak, estimate)


_MODEL = None


def _model():
    global _MODEL
    if _MODEL is None:
        _MODEL = OmniVoice.from_pretrained(TINY)
    return _MODEL


def test_batches_are_split_to_fit_the_budget_without_changing_results(monkeypatch):
    m = _model()
    texts = ["One short line.", "Another short line here.", "And a third one."]
    kw = dict(num_step=3, seed=5, position_temperature=0.0)
    together = m.generate_codes(texts, **kw)
    sizes = []  # passes per engine iteration

    _, _, specs, _ = m._passes(texts)
    biggest = max(cost.forward_bytes(m.config, [it.input_ids.shape[1], it.num_target],
                                  [it.num_target] * 2)
                  for it in (m.engine.prepare(s) for s in specs))
    monkeypatch.setattr(cost, "MAX_PASS_BYTES", int(biggest * 1.5))  # room for one item, not two
    monkeypatch.setattr(m.engine, "trace", lambda ids: sizes.append(len(ids)))
    split = m.generate_codes(texts, **kw)
    assert sizes and max(sizes) < len(texts)
    for a, b in zip(together, split):
        assert np.array_equal(a, b)
    monkeypatch.setattr(cost, "MAX_PASS_BYTES", 1000)  # not even one item fits: a typed refusal
    with pytest.raises(InputError, match="working memory"):
        m.generate_codes(texts, **kw)


def test_limits_are_consistent():
    assert limits.MAX_PASS_FRAMES == limits.MAX_PASS_S * FRAME_RATE
    assert limits.MAX_REF_FRAMES == limits.MAX_REF_S * FRAME_RATE
    # The reference's own plans (its chunking tests) stay within one pass.
    cases = json.loads((ROOT / "tests/fixtures/reference/text_cases.json").read_text("utf-8"))
    longest = max(c["frames"] for case in cases["plan"] for c in case["plan"]["chunks"])
    assert longest <= limits.MAX_PASS_FRAMES
    # The whole output of a call is bounded: one call's text at the slowest speed allowed by it.
    with pytest.raises(InputError):
        limits.check_total_frames(int(limits.MAX_DURATION_S * FRAME_RATE) + 1)
    assert limits.check_total_frames(int(limits.MAX_DURATION_S * FRAME_RATE))


@pytest.mark.subprocess
def test_text_too_long_for_its_duration():
    # All of a 20,000-character text in one 2-frame pass: ~12k prompt tokens in one row, a
    # 2.3 GB attention buffer on the tiny model (quadratic in the text).
    out = _in_child("result = m.generate_codes('word ' * 4000, duration=0.08, num_step=1)")
    _refused(out, f"{cost.MAX_PASS_POSITIONS:,}", "longer duration")


@pytest.mark.parametrize("knob,value", [
    ("guidance_scale", 1e308), ("layer_penalty_factor", 1e308), ("position_temperature", 1e-40),
    ("class_temperature", 1e-40), ("t_shift", 1e308), ("guidance_scale", config_mod.MAX_GUIDANCE * 2)])
def test_sampling_knobs_past_float32_range(knob, value):
    # Past these bounds the float32 scoring overflowed: MASK cells left in the output, or a NaN
    # schedule.
    m = _model()
    with pytest.raises(InputError, match=knob):
        m.generate_codes("Hello there.", duration=0.2, num_step=2, **{knob: value})
    with pytest.raises(InputError, match=knob):
        m.stream("Hello there.", num_step=2, **{knob: value})
    with pytest.raises(InputError, match=knob):
        unmasking.generate_codes(m.params, m.config, [tok.prepare_item(
            m.tokenizer, m.config, "Hi.", 3)], GenerationConfig(num_step=2, **{knob: value}))


def test_knobs_at_their_bounds_give_real_codes():
    m = _model()
    lo_t, hi_t = config_mod.TEMPERATURE_RANGE
    for knobs in (dict(guidance_scale=config_mod.MAX_GUIDANCE, layer_penalty_factor=config_mod.MAX_LAYER_PENALTY,
                       position_temperature=lo_t, class_temperature=lo_t, t_shift=config_mod.T_SHIFT_RANGE[1]),
                  dict(position_temperature=hi_t, class_temperature=hi_t, t_shift=config_mod.T_SHIFT_RANGE[0])):
        codes = m.generate_codes("Hello there.", duration=0.3, num_step=3, seed=0, **knobs)[0]
        assert codes.min() >= 0 and codes.max() < m.config.audio_mask_id, knobs


@pytest.mark.parametrize("kw", [dict(duration=2**1024), dict(speed=10**400), dict(speed=5e-324),
                                dict(duration=10**5000)])
def test_numbers_beyond_float_range(kw):
    with pytest.raises(InputError):
        _model().generate_codes("Hi.", num_step=1, **kw)
