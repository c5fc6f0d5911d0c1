"""The server's voices: a library of named voice prompts kept in a folder, the OpenAI preset
names as documented designed voices, and a request's `voice` resolved to a prompt.

Dimensions: a prompt's codes are [C, T] (C codebooks, T frames at FRAME_RATE).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

from ..audio.writers import remove_stale_temporaries
from ..errors import VoicePromptError
from ..model.config import FRAME_RATE, GenerationConfig
from .protocol import HTTPError

VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # matched whole (fullmatch)
# A save's temporary file untouched this long is debris of a writer that died mid-save (a
# save takes milliseconds; another server sharing the folder may be writing a younger one).
STALE_TEMP_S = 60.0
# Documented designed voices behind OpenAI's preset names: made once on first use, then stored.
PRESET_SAMPLE_TEXT = "Hello! It is a pleasure to meet you, and I hope you have a wonderful day."
PRESET_VOICES = {
    "alloy": ("female, young adult, moderate pitch, american accent", 11),
    "ash": ("male, middle-aged, low pitch, american accent", 12),
    "ballad": ("male, young adult, moderate pitch, british accent", 13),
    "coral": ("female, young adult, high pitch, american accent", 14),
    "echo": ("male, young adult, moderate pitch, american accent", 15),
    "fable": ("male, middle-aged, moderate pitch, british accent", 16),
    "nova": ("female, young adult, moderate pitch, british accent", 17),
    "onyx": ("male, middle-aged, very low pitch, american accent", 18),
    "sage": ("female, middle-aged, low pitch, american accent", 19),
    "shimmer": ("female, young adult, very high pitch, american accent", 20),
    "verse": ("male, teenager, moderate pitch, american accent", 21),
}


class VoiceLibrary:
    """Named voice prompts in a folder (`<name>.npz`, or a `<name>.pt` saved by the reference's
    VoiceClonePrompt.save), loaded at start; thread-safe. New voices are written as .npz."""

    def __init__(self, folder: str | Path | None):
        from ..voice import VoiceClonePrompt

        self._cls = VoiceClonePrompt
        self.folder = Path(folder) if folder else None
        self._voices: dict[str, object] = {}
        self._lock = threading.Lock()
        self._making: dict[str, threading.Lock] = {}
        self.removed_temporaries = 0
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.removed_temporaries = remove_stale_temporaries(
                self.folder, {f"{n}.npz" for n in _temporary_names(self.folder)}, STALE_TEMP_S)
            # .pt first, so an .npz of the same name (omnicore's own) wins
            for p in sorted(self.folder.glob("*.pt")) + sorted(self.folder.glob("*.npz")):
                if VOICE_NAME.fullmatch(p.stem):
                    try:
                        self._voices[p.stem] = VoiceClonePrompt.load(p)
                    except VoicePromptError:
                        pass  # an unreadable file is skipped, not fatal: it stays for inspection

    @staticmethod
    def check_name(name) -> str:
        if not isinstance(name, str) or not VOICE_NAME.fullmatch(name):
            raise HTTPError(400, "voice name must be 1-64 characters of letters, digits, '_' or "
                                 "'-', starting with a letter or digit", "name", "invalid_voice_name")
        return name

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._voices)

    def get(self, name: str):
        with self._lock:
            return self._voices.get(name)

    def add(self, name: str, prompt) -> None:
        with self._lock:
            if name in self._voices:
                raise HTTPError(409, f"voice {name!r} already exists; DELETE it first to replace it",
                                "name", "voice_exists")
            if self.folder is not None:
                prompt.save(self.folder / f"{name}.npz")
            self._voices[name] = prompt

    def delete(self, name: str) -> bool:
        with self._lock:
            if self._voices.pop(name, None) is None:
                return False
            if self.folder is not None:
                for ext in (".npz", ".pt"):
                    (self.folder / f"{name}{ext}").unlink(missing_ok=True)
            return True

    def making_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._making.setdefault(name, threading.Lock())


def _temporary_names(folder: Path) -> set[str]:
    """Voice names that have a save's temporary file (`.<name>.npz.<random>.tmp`) in `folder`."""
    found = set()
    for p in folder.glob(".*.npz.*.tmp"):
        name = p.name[1:].partition(".npz.")[0]
        if VOICE_NAME.fullmatch(name):
            found.add(name)
    return found


def describe_voice(name: str, prompt) -> dict:
    codes = np.asarray(prompt.ref_audio_tokens)  # [C, T]
    return {"id": name, "object": "voice", "name": name, "ref_text": prompt.ref_text,
            "frames": int(codes.shape[1]), "seconds": codes.shape[1] / FRAME_RATE,
            "preset": PRESET_VOICES.get(name, (None,))[0]}


def new_voice_name(voices: VoiceLibrary, name) -> str:
    """A valid name that is neither a voice already (409: DELETE it first) nor one of the
    preset names, which stay the documented designed voices."""
    name = VoiceLibrary.check_name(name)
    if name in PRESET_VOICES:
        raise HTTPError(409, f"{name!r} is a preset voice (a documented designed voice); "
                             "choose another name", "name", "voice_reserved")
    if voices.get(name) is not None:
        raise HTTPError(409, f"voice {name!r} already exists; DELETE it first to replace it",
                        "name", "voice_exists")
    return name


def designed_voice(model, instruct: str, seed: int, language=None, sample: str | None = None,
                   on_step=None, num_step: int = GenerationConfig.num_step):
    """Generate a sample once (seeded: the same inputs make the same voice) and keep its
    codes as a voice."""
    result = model.synthesize(sample or PRESET_SAMPLE_TEXT, instruct=instruct, seed=seed,
                              language=language, num_step=num_step, on_step=on_step)[0]
    return result.as_voice()


def resolve_voice(model, voices: VoiceLibrary, voice, on_step=None):
    """A request's `voice` (a name or {"id": name}) -> a VoiceClonePrompt; a preset name not
    made yet is designed now and stored (once, even for concurrent first uses)."""
    if isinstance(voice, dict):
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice:
        raise HTTPError(400, "voice must be a voice name or {\"id\": name}", "voice", "invalid_voice")
    prompt = voices.get(voice)
    if prompt is not None:
        return prompt
    if voice in PRESET_VOICES:
        with voices.making_lock(voice):
            prompt = voices.get(voice)
            if prompt is None:
                instruct, seed = PRESET_VOICES[voice]
                prompt = designed_voice(model, instruct, seed, on_step=on_step)
                voices.add(voice, prompt)
            return prompt
    raise HTTPError(404, f"unknown voice {voice!r}; GET /v1/voices lists them", "voice",
                    "voice_not_found")
