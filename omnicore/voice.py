"""Results and voices: `Synthesis` (what one generation returns; `as_voice()` keeps its voice)
and `VoiceClonePrompt` (a reusable voice, saved as a plain .npz), with the checks every loaded
or passed prompt goes through. Imported by the API, the streaming sink and the engine's callers alike, so none of
them has to import another for these types.

Dimension legend: C = 8 codebooks, T = generated frames (25 per second), R = reference frames,
L = samples (24 000 per second).
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .audio import postprocess, writers
from .errors import AudioError, InputError, VoicePromptError
from .model.config import FRAME_RATE, SAMPLE_RATE
from .text import frontend, limits

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
    sample_rate: int = SAMPLE_RATE
    # (start sample, length) of the silence of every pause mark ([pause:1.5s]) in `audio`
    pauses: tuple[tuple[int, int], ...] = ()

    def as_voice(self, text: str | None = None) -> "VoiceClonePrompt":
        """Keep this result's voice: a `VoiceClonePrompt` of its codes, its text and its
        loudness, so that a later call with `voice_clone_prompt=` speaks with the same speaker
        (see `voice_from_synthesis`). Save it with `.save(path)`."""
        return voice_from_synthesis(self, text)


def voice_from_synthesis(synthesis: Synthesis, text: str | None = None) -> "VoiceClonePrompt":
    """A `VoiceClonePrompt` made from a generated result, so that later calls speak with the
    same voice: the result's codes [C, T], its text and its loudness (RMS of its audio, the
    silence of pause marks left out).

    `text` is what was spoken; by default the result's text chunks, joined by spaces. A result
    longer than a voice reference may be (limits.MAX_REF_S seconds of codes, MAX_REF_TEXT_CHARS
    characters) is an InputError, and a silent one an AudioError: nothing to keep.
    """
    codes = np.array(synthesis.codes, dtype=np.int64)  # [C, T], a copy: the prompt owns it
    if codes.ndim != 2 or codes.shape[1] == 0:
        raise InputError(f"the result has no codes to keep (shape {list(codes.shape)})")
    if text is None:
        chunks = list(synthesis.text_chunks)
        text = chunks[0] if len(chunks) == 1 else " ".join(c.strip() for c in chunks)
    text = limits.validate_ref_text(text.strip() if isinstance(text, str) else text,
                                      "the text of the kept voice")
    if codes.shape[1] > limits.MAX_REF_FRAMES:
        raise InputError(
            f"the result is {codes.shape[1] / FRAME_RATE:.1f} s long; a kept voice holds "
            f"at most {limits.MAX_REF_S:g} s (every later pass re-reads it). Keep the voice of "
            "a shorter result (a sentence or two is plenty).")
    wav = np.asarray(synthesis.audio, np.float32)
    if synthesis.pauses:  # the loudness of the speech, not of the silences asked for
        keep = np.ones(wav.shape[-1], bool)
        for start, n in synthesis.pauses:
            keep[start:start + n] = False
        wav = wav[keep]
    rms = postprocess.reference_rms(wav) if wav.size else 0.0
    if not rms > 0:
        raise AudioError("the result is silent; there is no voice to keep")
    # Loudness above 0.1 leaves later outputs as they are, so the cap changes nothing.
    return VoiceClonePrompt(codes, text, min(rms, limits.MAX_REF_RMS))


@dataclass(frozen=True)
class VoiceClonePrompt:
    """A reusable voice: the reference clip's codes, its transcript and its loudness.

    Saved as a plain .npz (no pickle: `np.load(..., allow_pickle=False)` reads it), with a
    format name and version so that files from a future omnicore are refused clearly.
    """

    ref_audio_tokens: np.ndarray  # int64 [C, R]
    ref_text: str
    ref_rms: float

    def __repr__(self) -> str:
        """Its shape, length and transcript, not its codes (thousands of numbers)."""
        shape = np.shape(self.ref_audio_tokens)
        text = self.ref_text if not isinstance(self.ref_text, str) or len(self.ref_text) <= 80 \
            else self.ref_text[:77] + "..."
        return (f"VoiceClonePrompt(codes {'x'.join(map(str, shape))}, "
                f"{shape[-1] / FRAME_RATE if shape else 0:.2f} s, ref_text={text!r}, "
                f"ref_rms={self.ref_rms!r})")

    def pace_problem(self) -> str | None:
        """Why this voice's transcript cannot be what its clip says (the speaking rate they
        imply is not speech: frontend.reference_pace_problem), or None. The API warns with it
        (RefTextMismatchWarning) when a clip becomes a voice; one line of ASCII, so a server
        can put it in a header."""
        frames = np.shape(self.ref_audio_tokens)[-1]
        return frontend.reference_pace_problem(self.ref_text, frames / FRAME_RATE)

    def save(self, path: str | Path) -> None:
        """Write the prompt to `path` (an npz file; `path` is complete or untouched). Its values
        go through the check `load` makes (`check_voice_prompt`), so a file `save` writes is
        one `load` reads: a prompt that fails it, or a path that cannot be written (missing
        folder, a folder or device, no space), is a VoicePromptError and nothing is written."""
        try:
            prompt = check_voice_prompt(self)
        except InputError as exc:
            raise VoicePromptError(f"{path}: not saved: {exc}") from None
        meta = {"format": VOICE_PROMPT_FORMAT, "version": VOICE_PROMPT_VERSION,
                "ref_text": prompt.ref_text, "ref_rms": prompt.ref_rms}
        tokens = prompt.ref_audio_tokens
        meta_bytes = np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)
        # Complete or untouched, also with concurrent saves to one path (unique temp names).
        writers.write_atomic(path, lambda fh: np.savez(fh, ref_audio_tokens=tokens, meta=meta_bytes),
                           VoicePromptError)

    @classmethod
    def load(cls, path: str | Path) -> "VoiceClonePrompt":
        """Read a prompt saved by `save`, or by the reference's `VoiceClonePrompt.save` (a
        torch .pt zip, read by `torchfile` without torch and without running its pickle); every
        value in it is checked (`check_voice_prompt`), and anything else (not a zip, a FIFO or
        folder, hostile headers or pickles) is a VoicePromptError."""
        from .machinery import torchfile  # only prompt files need it

        try:
            # np.load would block on a FIFO and read any .npy whole; a prompt is a regular zip.
            if Path(path).exists() and not Path(path).is_file():
                raise VoicePromptError(f"{path}: not a regular file; pass a voice prompt .npz")
            if Path(path).is_file() and torchfile.is_torch_file(path):
                tokens, ref_text, ref_rms = torchfile.read_reference_voice_prompt(path)
                meta = None
            else:
                _check_npz_size(path)
                if Path(path).is_file() and not zipfile.is_zipfile(path):
                    raise VoicePromptError(
                        f"{path}: not an omnicore voice prompt (not an .npz archive). Create one "
                        "with `omnicore clone-prompt ref.wav --ref-text '...' -o voice.npz`.")
                _check_npz_members(path)
                with np.load(path, allow_pickle=False) as z:
                    shape, dtype = _npz_member_shape(z, "ref_audio_tokens")
                    if (len(shape) != 2 or not 1 <= shape[0] <= 64
                            or not 1 <= shape[1] <= limits.MAX_REF_FRAMES):
                        raise VoicePromptError(
                            f"{path}: the voice prompt's codes have shape {list(shape)}; expected "
                            f"[{PROMPT_CODEBOOKS}, frames] with 1 to {limits.MAX_REF_FRAMES} frames "
                            f"({limits.MAX_REF_S:g} s). Re-create it from a 3-10 s clip.")
                    if math.prod(_npz_member_shape(z, "meta")[0]) > _MAX_META_BYTES:
                        raise VoicePromptError(f"{path}: the voice prompt's metadata is over "
                                               f"{_MAX_META_BYTES:,} bytes; not an omnicore prompt")
                    tokens = np.array(z["ref_audio_tokens"])
                    meta = json.loads(bytes(z["meta"]).decode("utf-8"))
        except VoicePromptError:
            raise
        except FileNotFoundError:
            raise VoicePromptError(f"{path}: voice prompt file not found") from None
        except Exception as exc:  # zip, npy, JSON and key errors of an untrusted file alike
            raise VoicePromptError(
                f"{path}: not an omnicore voice prompt ({type(exc).__name__}). Create one with "
                "`omnicore clone-prompt ref.wav --ref-text '...' -o voice.npz` (the .pt files of "
                "the PyTorch omnivoice package's VoiceClonePrompt.save load too)."
            ) from None
        if meta is not None:
            if not isinstance(meta, dict) or meta.get("format") != VOICE_PROMPT_FORMAT:
                raise VoicePromptError(f"{path}: not an omnicore voice prompt file")
            if meta.get("version") != VOICE_PROMPT_VERSION:
                raise VoicePromptError(f"{path}: voice prompt version {meta.get('version')!r} is "
                                       f"not supported by this omnicore (it reads version "
                                       f"{VOICE_PROMPT_VERSION})")
            ref_text, ref_rms = meta.get("ref_text"), meta.get("ref_rms")
        prompt = cls(tokens, ref_text, ref_rms)
        try:
            return check_voice_prompt(prompt)
        except InputError as exc:
            raise VoicePromptError(f"{path}: {exc} (the file is damaged or was edited; "
                                   "re-create it with `omnicore clone-prompt`)") from None


# What every OmniVoice checkpoint uses: 8 codebooks of the Higgs codec with 1024 codes each
# (id 1024 is the model's MASK). generate() checks prompts again against the loaded model.
PROMPT_CODEBOOKS = 8
PROMPT_CODEBOOK_SIZE = 1024
# The meta JSON holds a format tag, a version, ref_text and ref_rms: a few KB at most.
_MAX_META_BYTES = 1 << 20


# What a prompt's .npz may hold, as stored (np.savez does not compress): its two members, the
# codes at their largest ([64, MAX_REF_FRAMES] int64) and the metadata, each with its header.
_NPZ_MEMBERS = {"ref_audio_tokens.npy": 64 * limits.MAX_REF_FRAMES * 8 + 4096,
                "meta.npy": _MAX_META_BYTES + 4096}
_MAX_NPZ_BYTES = sum(_NPZ_MEMBERS.values()) + 4096


def _check_npz_size(path) -> None:
    """Refuse a file larger than any prompt before reading it (a 19 MB zip bomb would cost
    its inflation on every read)."""
    size = Path(path).stat().st_size
    if size > _MAX_NPZ_BYTES:
        raise VoicePromptError(f"{path}: {size:,} bytes, larger than any voice prompt "
                               f"({_MAX_NPZ_BYTES:,}); not an omnicore voice prompt")


def _check_npz_members(path) -> None:
    """Refuse, from the zip's directory and before a byte is inflated, members that are not
    a prompt's or that would expand past a prompt's size."""
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            bound = _NPZ_MEMBERS.get(info.filename)
            if bound is None or info.file_size > bound:
                raise VoicePromptError(
                    f"{path}: holds {info.filename[:80]!r} ({info.file_size:,} bytes expanded), "
                    "which no voice prompt holds; not an omnicore voice prompt")


def _npz_member_shape(z, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of npz member `name`, read from its .npy header before any data, so a
    hostile file cannot make `load` allocate a huge array."""
    with z.zip.open(f"{name}.npy") as fh:
        version = np.lib.format.read_magic(fh)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"unsupported .npy version {version}")
        shape, _, dtype = read(fh)
    return shape, dtype


