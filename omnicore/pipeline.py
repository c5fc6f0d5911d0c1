"""The public API: text (+ optional voice) -> 24 kHz waveform, stage by stage.

    OmniVoice.from_pretrained(dir or hub id)
        config.json -> OmniVoiceConfig; model.safetensors -> backbone params (read into memory);
        tokenizer.json -> Tokenizer; audio_tokenizer/ -> Codec (encoder half loaded lazily)
    generate(text, ...)
        1. prepare    limits.validate_text, resolve language / instruct, voice prompt from ref_audio
                      (postprocess.prepare_reference_audio -> Codec.encode), duration estimate -> T frames
        2. unmask     the plan's passes -> engine.Engine (the model's one worker thread, 32 steps
                      of CFG unmasking, passes of every caller packed into shared forwards);
                      long text: text chunks, chunk 0 becomes the voice reference of the rest
        3. decode     higgs_codec.decode: [8, T] codes -> 960*T samples at 24 kHz
        4. postprocess postprocess.postprocess_output: silence trim, loudness, fades, padding (with
                      pause marks, postprocess.postprocess_paused: segments joined by exact silence)

Names and defaults follow the reference `omnivoice` package so that code ports by changing an
import. Dimension legend: C = 8 codebooks, T = target frames (25 per second), R = reference
frames, L = samples (24 000 per second), B = batch items.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from .machinery import checkpoint, settings
from . import streaming
from .audio import postprocess
from .audio.loading import load_audio
from .engine import Engine, PassSpec
from .errors import AudioError, ConfigError, InputError, RefTextMismatchWarning
from .model import backbone, cost, higgs_codec
from .model.backend import check_precision
from .model.config import PROFILES, GenerationConfig, OmniVoiceConfig
from .request import Request, build_requests
from .text import frontend, limits, planner
from .voice import Synthesis, VoiceClonePrompt, check_voice_prompt

# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

# synthesize's own arguments (the rest of its keyword arguments are GenerationConfig fields)
_CALL_ARGUMENTS = ("language", "ref_audio", "ref_text", "voice_clone_prompt", "instruct",
                   "duration", "speed", "seed", "on_step", "generation_config", "normalize_text")


class OmniVoice:
    """OmniVoice text-to-speech on numpy: voice cloning, voice design and auto voice."""

    def __init__(self, model_dir: Path, cfg: OmniVoiceConfig, params, tokenizer, codec: Codec,
                 profile: str = "exact"):
        self.profile = profile  # the generation profile of calls that name none
        self.model_dir = Path(model_dir)
        self.config = cfg
        self.params = params
        self.tokenizer = tokenizer
        self.codec = codec
        self.sampling_rate = codec.sampling_rate
        self.frame_rate = codec.frame_rate
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()

    @property
    def precision(self) -> str:
        """The backbone's precision profile (`from_pretrained(precision=...)`)."""
        return getattr(self.params, "precision", "fp32")

    @classmethod
    def from_pretrained(cls, name_or_path: str = checkpoint.HUB_REPO, precision: str = "fp32",
                        profile: str = "exact") -> "OmniVoice":
        """Load from a local checkpoint directory or a hub repo id (downloaded once, then cached).

        precision: what the backbone's GEMMs take as inputs: "fp32" (exact, the default),
        "tf32", "bf16" or "fp16" (approximate: inputs rounded to that format, float32
        accumulation, norms, softmax and scoring in float32), or "int8" (approximate, the CPU's
        W8A8 profile: the layers' projections multiply int8 activations by int8 weights
        quantised here, once; the numpy backend only; docs/configuration.md). ConfigError for
        another value.
        profile: the generation profile of calls that name none: "exact" (the default),
        "fast" or "live" (approximate: GenerationConfig.for_profile; docs/performance.md).
        ConfigError for another value. The process's runtime settings (backend, threads) are
        read first (settings.configure)."""
        settings.configure()
        check_precision(precision)
        if profile not in PROFILES:
            raise ConfigError(f"profile={profile!r} is not one of {', '.join(map(repr, PROFILES))}")
        model_dir = checkpoint.resolve_model_dir(name_or_path)
        cfg = checkpoint.read_config(model_dir / "config.json", OmniVoiceConfig)
        reader = checkpoint.open_params(model_dir / "model.safetensors")
        params = backbone.load_params(reader, cfg, precision)
        reader.finish()  # the file stays open: the text embedding table is read by rows
        tokenizer = checkpoint.load_tokenizer(model_dir)
        codec = Codec(checkpoint.resolve_codec_dir(model_dir))
        return cls(model_dir, cfg, params, tokenizer, codec, profile)

    # -- voice prompts ------------------------------------------------------------------------

    def create_voice_clone_prompt(self, ref_audio, ref_text: str | None = None,
                                  preprocess_prompt: bool = True) -> VoiceClonePrompt:
        """Encode a reference clip (path or (array, sample_rate)) into a reusable voice. Warns
        (RefTextMismatchWarning) when `ref_text` cannot be what the clip says: the pace they
        imply is not speech (`VoiceClonePrompt.pace_problem`)."""
        limits.require_ref_text(ref_text)
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
        prompt = VoiceClonePrompt(codes, ref_text, min(ref_rms, limits.MAX_REF_RMS))
        problem = prompt.pace_problem()  # a wrong transcript sets the pace of every output
        if problem:
            warnings.warn(problem, RefTextMismatchWarning, stacklevel=2)
        return prompt

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
                   normalize_text: bool = False,
                   _on_passes: Callable[[list[PassSpec]], None] | None = None,
                   **kwargs) -> list[Synthesis]:
        """`generate` with the details: codes, per-cell fill steps, per-stage timings.

        Every input is checked before any heavy work (text/limits.py holds the limits: output length
        per call and per pass, reference length, memory of one pass); `generation_config` is a
        GenerationConfig or a dict of its fields, and a keyword argument may not contradict it.
        `seed` is None, an integer >= 0, or one per text; chunk k of a long text draws from
        child k of its text's seed (`SeedSequence(seed).spawn`, engine.pass_seed), so chunks
        get independent noise and a text gets the same result alone or in a batch.
        `normalize_text=True` first writes
        numbers, dates, currency ... as words, as the reference does (omnicore.text.normalize; needs
        the `tn` extra).
        """
        t0 = time.perf_counter()
        requests, plans, specs, owner = self._passes(
            text, language=language, ref_audio=ref_audio, ref_text=ref_text,
            voice_clone_prompt=voice_clone_prompt, instruct=instruct, duration=duration,
            speed=speed, seed=seed, on_step=on_step, generation_config=generation_config,
            normalize_text=normalize_text, gen_kwargs=kwargs)
        if _on_passes is not None:  # the CLI's progress: which passes, and what waits for what
            _on_passes(specs)
        gen = requests[0].gen
        encode_s = sum(r.encode_s for r in requests)
        prepare_s = time.perf_counter() - t0 - encode_s  # the clip's encode is timed on its own
        t0 = time.perf_counter()
        # Every pass is checked (inputs, memory) before the first one runs; Ctrl-C or a failing
        # progress callback cancels the passes too.
        done = self.engine.run(specs, on_step)
        unmask_s = time.perf_counter() - t0
        passes: list[list] = [[] for _ in requests]  # per text, its chunks' PassResults in order
        for i, result in zip(owner, done):
            passes[i].append(result)

        out = []
        n = len(requests)
        for r, plan, results in zip(requests, plans, passes):
            chunk_codes = [res.codes for res in results]
            timings = {"prepare": prepare_s / n, "unmask": unmask_s / n}
            if encode_s:
                timings["encode"] = encode_s / n
            wav, spans = np.zeros(0, np.float32), []
            if _decode:
                t0 = time.perf_counter()
                pieces = [self.codec.decode(c) for c in chunk_codes]  # [C, T_k] -> [960*T_k]
                timings["decode"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                edges = dict(postprocess=gen.postprocess_output, pad_duration=gen.pad_duration,
                             fade_duration=gen.fade_duration, sr=self.sampling_rate)
                ref_rms = r.prompt.ref_rms if r.prompt is not None else None
                if plan.paused:  # segments joined by exact silences (postprocess.postprocess_paused)
                    segments = [[] for _ in plan.pauses[1:]]
                    for chunk, piece in zip(plan.chunks, pieces):
                        segments[chunk.segment].append(piece)
                    last = len(plan.pauses) - 1  # at the ends, 0 s is no pause at all
                    pauses = [None if i in (0, last) and p == 0 else
                              planner.pause_samples(p, self.sampling_rate)
                              for i, p in enumerate(plan.pauses)]
                    wav, spans = postprocess.postprocess_paused(segments, pauses, ref_rms, **edges)
                else:
                    # Chunks are cross-faded, then silence trim / loudness / fades as the reference.
                    wav = postprocess.postprocess_output(pieces if len(pieces) > 1 else pieces[0],
                                                         ref_rms, **edges)
                timings["postprocess"] = time.perf_counter() - t0
            out.append(Synthesis(
                audio=np.ascontiguousarray(wav, np.float32),
                codes=np.concatenate(chunk_codes, axis=1),
                fill_steps=np.concatenate([res.fill_steps for res in results], axis=1).astype(np.int16),
                num_steps=gen.num_step, timings=timings, text_chunks=[c.text for c in plan.chunks],
                sample_rate=self.sampling_rate, pauses=tuple(spans)))
        return out

    def unmask_flops(self, text, **kwargs) -> int:
        """The GEMM FLOPs `synthesize(text, **kwargs)` would spend unmasking (cost.pass_flops of
        each of its passes), without running it: what an estimate of its time divides by a
        measured rate (machinery/warmup.py). A pass voiced by another's codes is counted with
        zeros of that length (the same rows)."""
        call = {name: kwargs.pop(name, None) for name in _CALL_ARGUMENTS}
        call["normalize_text"] = bool(call["normalize_text"])
        _, _, specs, _ = self._passes(text, **call, gen_kwargs=kwargs)
        total = 0
        for spec in specs:
            ref = spec.ref_codes
            if spec.after is not None:
                ref = np.zeros((self.config.num_audio_codebook, specs[spec.after].frames), np.int64)
            item = self.engine.prepare(spec, ref)
            total += cost.pass_flops(self.config, spec.gen, item.input_ids.shape[1] - spec.frames,
                                     spec.frames, spec.gen.guidance_scale != 0)
        return total

    # -- internals ----------------------------------------------------------------------------

    def check_prompt(self, prompt) -> VoiceClonePrompt:
        """`prompt` checked against this model (codebooks, code range) and text/limits.py;
        InputError naming what is wrong."""
        size = min(self.codec.cfg.codebook_size, self.config.audio_mask_id)
        try:
            return check_voice_prompt(prompt, self.config.num_audio_codebook, size)
        except InputError as exc:
            raise InputError(f"voice_clone_prompt: {exc}") from None

    def _passes(self, text, **arguments) -> tuple[list[Request], list[planner.SynthesisPlan],
                                                  list[PassSpec], list[int]]:
        """A call's requests (request.build_requests, one per text), each text's plan
        (planner.plan_synthesis), and the passes of all of them with the text each belongs to."""
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, (list, tuple)) or not texts:
            raise InputError("text must be a non-empty string or a non-empty list of strings")
        # Pause marks ([pause:1.5s], <break time="2s"/>) split each text into spoken segments;
        # a bad mark is refused here, and normalisation only ever sees the spoken text.
        paused = [planner.split_pauses(limits.validate_text(t)) for t in texts]
        requests = build_requests(self, paused, **arguments)
        plans = [planner.plan_synthesis(
            r.paused, r.ref_text, r.ref_frames, speed=r.speed, duration=r.duration,
            chunk_duration=r.gen.audio_chunk_duration, chunk_threshold=r.gen.audio_chunk_threshold,
            frame_rate=self.frame_rate) for r in requests]
        limits.check_total_frames(sum(c.frames for p in plans for c in p.chunks)
                                  + sum(p.pause_frames for p in plans), self.frame_rate)
        specs, owner = [], []
        for i, (r, plan) in enumerate(zip(requests, plans)):
            instruct, first = r.instruct_for(r.paused.spoken), len(specs)
            specs += [r.spec(chunk, k, instruct, first=first) for k, chunk in enumerate(plan.chunks)]
            owner += [i] * len(plan.chunks)
        return requests, plans, specs, owner

    @property
    def engine(self) -> Engine:
        """The model's unmasking engine (one worker thread, created on first use): every
        generate / stream / batch call on this model submits its passes to it."""
        with self._engine_lock:
            if self._engine is None:
                self._engine = Engine(self.params, self.config, self.tokenizer)
            return self._engine


