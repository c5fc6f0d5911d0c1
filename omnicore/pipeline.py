"""The public API: text (+ optional voice) -> 24 kHz waveform, stage by stage.

    OmniVoice.from_pretrained(dir or hub id)
        config.json -> OmniVoiceConfig; model.safetensors -> backbone params (read into memory);
        tokenizer.json -> Tokenizer; audio_tokenizer/ -> Codec (encoder half loaded lazily)
    generate(text, ...)
        1. prepare    text.validate_text, resolve language / instruct, voice prompt from ref_audio
                      (postprocess.prepare_reference_audio -> codec.encode), duration estimate -> T frames
        2. unmask     the plan's passes -> engine.Engine (the model's one worker thread, 32 steps
                      of CFG unmasking, passes of every caller packed into shared forwards);
                      long text: text chunks, chunk 0 becomes the voice reference of the rest
        3. decode     codec.decode: [8, T] codes -> 960*T samples at 24 kHz
        4. postprocess postprocess.postprocess_output: silence trim, loudness, fades, padding (with
                      pause marks, postprocess.postprocess_paused: segments joined by exact silence)

Names and defaults follow the reference `omnivoice` package so that code ports by changing an
import. Dimension legend: C = 8 codebooks, T = target frames (25 per second), R = reference
frames, L = samples (24 000 per second), B = batch items.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import streaming
from .audio import postprocess
from .audio.loading import load_audio
from .engine import Engine, PassSpec, pass_seed
from .errors import AudioError, InputError
from .model import backbone, codec as codec_mod, tokenizer as tok_mod
from .model.config import GenerationConfig, OmniVoiceConfig, resolve_generation_config, validate_seed
from .model.weights import ParamReader, resolve_codec_dir, resolve_model_dir
from .text import frontend, limits, normalize, planner
from .voice import Synthesis, VoiceClonePrompt, check_voice_prompt

# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def _as_list(x, n: int, name: str, repeat: bool = True) -> list:
    """The reference's broadcasting rule: one value for all items, or one per item."""
    xs = list(x) if isinstance(x, (list, tuple)) and not _is_audio_tuple(x) else [x]
    if len(xs) not in (1, n):
        raise InputError(f"{name}: got {len(xs)} values for {n} texts; give one value or one per text")
    return xs * n if repeat and len(xs) == 1 else xs


def _is_audio_tuple(x) -> bool:
    return (isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], (int, np.integer))
            and not isinstance(x[0], (str, Path)))


@dataclass
class _Item:
    """One text to generate (or one text chunk), everything resolved."""

    text: str
    frames: int
    language: str | None
    instruct: str | None
    ref_text: str | None
    ref_codes: np.ndarray | None  # int64 [C, R]
    ref_rms: float | None
    speed: float | None = None
    plan: planner.SynthesisPlan | None = None  # the passes of a whole text item
    seed: int | None = None