def check_voice_prompt(prompt: "VoiceClonePrompt", num_codebooks: int = PROMPT_CODEBOOKS,
                       codebook_size: int = PROMPT_CODEBOOK_SIZE) -> "VoiceClonePrompt":
    """Return `prompt` with int64 codes if every value in it is usable, else InputError.

    Codes: an integer array [num_codebooks, R] with 1 <= R <= limits.MAX_REF_FRAMES and every
    code in [0, codebook_size). ref_text: see limits.validate_ref_text. ref_rms: a finite number
    in (0, limits.MAX_REF_RMS] (it scales the output, so a bad value inverts, silences or
    overflows the audio).
    """
    if not isinstance(prompt, VoiceClonePrompt):
        raise InputError("voice_clone_prompt must be a VoiceClonePrompt "
                         "(from create_voice_clone_prompt or VoiceClonePrompt.load)")
    tokens = prompt.ref_audio_tokens
    if not isinstance(tokens, np.ndarray) or tokens.dtype.kind not in "iu":
        kind = getattr(tokens, "dtype", type(tokens).__name__)
        raise InputError(f"voice prompt codes must be an integer numpy array, got {kind}")
    if tokens.ndim != 2 or tokens.shape[0] != num_codebooks:
        raise InputError(f"voice prompt codes must have shape [{num_codebooks}, frames], "
                         f"got {list(tokens.shape)}")
    limits.validate_ref_frames(tokens.shape[1], "the voice prompt's reference audio")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= codebook_size:
        raise InputError(f"voice prompt codes must lie in [0, {codebook_size - 1}], found "
                         f"{lo}..{hi}")
    ref_text = limits.validate_ref_text(prompt.ref_text, "the voice prompt's ref_text")
    ref_rms = limits.validate_ref_rms(prompt.ref_rms, "the voice prompt's ref_rms")
    if tokens.dtype == np.int64 and ref_rms == prompt.ref_rms and type(prompt.ref_rms) is float:
        return prompt
    return VoiceClonePrompt(tokens.astype(np.int64), ref_text, ref_rms)
