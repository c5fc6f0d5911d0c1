"""A call's inputs, checked once and resolved: what every synthesis path asks the engine for.

`generate` / `synthesize` (and through them batch, the server and scripts) and `stream` all
build their requests here, so each input is checked in one place, with one message:

    build_requests(model, paused, **arguments) -> [Request, ...]  one per text (split at pauses)
    Request.spec(chunk, k, ...)                 -> the PassSpec of chunk k (its voice, its seed)

A `Request` holds one text's settings; its voice is either ready (a checked voice prompt, or
none: auto / design) or a reference clip still to encode (`Request.encode_voice`), because a
stream encodes it on its worker thread rather than in the caller's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .engine import PassSpec, pass_seed
from .errors import InputError
from .model.config import GenerationConfig, resolve_generation_config, validate_seed
from .text import frontend, limits, normalize
from .text.planner import ChunkPlan, PausedText
from .voice import VoiceClonePrompt


def check_on_step(on_step) -> None:
    if on_step is not None and not callable(on_step):
        raise InputError(f"on_step must be a function (step, num_steps) or None, got "
                         f"{type(on_step).__name__}")


def _is_audio_tuple(x) -> bool:
    return (isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], (int, np.integer))
            and not isinstance(x[0], (str, Path)))


def per_item(x, n: int, name: str, repeat: bool = True) -> list:
    """The reference's broadcasting rule: one value for all items, or one per item."""
    xs = list(x) if isinstance(x, (list, tuple)) and not _is_audio_tuple(x) else [x]
    if len(xs) not in (1, n):
        raise InputError(f"{name}: got {len(xs)} values for {n} texts; give one value or one per text")
    return xs * n if repeat and len(xs) == 1 else xs


@dataclass
class Request:
    """One text to speak: its settings resolved, its voice ready or still a clip to encode."""

    gen: GenerationConfig
    language: str | None
    instruct: str | None            # as given; `instruct_for` resolves it against a text
    speed: float | None
    duration: float | None
    seed: int | None
    prompt: VoiceClonePrompt | None  # checked against the model; None: auto / design voice
    clip: tuple | None = None        # (ref_audio, ref_text) still to encode into `prompt`
    normalize: Callable[[str], str] = str
    paused: PausedText | None = None  # the text, split at its pause marks (None: streamed text)
    encode_s: float = 0.0            # seconds spent encoding the clip (its share, when shared)

    def instruct_for(self, text: str | None) -> str | None:
        """The instruct's items in the language of `text` (Chinese text -> Chinese items)."""
        return None if self.instruct is None else frontend.resolve_instruct(self.instruct, text)

    @property
    def voice_ready(self) -> bool:
        return self.clip is None

    @property
    def ref_text(self) -> str | None:
        return self.prompt.ref_text if self.prompt is not None else None

    @property
    def ref_frames(self) -> int | None:
        return self.prompt.ref_audio_tokens.shape[1] if self.prompt is not None else None

    def encode_voice(self, model) -> None:
        """Encode the reference clip into the voice prompt (slow: the codec's encoder)."""
        if self.clip is not None:
            t0 = time.perf_counter()
            audio, text = self.clip
            self.prompt = model.create_voice_clone_prompt(audio, text, self.gen.preprocess_prompt)
            self.clip, self.encode_s = None, time.perf_counter() - t0

    def spec(self, chunk: ChunkPlan, k: int, instruct: str | None, first: int | None = None,
             chunk0_codes: np.ndarray | None = None, streamed: bool = False) -> PassSpec:
        """Chunk k's pass. With a voice prompt it is conditioned on the prompt; a later chunk of
        an auto / design text takes chunk 0's text and codes as its reference (the reference's
        rule): `first` is chunk 0's pass index in the same engine request, or `chunk0_codes`
        its codes once known. It draws from child k of the text's seed (engine.pass_seed).
        `streamed`: a stream's chunk, unmasked with `gen.for_chunk(k)` (chunk 0's own steps)."""
        ref_codes, after = None, None
        if chunk.reference == "prompt":
            ref_codes = self.prompt.ref_audio_tokens
        elif chunk.reference == "chunk0":
            ref_codes, after = chunk0_codes, (first if chunk0_codes is None else None)
        return PassSpec(chunk.text, chunk.frames, self.language, instruct, chunk.ref_text,
                        ref_codes, pass_seed(self.seed, k),
                        self.gen.for_chunk(k) if streamed else self.gen, after)