class OmniVoice:
    """OmniVoice text-to-speech on numpy: voice cloning, voice design and auto voice."""

    def __init__(self, model_dir: Path, cfg: OmniVoiceConfig, params, tokenizer, codec: Codec):
        self.model_dir = Path(model_dir)
        self.config = cfg
        self.params = params
        self.tokenizer = tokenizer
        self.codec = codec
        self.sampling_rate = codec.sampling_rate
        self.frame_rate = codec.frame_rate
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, name_or_path: str = "k2-fsa/OmniVoice") -> "OmniVoice":
        """Load from a local checkpoint directory or a hub repo id (downloaded once, then cached)."""
        model_dir = resolve_model_dir(name_or_path)
        cfg = OmniVoiceConfig.from_file(model_dir / "config.json")
        reader = ParamReader.open(model_dir / "model.safetensors")
        params = backbone.load_params(reader, cfg)
        reader.finish()
        tokenizer = tok_mod.load_tokenizer(model_dir)
        codec = Codec(resolve_codec_dir(model_dir))
        return cls(model_dir, cfg, params, tokenizer, codec)

    # -- voice prompts ------------------------------------------------------------------------

    def create_voice_clone_prompt(self, ref_audio, ref_text: str | None = None,
                                  preprocess_prompt: bool = True) -> VoiceClonePrompt:
        """Encode a reference clip (path or (array, sample_rate)) into a reusable voice."""
        if ref_text is None or (isinstance(ref_text, str) and not ref_text.strip()):
            raise InputError(
                "ref_text is required: pass the transcript of the reference audio. (The "
                "reference package can transcribe it with Whisper; omnicore has no ASR built in.)")
        limits.validate_ref_text(ref_text)
        # Loudness boost, silence removal, whole codec frames only: exactly the reference's
        # clean-up. (It trims > 20 s clips only when it transcribes them itself; we never do.)
        wav, ref_rms = postprocess.prepare_reference_audio(
            ref_audio, preprocess_prompt, trim_long=False, sr=self.sampling_rate,
            hop_length=self.codec.hop_length)
        limits.check_clip_length(wav.shape[-1], self.sampling_rate)  # before the (costly) encode
        if not ref_rms > 0:
            raise AudioError("the reference audio is digital silence; record or upload speech")
        codes = self.codec.encode(wav, self.sampling_rate)  # [L] -> [C, R]
        if preprocess_prompt:
            ref_text = frontend.add_punctuation(ref_text)
        # Loudness above 0.1 leaves the output as it is, so capping it at full scale (float
        # clips can exceed it) changes nothing and keeps every saved prompt loadable.
        return VoiceClonePrompt(codes, ref_text, min(ref_rms, limits.MAX_REF_RMS))

    # -- generation ---------------------------------------------------------------------------

    def generate(self, text, **kwargs) -> list[np.ndarray]:
        """Text (or a list of texts) -> list of float32 waveforms at `sampling_rate`."""
        return [s.audio for s in self.synthesize(text, **kwargs)]

    def stream(self, text, **kwargs):
        """Speak `text` (a string, or an iterable of text fragments as they arrive) as an
        iterator of float32 audio pieces: a short first chunk, the rest made while it plays.
        Same arguments as `generate` for one text; see `omnicore.streaming.stream`."""
        return streaming.stream(self, text, **kwargs)

    def generate_codes(self, text, **kwargs) -> list[np.ndarray]:
        """Like `generate`, but stop before decoding: int64 codes [C, T] per text."""
        return [s.codes for s in self.synthesize(text, _decode=False, **kwargs)]

    def synthesize(self, text, language=None, ref_audio=None, ref_text=None,
                   voice_clone_prompt=None, instruct=None, duration=None, speed=None,
                   seed: int | None = None, on_step: Callable[[int, int], None] | None = None,
                   generation_config: GenerationConfig | None = None, _decode: bool = True,
                   normalize_text: bool = False, **kwargs) -> list[Synthesis]:
        """`generate` with the details: codes, per-cell fill steps, per-stage timings.

        Every input is checked before any heavy work (text.py holds the limits: output length
        per call and per pass, reference length, memory of one pass); `generation_config` is a
        GenerationConfig or a dict of its fields, and a keyword argument may not contradict it.
        `seed` is None, an integer >= 0, or one per text; chunk k of a long text draws from
        child k of its text's seed (`SeedSequence(seed).spawn`, engine.pass_seed), so chunks
        get independent noise and a text gets the same result alone or in a batch.
        `normalize_text=True` first writes
        numbers, dates, currency ... as words, as the reference does (omnicore.text.normalize; needs
        the `tn` extra).
        """
        gen = resolve_generation_config(generation_config, kwargs)
        if on_step is not None and not callable(on_step):
            raise InputError(f"on_step must be a function (step, num_steps) or None, got "
                             f"{type(on_step).__name__}")
        t0 = time.perf_counter()
        items, encode_s = self._prepare(text, language, ref_audio, ref_text, voice_clone_prompt,
                                        instruct, duration, speed, gen, seed, normalize_text)
        specs, owner = self._pass_specs(items, gen)
        # Every pass is checked (inputs, memory) before the first one runs.
        request = self.engine.submit(specs, on_step)
        prepare_s = time.perf_counter() - t0 - encode_s  # the clip's encode is timed on its own
        t0 = time.perf_counter()
        try:
            done = request.result()
        except BaseException:
            request.cancel()  # Ctrl-C or a failing progress callback: stop the passes too
            raise
        unmask_s = time.perf_counter() - t0
        results: list = [([], [], []) for _ in items]
        for i, spec, (c, s) in zip(owner, specs, done):
            results[i][0].append(c)
            results[i][1].append(s)
        for i, it in enumerate(items):
            results[i][2].extend(c.text for c in it.plan.chunks)

        out = []
        for it, (chunk_codes, chunk_steps, chunk_texts) in zip(items, results):
            timings = {"prepare": prepare_s / len(items), "unmask": unmask_s / len(items)}
            if encode_s:
                timings["encode"] = encode_s / len(items)
            wav, spans = np.zeros(0, np.float32), []
            if _decode:
                t0 = time.perf_counter()
                pieces = [self.codec.decode(c) for c in chunk_codes]  # [C, T_k] -> [960*T_k]
                timings["decode"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                edges = dict(postprocess=gen.postprocess_output, pad_duration=gen.pad_duration,
                             fade_duration=gen.fade_duration, sr=self.sampling_rate)
                if it.plan.paused:  # segments joined by exact silences (postprocess.postprocess_paused)
                    segments = [[] for _ in it.plan.pauses[1:]]
                    for chunk, piece in zip(it.plan.chunks, pieces):
                        segments[chunk.segment].append(piece)
                    last = len(it.plan.pauses) - 1  # at the ends, 0 s is no pause at all
                    pauses = [None if i in (0, last) and p == 0 else
                              planner.pause_samples(p, self.sampling_rate)
                              for i, p in enumerate(it.plan.pauses)]
                    wav, spans = postprocess.postprocess_paused(segments, pauses, it.ref_rms, **edges)
                else:
                    # Chunks are cross-faded, then silence trim / loudness / fades as the reference.
                    wav = postprocess.postprocess_output(pieces if len(pieces) > 1 else pieces[0],
                                                   it.ref_rms, **edges)
                timings["postprocess"] = time.perf_counter() - t0
            out.append(Synthesis(
                audio=np.ascontiguousarray(wav, np.float32),
                codes=np.concatenate(chunk_codes, axis=1),
                fill_steps=np.concatenate(chunk_steps, axis=1).astype(np.int16),
                num_steps=gen.num_step, timings=timings, text_chunks=chunk_texts,
                sample_rate=self.sampling_rate, pauses=tuple(spans)))
        return out

    # -- internals ----------------------------------------------------------------------------

    def check_prompt(self, prompt) -> VoiceClonePrompt:
        """`prompt` checked against this model (codebooks, code range) and text.py's limits;
        InputError naming what is wrong."""
        size = min(self.codec.cfg.codebook_size, self.config.audio_mask_id)
        try:
            return check_voice_prompt(prompt, self.config.num_audio_codebook, size)
        except InputError as exc:
            raise InputError(f"voice_clone_prompt: {exc}") from None

    def _prepare(self, text, language, ref_audio, ref_text, voice_clone_prompt, instruct,
                 duration, speed, gen: GenerationConfig, seed=None,
                 normalize_text: bool = False) -> tuple[list[_Item], float]:
        """Resolve every per-item input exactly as the reference's `_preprocess_all` does, and
        plan each item's passes (text.plan_synthesis). Cheap checks come first, so that a bad
        argument never waits for a reference clip to be encoded."""
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, (list, tuple)) or not texts:
            raise InputError("text must be a non-empty string or a non-empty list of strings")
        texts = [limits.validate_text(t) for t in texts]
        n = len(texts)
        # Pause marks ([pause:1.5s], <break time="2s"/>) split each text into spoken segments;
        # a bad mark is refused here, and normalisation only ever sees the spoken text.
        paused = [planner.split_pauses(t) for t in texts]
        limits.validate_edges(gen.pad_duration, gen.fade_duration)
        seeds = validate_seed(seed, n)
        langs = [frontend.resolve_language(x) for x in _as_list(language, n, "language")]
        # As in the reference, normalisation is the first change to the text, so the instruct's
        # language, the length estimate and the chunking all see the spoken form (checked again:
        # words are longer than digits); ref_text is left alone (it must match its audio).
        if normalize.check_flag(normalize_text):
            paused = [p.map(lambda seg, lang=lang: limits.validate_text(normalize.normalize_text(seg, lang)))
                      for p, lang in zip(paused, langs)]
        texts = [p.spoken for p in paused]
        instructs = []
        for t, ins in zip(texts, _as_list(instruct, n, "instruct")):
            # The target text decides the instruct's language (Chinese text -> Chinese items).
            instructs.append(None if ins is None else frontend.resolve_instruct(ins, t))
        speeds = None if speed is None else [limits.validate_speed(v) for v in _as_list(speed, n, "speed")]
        durations = (None if duration is None else
                     [limits.validate_duration(v) for v in _as_list(duration, n, "duration")])

        encode_s = 0.0
        if voice_clone_prompt is None and ref_audio is not None:
            audios = _as_list(ref_audio, n, "ref_audio", repeat=False)
            rtexts = _as_list(ref_text, n, "ref_text", repeat=False)
            if len(rtexts) != len(audios):
                raise InputError("give one ref_text per ref_audio")
            for r in rtexts:
                if r is not None:
                    limits.validate_ref_text(r)
            t0 = time.perf_counter()
            voice_clone_prompt = [self.create_voice_clone_prompt(a, r, gen.preprocess_prompt)
                                  for a, r in zip(audios, rtexts)]
            encode_s = time.perf_counter() - t0
        prompts = [None if p is None else self.check_prompt(p)
                   for p in _as_list(voice_clone_prompt, n, "voice_clone_prompt")]

        items = []
        for i in range(n):
            p = prompts[i]
            plan = planner.plan_synthesis(
                paused[i], p.ref_text if p else None, p.ref_audio_tokens.shape[1] if p else None,
                speed=speeds[i] if speeds else None,
                duration=durations[i] if durations else None,
                chunk_duration=gen.audio_chunk_duration,
                chunk_threshold=gen.audio_chunk_threshold, frame_rate=self.frame_rate)
            items.append(_Item(texts[i], plan.frames, langs[i], instructs[i],
                               p.ref_text if p else None, p.ref_audio_tokens if p else None,
                               p.ref_rms if p else None, plan.speed, plan, seeds[i]))
        limits.check_total_frames(sum(c.frames for it in items for c in it.plan.chunks)
                                    + sum(it.plan.pause_frames for it in items), self.frame_rate)
        return items, encode_s

    @property
    def engine(self) -> Engine:
        """The model's unmasking engine (one worker thread, created on first use): every
        generate / stream / batch call on this model submits its passes to it."""
        with self._engine_lock:
            if self._engine is None:
                self._engine = Engine(self.params, self.config, self.tokenizer)
            return self._engine

    def _pass_specs(self, items: Sequence[_Item], gen: GenerationConfig
                    ) -> tuple[list[PassSpec], list[int]]:
        """The passes of every item's plan, and the item each belongs to. With a voice prompt
        every chunk is conditioned on it; without one (auto / design), later chunks use chunk
        0's text and generated codes as reference (the reference's rule), so they wait for it.
        Chunk k of an item draws from child k of the item's seed (engine.pass_seed)."""
        specs, owner = [], []
        for i, it in enumerate(items):
            first = len(specs)
            for k, chunk in enumerate(it.plan.chunks):
                ref_text, ref_codes, after = None, None, None
                if chunk.reference == "prompt":
                    ref_text, ref_codes = it.ref_text, it.ref_codes
                elif chunk.reference == "chunk0":
                    ref_text, after = chunk.ref_text, first
                specs.append(PassSpec(chunk.text, chunk.frames, it.language, it.instruct,
                                      ref_text, ref_codes, pass_seed(it.seed, k), gen, after))
                owner.append(i)
        return specs, owner