# ---------------------------------------------------------------------------------------------
# The codec, with its encoder half loaded on first use
# ---------------------------------------------------------------------------------------------


class Codec:
    """Higgs Audio V2 codec: `decode` codes -> 24 kHz audio, `encode` audio -> codes.

    Only the decoder is read at load time; the encoder half (HuBERT + acoustic encoder) is
    read the first time something is encoded, so plain TTS never pages it in.
    """

    def __init__(self, codec_dir: Path):
        settings.configure()
        self.dir = Path(codec_dir)
        self.cfg, self.params = checkpoint.load_codec(self.dir, encoder=False)
        self.sampling_rate = self.cfg.sample_rate
        self.frame_rate = self.cfg.frame_rate
        self.hop_length = self.cfg.hop_length
        self._lock = threading.Lock()

    def decode(self, codes) -> np.ndarray:
        """[C, T] -> float32 [960*T]; [B, C, T] -> float32 [B, 960*T].

        Codes must be integers in [0, codebook_size) (InputError otherwise), at most
        limits.MAX_DURATION_S of audio in all. Up to limits.MAX_PASS_FRAMES frames (the longest
        unmasking pass) are decoded in one shot; longer arrays in windows of that length with
        the decoder's receptive field of overlap, so memory stays bounded.
        """
        arr = higgs_codec.check_codes(codes, self.cfg)  # shape, dtype and range -> InputError
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
            return higgs_codec.decode_chunked(self.params, arr, self.cfg,
                                            chunk_frames=limits.MAX_PASS_FRAMES)
        return higgs_codec.decode(self.params, arr, self.cfg)

    def encode(self, waveform, sample_rate: int) -> np.ndarray:
        """Audio [L] or [C, L] at any rate -> int64 codes [C, T] (mixed to mono, resampled to
        24 kHz and right-padded to whole frames first). At most limits.MAX_REF_S seconds: the
        encoder's attention grows with the square of the clip (AudioError beyond)."""
        wav = load_audio((waveform, sample_rate), self.sampling_rate)
        limits.check_clip_length(wav.shape[-1], self.sampling_rate)
        with self._lock:  # concurrent first uses (demo queue) load the encoder half once
            self.params = checkpoint.load_codec_encoder(self.params, self.cfg, self.dir)
        return higgs_codec.encode(self.params, wav, self.cfg)
