"""The public API: text (+ optional voice) -> 24 kHz waveform, stage by stage.

    OmniVoice.from_pretrained(dir or hub id)
        config.json -> OmniVoiceConfig; model.safetensors -> backbone params (mmapped);
        tokenizer.json -> Tokenizer; audio_tokenizer/ -> Codec (encoder half loaded lazily)
    generate(text, ...)
        1. prepare    text.validate_text, resolve language / instruct, voice prompt from ref_audio
                      (audio.prepare_reference_audio -> codec.encode), duration estimate -> T frames
        2. unmask     tokenizer.build_item -> unmasking.generate_codes (32 steps of CFG unmasking)
                      long text: text chunks, chunk 0 becomes the voice reference of the rest
        3. decode     codec.decode: [8, T] codes -> 960*T samples at 24 kHz
        4. postprocess audio.postprocess_output: silence trim, loudness, fades, padding

Names and defaults follow the reference `omnivoice` package so that code ports by changing an
import. Dimension legend: C = 8 codebooks, T = target frames (25 per second), R = reference
frames, L = samples (24 000 per second), B = batch items.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import audio, backbone, codec as codec_mod, text as text_mod, tokenizer as tok_mod, unmasking
from .config import GenerationConfig, OmniVoiceConfig, read_json
from .errors import AudioError, InputError, OmniCoreError, VoicePromptError
from .weights import ParamReader, resolve_codec_dir, resolve_model_dir

VOICE_PROMPT_FORMAT = "omnicore-voice-prompt"
VOICE_PROMPT_VERSION = 1



# ---------------------------------------------------------------------------------------------
# Results and voice prompts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Synthesis:
    """One generated utterance, with what the demo and CLI show about how it was made."""

    audio: np.ndarray          # float32 [L] at 24 kHz
    codes: np.ndarray          # int64 [C, T] (text chunks joined along T)
    fill_steps: np.ndarray     # int16 [C, T]: unmasking step at which each cell was filled
    num_steps: int
    timings: dict[str, float]  # seconds per stage
    text_chunks: list[str]
    sample_rate: int = 24000


@dataclass(frozen=True)
class VoiceClonePrompt:
    """A reusable voice: the reference clip's codes, its transcript and its loudness.

    Saved as a plain .npz (no pickle: `np.load(..., allow_pickle=False)` reads it), with a
    format name and version so that files from a future omnicore are refused clearly.
    """

    ref_audio_tokens: np.ndarray  # int64 [C, R]
    ref_text: str
    ref_rms: float

    def save(self, path: str | Path) -> None:
        """Write the prompt to `path` (an npz file; `path` is complete or untouched); a path
        that cannot be written (missing folder, a folder or device, no space) is a
        VoicePromptError."""
        meta = {"format": VOICE_PROMPT_FORMAT, "version": VOICE_PROMPT_VERSION,
                "ref_text": self.ref_text, "ref_rms": float(self.ref_rms)}
        tokens = np.asarray(self.ref_audio_tokens, np.int64)
        meta_bytes = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
        # Complete or untouched, also with concurrent saves to one path (unique temp names).
        audio.write_atomic(path, lambda fh: np.savez(fh, ref_audio_tokens=tokens, meta=meta_bytes),
                           VoicePromptError)

    @classmethod
    def load(cls, path: str | Path) -> "VoiceClonePrompt":
        try:
            with np.load(path, allow_pickle=False) as z:
                tokens = np.array(z["ref_audio_tokens"])
                meta = json.loads(bytes(z["meta"]).decode("utf-8"))
        except FileNotFoundError:
            raise VoicePromptError(f"{path}: voice prompt file not found") from None
        except Exception as exc:  # zip, npy, JSON and key errors of an untrusted file alike
            raise VoicePromptError(
                f"{path}: not an omnicore voice prompt ({type(exc).__name__}). Create one with "
                "`omnicore clone-prompt ref.wav --ref-text '...' -o voice.npz`. (Prompts saved by "
                "the PyTorch omnivoice package are torch pickles; re-create them from the audio.)"
            ) from None
        if not isinstance(meta, dict) or meta.get("format") != VOICE_PROMPT_FORMAT:
            raise VoicePromptError(f"{path}: not an omnicore voice prompt file")
        if meta.get("version") != VOICE_PROMPT_VERSION:
            raise VoicePromptError(f"{path}: voice prompt version {meta.get('version')!r} is not "
                                   f"supported by this omnicore (it reads version {VOICE_PROMPT_VERSION})")
        ref_text, ref_rms = meta.get("ref_text"), meta.get("ref_rms")
        if (tokens.ndim != 2 or tokens.dtype.kind not in "iu" or tokens.shape[1] == 0
                or not isinstance(ref_text, str) or not isinstance(ref_rms, (int, float))):
            raise VoicePromptError(f"{path}: voice prompt is inconsistent (codes {tokens.shape}, "
                                   f"{tokens.dtype}); re-create it")
        return cls(tokens.astype(np.int64), ref_text, float(ref_rms))


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
        """[C, T] -> float32 [960*T]; [B, C, T] -> float32 [B, 960*T]."""
        codes = np.asarray(codes)
        if codes.ndim == 3:
            return np.stack([self.decode(c) for c in codes])
        return codec_mod.decode(self.params, codes, self.cfg)

    def encode(self, waveform, sample_rate: int) -> np.ndarray:
        """Audio [L] or [C, L] at any rate -> int64 codes [C, T] (mixed to mono, resampled to
        24 kHz and right-padded to whole frames first)."""
        with self._lock:  # concurrent first uses (demo queue) load the encoder half once
            self.params = codec_mod.ensure_encoder(self.params, self.cfg, self.dir)
        wav = audio.load_audio((waveform, sample_rate), self.sampling_rate)
        return codec_mod.encode(self.params, wav, self.cfg)


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
        if ref_text is None or not str(ref_text).strip():
            raise InputError(
                "ref_text is required: pass the transcript of the reference audio. (The "
                "reference package can transcribe it with Whisper; omnicore has no ASR built in.)")
        # Loudness boost, silence removal, whole codec frames only: exactly the reference's
        # clean-up. (It trims > 20 s clips only when it transcribes them itself; we never do.)
        wav, ref_rms = audio.prepare_reference_audio(
            ref_audio, preprocess_prompt, trim_long=False, sr=self.sampling_rate,
            hop_length=self.codec.hop_length)
        codes = self.codec.encode(wav, self.sampling_rate)  # [L] -> [C, R]
        if preprocess_prompt:
            ref_text = text_mod.add_punctuation(ref_text)
        return VoiceClonePrompt(codes, ref_text, ref_rms)

    # -- generation ---------------------------------------------------------------------------

    def generate(self, text, **kwargs) -> list[np.ndarray]:
        """Text (or a list of texts) -> list of float32 waveforms at `sampling_rate`."""
        return [s.audio for s in self.synthesize(text, **kwargs)]

    def stream(self, text, **kwargs):
        """Speak `text` (a string, or an iterable of text fragments as they arrive) as an
        iterator of float32 audio pieces: a short first chunk, the rest made while it plays.
        Same arguments as `generate` for one text; see `omnicore.streaming.stream`."""
        from . import streaming

        return streaming.stream(self, text, **kwargs)

    def generate_codes(self, text, **kwargs) -> list[np.ndarray]:
        """Like `generate`, but stop before decoding: int64 codes [C, T] per text."""
        return [s.codes for s in self.synthesize(text, _decode=False, **kwargs)]

    def synthesize(self, text, language=None, ref_audio=None, ref_text=None,
                   voice_clone_prompt=None, instruct=None, duration=None, speed=None,
                   seed: int | None = None, on_step: Callable[[int, int], None] | None = None,
                   generation_config: GenerationConfig | None = None, _decode: bool = True,
                   **kwargs) -> list[Synthesis]:
        """`generate` with the details: codes, per-cell fill steps, per-stage timings."""
        unknown = set(kwargs) - {f.name for f in fields(GenerationConfig)}
        if unknown:
            raise InputError(f"unknown argument(s): {', '.join(sorted(unknown))}")
        gen = generation_config or GenerationConfig(**kwargs)
        t0 = time.perf_counter()
        items, encode_s = self._prepare(text, language, ref_audio, ref_text, voice_clone_prompt,
                                        instruct, duration, speed, gen)
        prepare_s = time.perf_counter() - t0 - encode_s  # the clip's encode is timed on its own

        threshold = int(gen.audio_chunk_threshold * self.frame_rate)
        short = [i for i, it in enumerate(items) if it.frames <= threshold]
        long = [i for i, it in enumerate(items) if it.frames > threshold]
        results: list = [None] * len(items)

        t0 = time.perf_counter()
        if short:
            codes, steps = self._unmask([items[i] for i in short], gen, seed, on_step)
            for i, c, s in zip(short, codes, steps):
                results[i] = ([c], [s], [items[i].text])
        for i in long:  # chunked generation, one long item at a time
            results[i] = self._generate_chunked(items[i], gen, seed, on_step)
        unmask_s = time.perf_counter() - t0

        out = []
        for it, (chunk_codes, chunk_steps, chunk_texts) in zip(items, results):
            timings = {"prepare": prepare_s / len(items), "unmask": unmask_s / len(items)}
            if encode_s:
                timings["encode"] = encode_s / len(items)
            wav = np.zeros(0, np.float32)
            if _decode:
                t0 = time.perf_counter()
                pieces = [self.codec.decode(c) for c in chunk_codes]  # [C, T_k] -> [960*T_k]
                timings["decode"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                # Chunks are cross-faded, then silence trim / loudness / fades as the reference.
                wav = audio.postprocess_output(
                    pieces if len(pieces) > 1 else pieces[0], it.ref_rms,
                    postprocess=gen.postprocess_output, pad_duration=gen.pad_duration,
                    fade_duration=gen.fade_duration, sr=self.sampling_rate)
                timings["postprocess"] = time.perf_counter() - t0
            out.append(Synthesis(
                audio=np.ascontiguousarray(wav, np.float32),
                codes=np.concatenate(chunk_codes, axis=1),
                fill_steps=np.concatenate(chunk_steps, axis=1).astype(np.int16),
                num_steps=gen.num_step, timings=timings, text_chunks=chunk_texts,
                sample_rate=self.sampling_rate))
        return out

    # -- internals ----------------------------------------------------------------------------

    def _prepare(self, text, language, ref_audio, ref_text, voice_clone_prompt, instruct,
                 duration, speed, gen: GenerationConfig) -> tuple[list[_Item], float]:
        """Resolve every per-item input exactly as the reference's `_preprocess_all` does."""
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, (list, tuple)) or not texts:
            raise InputError("text must be a non-empty string or a non-empty list of strings")
        texts = [text_mod.validate_text(t) for t in texts]
        n = len(texts)
        langs = [text_mod.resolve_language(x) for x in _as_list(language, n, "language")]
        instructs = []
        for t, ins in zip(texts, _as_list(instruct, n, "instruct")):
            # The target text decides the instruct's language (Chinese text -> Chinese items).
            instructs.append(None if ins is None else text_mod.resolve_instruct(ins, t))

        encode_s = 0.0
        if voice_clone_prompt is None and ref_audio is not None:
            t0 = time.perf_counter()
            audios = _as_list(ref_audio, n, "ref_audio", repeat=False)
            rtexts = _as_list(ref_text, n, "ref_text", repeat=False)
            if len(rtexts) != len(audios):
                raise InputError("give one ref_text per ref_audio")
            voice_clone_prompt = [self.create_voice_clone_prompt(a, r, gen.preprocess_prompt)
                                  for a, r in zip(audios, rtexts)]
            encode_s = time.perf_counter() - t0
        prompts = _as_list(voice_clone_prompt, n, "voice_clone_prompt")
        for p in prompts:
            if p is not None and not isinstance(p, VoiceClonePrompt):
                raise InputError("voice_clone_prompt must be a VoiceClonePrompt "
                                 "(from create_voice_clone_prompt or VoiceClonePrompt.load)")

        speeds = None if speed is None else [text_mod.validate_speed(v) for v in _as_list(speed, n, "speed")]
        durations = (None if duration is None else
                     [text_mod.validate_duration(v) for v in _as_list(duration, n, "duration")])

        items = []
        for i in range(n):
            p = prompts[i]
            has_dur = durations is not None and durations[i] is not None
            item_speed = 1.0 if has_dur else (speeds[i] if speeds and speeds[i] is not None else 1.0)
            frames = text_mod.estimate_target_frames(
                texts[i], p.ref_text if p else None,
                p.ref_audio_tokens.shape[1] if p else None, speed=item_speed)
            chunk_speed = speeds[i] if speeds else None
            if has_dur:
                target = max(1, int(durations[i] * self.frame_rate))
                chunk_speed = frames / target
                frames = target
            items.append(_Item(texts[i], frames, langs[i], instructs[i],
                               p.ref_text if p else None, p.ref_audio_tokens if p else None,
                               p.ref_rms if p else None, chunk_speed))
        return items, encode_s

    def _unmask(self, items: Sequence[_Item], gen: GenerationConfig, seed, on_step):
        """Build the model inputs for a batch of items and run the iterative unmasking."""
        prepared = [tok_mod.prepare_item(self.tokenizer, self.config, it.text, it.frames,
                                         ref_text=it.ref_text, ref_codes=it.ref_codes,
                                         lang=it.language, instruct=it.instruct,
                                         denoise=gen.denoise)
                    for it in items]
        return unmasking.generate_codes(self.params, self.config, prepared, gen, seed=seed,
                                        on_step=on_step, return_fill_steps=True)

    def _generate_chunked(self, item: _Item, gen: GenerationConfig, seed, on_step):
        """Long text: split at sentence boundaries into ~audio_chunk_duration pieces.

        With a reference voice every chunk is conditioned on it. Without one (auto / design),
        chunk 0 is generated first and its codes + text become the reference for every later
        chunk, which keeps the voice consistent across the utterance (the reference's rule).
        """
        chunks = text_mod.chunk_text(item.text, item.frames, gen.audio_chunk_duration,
                                     self.frame_rate)
        codes, steps = [], []

        def run(chunk: str, ref_text, ref_codes):
            frames = text_mod.estimate_target_frames(
                chunk, ref_text, None if ref_codes is None else ref_codes.shape[1],
                speed=item.speed if item.speed else 1.0)
            sub = _Item(chunk, frames, item.language, item.instruct, ref_text, ref_codes, item.ref_rms)
            c, s = self._unmask([sub], gen, seed, on_step)
            codes.append(c[0])
            steps.append(s[0])

        if item.ref_codes is not None:
            for chunk in chunks:
                run(chunk, item.ref_text, item.ref_codes)
        else:
            run(chunks[0], None, None)
            for chunk in chunks[1:]:
                run(chunk, chunks[0], codes[0])
        return codes, steps, chunks