# ---------------------------------------------------------------------------------------------
# The codec, with its encoder half loaded on first use
# ---------------------------------------------------------------------------------------------


class Codec:
    """Higgs Audio V2 codec: `decode` codes -> 24 kHz audio, `encode` audio -> codes.

    Only the decoder is read at load time; the encoder half (HuBERT + acoustic encoder) is
    read the first time something is encoded, so plain TTS never pages it in.
    """

    def __init__(self, codec_dir: Path):
        self.dir = Path(codec_dir)
        self.cfg, self.params = codec_mod.load_codec(self.dir, encoder=False)
        self.sampling_rate = self.cfg.sample_rate
        self.frame_rate = self.cfg.frame_rate
        self.hop_length = self.cfg.hop_length
        self._lock = threading.Lock()

    def decode(self, codes) -> np.ndarray:
        """[C, T] -> float32 [960*T]; [B, C, T] -> float32 [B, 960*T].

        Codes must be integers in [0, codebook_size) (InputError otherwise), at most
        text.MAX_DURATION_S of audio in all. Up to text.MAX_PASS_FRAMES frames (the longest
        unmasking pass) are decoded in one shot; longer arrays in windows of that length with
        the decoder's receptive field of overlap, so memory stays bounded.
        """
        arr = codec_mod.check_codes(codes, self.cfg)  # shape, dtype and range -> InputError
        batch = arr.shape[0] if arr.ndim == 3 else 1
        frames = arr.shape[-1]
        if batch * frames > limits.MAX_DURATION_S * self.frame_rate:
            raise InputError(
                f"codes of {batch} x {frames:,} frames would decode to "
                f"{batch * frames / self.frame_rate / 60:.0f} minutes of audio; the limit is "
                f"{limits.MAX_DURATION_S / 60:g} minutes per call: decode it in parts")
        if arr.ndim == 3:
            if batch == 0:
                return np.zeros((0, self.hop_length * frames), np.float32)
            return np.stack([self.decode(c) for c in arr])  # one item at a time: bounded memory
        if frames > limits.MAX_PASS_FRAMES:
            return codec_mod.decode_chunked(self.params, arr, self.cfg,
                                            chunk_frames=limits.MAX_PASS_FRAMES)
        return codec_mod.decode(self.params, arr, self.cfg)

    def encode(self, waveform, sample_rate: int) -> np.ndarray:
        """Audio [L] or [C, L] at any rate -> int64 codes [C, T] (mixed to mono, resampled to
        24 kHz and right-padded to whole frames first). At most text.MAX_REF_S seconds: the
        encoder's attention grows with the square of the clip (AudioError beyond)."""
        wav = load_audio((waveform, sample_rate), self.sampling_rate)
        limits.check_clip_length(wav.shape[-1], self.sampling_rate)
        with self._lock:  # concurrent first uses (demo queue) load the encoder half once
            self.params = codec_mod.ensure_encoder(self.params, self.cfg, self.dir)
        return codec_mod.encode(self.params, wav, self.cfg)