def build_requests(model, paused: Sequence[PausedText] | None, *, language=None, ref_audio=None,
                   ref_text=None, voice_clone_prompt=None, instruct=None, duration=None,
                   speed=None, seed=None, on_step=None,
                   generation_config: GenerationConfig | dict | None = None,
                   normalize_text: bool = False, gen_kwargs: dict | None = None,
                   encode: bool = True) -> list[Request]:
    """Check every argument of a call and resolve one `Request` per text.

    `paused` are the texts split at their pause marks (`planner.split_pauses`), or None for a
    stream whose text is still to come (one request; its instruct is checked now and resolved
    against chunk 0 later, its text normalised chunk by chunk). Each argument is one value for
    every text or one per text. With `encode`, reference clips are encoded here; otherwise the
    request keeps its clip for `Request.encode_voice`. Cheap checks come first, so a bad
    argument never waits for a clip to be encoded.
    """
    gen = resolve_generation_config(generation_config, gen_kwargs or {},
                                    getattr(model, "profile", "exact"))
    check_on_step(on_step)
    n = 1 if paused is None else len(paused)
    limits.validate_edges(gen.pad_duration, gen.fade_duration)
    seeds = validate_seed(seed, n)
    langs = [frontend.resolve_language(x) for x in per_item(language, n, "language")]
    # Normalisation is the first change to the text, as in the reference: the instruct's
    # language, the length estimate and the chunking all see the spoken form (checked again:
    # words are longer than digits); ref_text is left alone (it must match its audio).
    if normalize.check_flag(normalize_text) and paused is not None:
        paused = [p.map(lambda seg, lang=lang: limits.validate_text(normalize.normalize_text(seg, lang)))
                  for p, lang in zip(paused, langs)]
    instructs = per_item(instruct, n, "instruct")
    for i, ins in enumerate(instructs):
        if ins is not None:
            frontend.resolve_instruct(ins, paused[i].spoken if paused is not None else None)
    speeds = [None if v is None else limits.validate_speed(v) for v in per_item(speed, n, "speed")]
    durations = [None if v is None else limits.validate_duration(v)
                 for v in per_item(duration, n, "duration")]

    prompts, clips, encode_s = per_item(voice_clone_prompt, n, "voice_clone_prompt"), [None] * n, 0.0
    if voice_clone_prompt is None and ref_audio is not None:
        audios = per_item(ref_audio, n, "ref_audio", repeat=False)
        rtexts = per_item(ref_text, n, "ref_text", repeat=False)
        if len(rtexts) != len(audios):
            raise InputError("give one ref_text per ref_audio")
        for r in rtexts:
            limits.require_ref_text(r)
        pairs = list(zip(audios, rtexts))
        if encode:  # each clip once, also when one clip serves every text
            t0 = time.perf_counter()
            prompts = per_item([model.create_voice_clone_prompt(a, r, gen.preprocess_prompt)
                                for a, r in pairs], n, "ref_audio")
            encode_s = time.perf_counter() - t0
        else:
            clips = per_item(pairs, n, "ref_audio")
    prompts = [None if p is None else model.check_prompt(p) for p in prompts]
    return [Request(gen, langs[i], instructs[i], speeds[i], durations[i], seeds[i], prompts[i],
                    clips[i], normalize.chunk_normalizer(normalize_text, langs[i]),
                    paused[i] if paused is not None else None, encode_s / n)
            for i in range(n)]
