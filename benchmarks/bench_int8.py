#!/usr/bin/env python3
"""The int8 precision profile (W8A8, approximate) against fp32, at full size, each part one
command whose ratios come from one process (the sides alternate, so a busy machine slows both).

    python3 benchmarks/bench_int8.py step      [--model DIR] [--reps 9] [--gen-reps 3]
    python3 benchmarks/bench_int8.py accuracy  [--model DIR] [--seconds 5]
    python3 benchmarks/bench_int8.py heads     [--model DIR] [--seconds 5]
    python3 benchmarks/bench_int8.py agreement [--model DIR] [--steps 16] [--seconds 4] [--heads]
    python3 benchmarks/bench_int8.py timeline  [--model DIR] --precision fp32|int8 [--reps 2]
    python3 benchmarks/bench_int8.py budget    [--model DIR] [--precision int8] [--budgets 3.5,2.0,1.5]

--model defaults to $OMNICORE_BENCH_MODEL, else checkpoints/full. Every line prints the load
average before and after it: on a shared machine the ratios hold better than the times.

step       the backbone step of a 5 s generate (a conditional row of the text and 125 MASK
           frames, the unconditional row of 125: 290 packed tokens), fp32, int8, and int8 with
           BLAS keeping its own threads (no `jit.one_pool`: two pools, as before it), in turn,
           min and median of --reps; the seven projections of one layer alone (the GEMMs the
           profile changes); then generate() at the fast profile for 5 s, greedy, alternating,
           median of --gen-reps after a warm-up each. Goals: step <= 0.4x, generate <= 0.5x.
accuracy   that step (all-MASK targets: a first step) against a float64 forward of the same
           checkpoint on the host (gpu/bench_gpu.py's `forward_f64`, the oracle of the tf32 /
           bf16 / fp16 rows): each layer's output (every layer fed the profile's own previous
           one, as accuracy_table.py does) as ||diff|| / ||float64||, the logits so and as
           max |diff| / max |float64|, and the share of cells whose argmax agrees with
           float64's; for fp32, bf16, int8 and int8 with the audio heads quantised too (the
           choice the profile does not make: docs/correctness.md). A markdown table last.
heads      the audio heads alone: fp32's final hidden states through float32 and through int8
           heads, against float64 heads on the same states (the heads' own error, apart from the
           layers' which swamps it above on random weights).
agreement  greedy codes (exact profile, --steps steps, --seconds of audio) of bf16 (the
           yardstick: a precision the real model runs in on GPUs), int8 (and with --heads of int8
           with int8 heads) against fp32's, in auto, design and clone mode: the share of cells
           equal (cells are chosen by confidence, so one early flip moves later choices; this
           is what the listener's codes see, not a per-step error).
timeline   `omnicore wyoming --precision P` at its default profile (live), a three-sentence
           reply of about 12 s sent whole (`synthesize`, default voice): when each audio chunk
           arrives; playing them back to back from the first, the silences a listener hears
           between chunks (the gap time), first audio, the whole reply. Goal (int8): gaps <= 12 s.
budget     the trade the live profile makes in chunk 0, in this process (`model.stream`, the
           doors' default voice `alloy` made here, the timeline's reply): for each
           first_audio_seconds in --budgets (chunk 0's unmasking budget; live's is 3.5), chunk
           0's frames, first audio, the gaps and the whole reply, the budgets in turn, --reps
           rounds. A smaller budget brings the first audio forward and leaves the later chunks
           less speech to hide behind.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

TEXT = ("Every evening the keeper climbed the narrow stairs, counted the steps out loud, and lit "
        "the lamp before the ships came in.")
GREEDY = dict(position_temperature=0.0, class_temperature=0.0)
REPLY = ("Sure, the living room lights are off now and the front door is locked. "
         "The thermostat is set to twenty-one degrees for the night, and it will warm up again at "
         "six thirty tomorrow morning. "
         "Tomorrow looks dry and mild, so you will not need an umbrella on your way to work.")
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
CLIP_TEXT = (ROOT / "tests" / "fixtures" / "audio" / "speech.txt").read_text().strip()
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load_line() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def say(msg: str) -> None:
    print(msg, flush=True)


def load(model_dir, precision: str, heads_int8: bool = False):
    """The model at `precision`; heads_int8: its audio heads quantised too (an experiment)."""
    from omnicore import OmniVoice
    from omnicore.model.int8_kernels import quantize_weight

    m = OmniVoice.from_pretrained(model_dir, precision=precision)
    if heads_int8:
        params = dataclasses.replace(m.params, audio_heads=quantize_weight(m.params.audio_heads))
        m = OmniVoice(m.model_dir, m.config, params, m.tokenizer, m.codec)
    return m


def step_rows(m, seconds: float = 5.0):
    """The ids, audio mask, packing and num_out of a generate's first step (all-MASK targets),
    as the engine prepares it."""
    from omnicore.engine import PassSpec
    from omnicore.model import backbone
    from omnicore.model.config import GenerationConfig

    T = round(seconds * m.frame_rate)
    item = m.engine.prepare(PassSpec(TEXT, T, "en", None, None, None, None,
                                     GenerationConfig(**GREEDY)))
    rows = [(item.input_ids, item.audio_mask), (item.uncond_ids, item.uncond_audio_mask)]
    ids = np.concatenate([r[0] for r in rows], axis=1)  # [C, S + T]
    mask = np.concatenate([r[1] for r in rows])
    pack = backbone.make_packing([r[0].shape[1] for r in rows], m.config)
    return rows, ids, mask, pack, T


def timed(fn, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# -- step -------------------------------------------------------------------------------------

def cmd_step(args):
    from omnicore.model import backbone

    from omnicore.model import jit

    say(f"# backbone step and generate(), fp32 against int8 ({args.model}); {load_line()}")
    models = {p: load(args.model, p) for p in ("fp32", "int8")}
    _, ids, mask, pack, T = step_rows(models["fp32"])
    cfg = models["fp32"].config
    works = {p: backbone.make_workspace(cfg, pack) for p in models}
    pooled = jit.one_pool

    def two_pools(on=True):  # the int8 forward as it ran before one_pool: BLAS keeps its threads
        return pooled(False)

    def forward(p):
        def run():
            jit.one_pool = two_pools if p == "int8, two pools" else pooled
            try:
                backbone.forward_rows(models[p[:4]].params, cfg, ids, mask, pack, [T, T],
                                      work=works[p[:4]])
            finally:
                jit.one_pool = pooled
        return run

    def projections(p):
        lp = models[p].params.layers[0]
        h = np.random.default_rng(0).standard_normal((pack.num_tokens, cfg.llm_config.hidden_size)
                                                     ).astype(np.float32)  # [N, D]
        f = np.random.default_rng(1).standard_normal(
            (pack.num_tokens, cfg.llm_config.intermediate_size)).astype(np.float32)  # [N, F]
        a = np.random.default_rng(2).standard_normal(
            (pack.num_tokens, lp.o_proj.n_in if p == "int8" else lp.o_proj.shape[1])
        ).astype(np.float32)  # [N, H*E]

        def run():
            for name in PROJECTIONS:
                x = f if name == "down_proj" else a if name == "o_proj" else h
                backbone.linear(x.copy(), getattr(lp, name), precision=p)
        return run

    for label, make, sides in (("backbone step", forward, ("fp32", "int8", "int8, two pools")),
                               ("7 projections of one layer", projections, tuple(models))):
        for p in sides:
            make(p)()  # warm: kernels compiled, pages touched
        got = {p: [] for p in sides}
        for _ in range(args.reps):
            for p in sides:
                got[p] += timed(make(p), 1)
        med = {p: statistics.median(v) for p, v in got.items()}
        say(f"{label}, {pack.num_tokens} tokens, median of {args.reps} (min): " + ", ".join(
            f"{p} {med[p] * 1e3:.0f} ms ({min(got[p]) * 1e3:.0f}), / fp32 "
            f"{med[p] / med['fp32']:.2f} (min/min {min(got[p]) / min(got['fp32']):.2f})"
            for p in sides) + f"; {load_line()}")

    def gen(p):
        return lambda: models[p].generate(TEXT, language="en", duration=5.0, profile="fast",
                                          **GREEDY)
    for p in models:  # warm: the generate path's kernels compiled (a short pass)
        models[p].generate(TEXT, language="en", duration=1.0, num_step=2, **GREEDY)
    got = {p: [] for p in models}
    for _ in range(args.gen_reps):
        for p in models:
            got[p] += timed(gen(p), 1)
    med = {p: statistics.median(v) for p, v in got.items()}
    say(f"generate() fast, 5 s, greedy: fp32 {med['fp32']:.2f} s (RTF {med['fp32'] / 5:.2f}), "
        f"int8 {med['int8']:.2f} s (RTF {med['int8'] / 5:.2f}); int8 / fp32 = "
        f"{med['int8'] / med['fp32']:.2f}; median of {args.gen_reps}; {load_line()}")


# -- accuracy ---------------------------------------------------------------------------------

def cmd_accuracy(args):
    from bench_gpu import forward_f64

    from omnicore.model import backbone

    say(f"# a first step against float64 ({args.model}, {args.seconds:g} s; cond + uncond rows); "
        f"{load_line()}")
    sides = (("fp32", "fp32", False), ("bf16", "bf16", False), ("int8", "int8", False),
             ("int8, heads int8 too", "int8", True))
    want = states = None
    table = {}
    for label, precision, heads in sides:
        m = load(args.model, precision, heads)
        rows, ids, mask, pack, T = step_rows(m, args.seconds)
        if want is None:  # the float64 forward of each row, its layers kept
            per_row = [[] for _ in rows]
            want = [forward_f64(Path(args.model) / "model.safetensors", m.config, r[0], r[1], T,
                                states=s) for r, s in zip(rows, per_row)]  # [C, T, V] per row
            states = [np.concatenate(layer) for layer in zip(*per_row)]  # [N, D] per stage
        col = table[label] = {}
        x = backbone.embed(m.params, m.config, ids, mask)  # [N, D]
        for i, lp in enumerate(m.params.layers):  # one layer at a time, on its own input
            one = dataclasses.replace(m.params, layers=(lp,))
            x = backbone.hidden_states(one, m.config, x, pack).copy()
            col[f"layer {i + 1}"] = rel_rms(x, states[i + 1])
        got = backbone.forward_rows(m.params, m.config, ids, mask, pack, [T, T])
        col["logits (rms)"] = rel_rms(np.stack(got), np.stack(want))
        col["logits (max)"] = max(float(np.abs(g - w).max() / np.abs(w).max())
                                  for g, w in zip(got, want))
        agree = float(np.mean([np.mean(g.argmax(-1) == w.argmax(-1)) for g, w in zip(got, want)]))
        col["argmax = float64's"] = f"{agree:.2%}"
        say(f"{label}: last layer {col[f'layer {len(m.params.layers)}']:.2e}, logits rms "
            f"{col['logits (rms)']:.2e}, max {col['logits (max)']:.2e}, argmax agrees with "
            f"float64 in {agree:.2%} of {2 * m.config.num_audio_codebook * T} cells; {load_line()}")
        del m, got
    names = list(table)
    say("\n| stage (relative error against float64) | " + " | ".join(names) + " |")
    say("|---|" + "---|" * len(names))
    for stage in table[names[0]]:
        cells = [v if isinstance(v, str) else f"{v:.2e}" for v in (table[n][stage] for n in names)]
        say(f"| {stage} | " + " | ".join(cells) + " |")


def rel_rms(got, want) -> float:
    """||got - want|| / ||want|| over every element (accuracy_table.py's pooled error)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(((got - want) ** 2).sum() / (want ** 2).sum()))


def cmd_heads(args):
    """The audio heads alone: the same final hidden states (fp32's) through float32 heads and
    through int8 heads, against those states through float64 heads."""
    from omnicore.model import backbone
    from omnicore.model.int8_kernels import quantize_weight

    say(f"# the audio heads alone ({args.model}, a first step of {args.seconds:g} s); {load_line()}")
    m = load(args.model, "fp32")
    _, ids, mask, pack, T = step_rows(m, args.seconds)
    cfg, params = m.config, m.params
    x = backbone.embed(params, cfg, ids, mask)
    h = backbone.hidden_states(params, cfg, x, pack)[pack.tail_index([T, T])].copy()  # [2T, D]
    hn = backbone.kernels.rms_norm(h, params.norm, cfg.llm_config.rms_norm_eps)  # [2T, D]
    want = hn.astype(np.float64) @ params.audio_heads.T.astype(np.float64)  # [2T, C*V]
    for label, heads in (("float32 heads", params.audio_heads),
                         ("int8 heads", quantize_weight(params.audio_heads))):
        got = backbone.linear(hn.copy(), heads, precision="int8")  # [2T, C*V]
        C, V = cfg.num_audio_codebook, cfg.audio_vocab_size
        agree = float(np.mean(got.reshape(-1, C, V).argmax(-1) == want.reshape(-1, C, V).argmax(-1)))
        say(f"{label}: logits ||diff|| / ||float64|| {rel_rms(got, want):.2e}, max |diff| / max "
            f"{float(np.abs(got - want).max() / np.abs(want).max()):.2e}, argmax agrees with the "
            f"float64 heads' in {agree:.2%} of {2 * C * T} cells; {load_line()}")


# -- agreement --------------------------------------------------------------------------------

def cmd_agreement(args):
    from omnicore import OmniVoice

    say(f"# greedy codes against fp32's ({args.model}; exact profile, {args.steps} steps, "
        f"{args.seconds:g} s); {load_line()}")
    modes = {"auto": {}, "design": {"instruct": "female, low pitch, british accent"},
             "clone": {"ref_audio": str(CLIP), "ref_text": CLIP_TEXT}}
    kw = dict(duration=args.seconds, num_step=args.steps, language="en", **GREEDY)
    ref = OmniVoice.from_pretrained(args.model)
    want = {mode: ref.generate_codes(TEXT, **kw, **extra)[0] for mode, extra in modes.items()}
    del ref
    sides = (("bf16 (the yardstick)", "bf16", False), ("int8", "int8", False))
    for label, precision, heads in sides + ((("int8, heads int8 too", "int8", True),)
                                            if args.heads else ()):
        m = load(args.model, precision, heads)
        cells = []
        for mode, extra in modes.items():
            got = m.generate_codes(TEXT, **kw, **extra)[0]
            same = float(np.mean(np.asarray(got) == np.asarray(want[mode])))
            cells.append(f"{mode} {same:.1%}")
        say(f"{label}: codes equal to fp32's: {', '.join(cells)} (of {np.asarray(got).size} "
            f"cells each); {load_line()}")
        del m


# -- timeline ---------------------------------------------------------------------------------

async def one_reply(port: int):
    """(first audio s, [(arrival s, audio s) per chunk], end s) of REPLY sent whole."""
    from wyoming.audio import AudioChunk
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    async with AsyncTcpClient("127.0.0.1", port) as client:
        t0 = time.perf_counter()
        await client.write_event(Synthesize(text=REPLY).event())
        chunks, rate, width, channels = [], 24000, 2, 1
        while True:
            event = await client.read_event()
            now = time.perf_counter() - t0
            if event is None:
                raise SystemExit("the server closed the connection")
            if AudioChunk.is_type(event.type):
                c = AudioChunk.from_event(event)
                rate, width, channels = c.rate, c.width, c.channels
                chunks.append((now, len(c.audio) / (rate * width * channels)))
            elif event.type == "audio-stop":
                return chunks, now


def playback(chunks):
    """Chunks played back to back from the first: (gap seconds, number of gaps, audio seconds).
    A chunk that arrives after the previous one has finished playing leaves a silence."""
    end, gaps, count, audio = None, 0.0, 0, 0.0
    for arrival, secs in chunks:
        if end is not None and arrival > end + 1e-3:
            gaps += arrival - end
            count += 1
        end = max(end or arrival, arrival) + secs
        audio += secs
    return gaps, count, audio


def cmd_timeline(args):
    import socket

    from bench_doors import free_port, spawn, stop, wait

    port = free_port()
    say(f"# the listener's timeline through Wyoming ({args.model}, precision {args.precision}, "
        f"the door's default profile); {load_line()}")
    proc = spawn("wyoming", "--model", args.model, "--uri", f"tcp://127.0.0.1:{port}",
                 "--voices-dir", f"/tmp/bench-int8-{os.getpid()}", "--precision", args.precision)
    try:
        def up():
            with socket.create_connection(("127.0.0.1", port), 1):
                return True
        wait(proc, up, "wyoming", 900)
        asyncio.run(one_reply(port))  # warm-up: kernels compiled, pages touched
        for rep in range(args.reps):
            chunks, end = asyncio.run(one_reply(port))
            gaps, count, audio = playback(chunks)
            arrivals = ", ".join(f"{a:.1f}" for a, _ in chunks[:: max(1, len(chunks) // 12)])
            say(f"run {rep + 1}: first audio {chunks[0][0]:.2f} s, whole reply {end:.1f} s, "
                f"{audio:.1f} s of audio in {len(chunks)} chunks; played back to back from the "
                f"first: {gaps:.1f} s of silence in {count} gaps; arrivals (s, sampled): "
                f"{arrivals}; {load_line()}")
    finally:
        stop(proc)


def cmd_budget(args):
    from omnicore.apps.server.voices import DOOR_VOICE, PRESET_VOICES, designed_voice
    from omnicore.model.config import GenerationConfig

    m = load(args.model, args.precision)
    say(f"# chunk 0's budget against first audio and gaps ({args.model}, precision "
        f"{args.precision}, live, `{DOOR_VOICE}`, in process); {load_line()}")
    prompt = designed_voice(m, *PRESET_VOICES[DOOR_VOICE])
    budgets = [float(b) for b in args.budgets.split(",")]

    def reply(budget):
        gen = GenerationConfig.for_profile("live", first_audio_seconds=budget)
        s = m.stream(REPLY, voice_clone_prompt=prompt, generation_config=gen)
        t0, pieces = time.perf_counter(), []
        for piece in s:
            pieces.append((time.perf_counter() - t0, len(piece) / m.sampling_rate))
        return s.chunk_stats[0]["frames"], pieces, time.perf_counter() - t0

    reply(budgets[0])  # warm-up: kernels compiled, pages touched
    rows = {b: [] for b in budgets}
    for rep in range(args.reps):
        for b in budgets:
            frames, pieces, end = reply(b)
            gaps, count, audio = playback(pieces)
            rows[b].append((pieces[0][0], gaps, end))
            say(f"round {rep + 1}, budget {b:g} s: chunk 0 {frames} frames, first audio "
                f"{pieces[0][0]:.2f} s, {gaps:.1f} s of silence in {count} gaps, whole reply "
                f"{end:.1f} s ({audio:.1f} s of audio); {load_line()}")
    say("\n| first_audio_seconds | first audio (median) | gaps (median) | whole reply |")
    say("|---:|---:|---:|---:|")
    for b, r in rows.items():
        med = [statistics.median(x) for x in zip(*r)]
        say(f"| {b:g} | {med[0]:.2f} s | {med[1]:.1f} s | {med[2]:.1f} s |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("step", "accuracy", "heads", "agreement", "timeline",
                                      "budget"))
    p.add_argument("--model", default=os.environ.get("OMNICORE_BENCH_MODEL",
                                                     str(ROOT / "checkpoints" / "full")))
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--gen-reps", type=int, default=3)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--precision", default="int8", choices=("fp32", "int8"))
    p.add_argument("--budgets", default="3.5,2.0,1.5",
                   help="budget: the first_audio_seconds values to compare")
    p.add_argument("--heads", action="store_true",
                   help="agreement: also int8 with the audio heads quantised")
    args = p.parse_args()
    if args.reps is None:
        args.reps = {"step": 9, "timeline": 2, "budget": 2}.get(args.what, 1)
    if args.seconds is None:
        args.seconds = {"agreement": 4.0}.get(args.what, 5.0)
    {"step": cmd_step, "accuracy": cmd_accuracy, "heads": cmd_heads, "agreement": cmd_agreement,
     "timeline": cmd_timeline, "budget": cmd_budget}[args.what](args)


if __name__ == "__main__":
    main()
