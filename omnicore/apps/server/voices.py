"""The server's voices: the OpenAI preset names as documented designed voices, the rules for
names and labels, a voice as each API shows it, and a request's `voice` resolved to a prompt.
The store itself is library.py.

A voice's codes mean something only to the codec that made them, and a designed voice's only
to the model that designed it: every record the doors write names its maker (`made_by`: the
checkpoint's name and fingerprint, checkpoint.fingerprint). A preset made by another model is
stale (`is_stale`) and made again; a user's voice made with another codec is refused
(`check_made_by`), saying how to make it again. A record from before this (no `made_by`) is
used as it is, logged once.

Dimensions: a prompt's codes are [C, T] (C codebooks, T frames at FRAME_RATE).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError, OmniCoreError
from ...machinery import checkpoint
from ...model.config import FRAME_RATE, GenerationConfig
from .library import VOICE_NAME, VoiceLibrary
from .protocol import HTTPError

log = logging.getLogger("uvicorn.error")
MAX_LABEL_CHARS = 256  # an OpenAI voice's or consent's `name`: a label, not an identifier
# A BCP 47 language tag as OpenAI's consents take it (en, en-US, zh-Hant-TW, ...).
LANGUAGE_TAG = re.compile(r"[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*")
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
    "marin": ("female, middle-aged, moderate pitch, american accent", 22),
    "cedar": ("male, elderly, low pitch, american accent", 23),
}


@dataclass(frozen=True)
class Maker:
    """The checkpoint a server runs, as records name it: `name` for people (its folder's
    name, or the hub repo), `model` the whole checkpoint's fingerprint (backbone and codec),
    `codec` its codec's."""

    name: str
    model: str
    codec: str

    def record(self, designed: bool) -> dict:
        """A record's `made_by`: the codec's fingerprint for a cloned voice (only the codec made
        its codes), the whole model's too for a designed one."""
        made = {"checkpoint": self.name, "codec": self.codec}
        return {**made, "model": self.model} if designed else made


def maker(model) -> Maker | None:
    """The checkpoint `model` was loaded from (None for a model without a folder: its voices
    are kept without a maker). Computed once per checkpoint and state of its files: a few KB
    read, a few milliseconds."""
    model_dir, codec = getattr(model, "model_dir", None), getattr(model, "codec", None)
    codec_dir = getattr(codec, "dir", None)
    if model_dir is None or codec_dir is None:
        return None
    stamps = []
    for folder in (Path(model_dir), Path(codec_dir)):
        for name in ("config.json", "model.safetensors"):
            try:
                st = os.stat(folder / name)
            except OSError:
                return None  # the files moved since the model loaded: no claim to make
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    try:
        return _maker(str(model_dir), str(codec_dir), tuple(stamps))
    except OmniCoreError as exc:  # its files became unreadable since it loaded: no claim either
        log.warning("Voice library: the checkpoint's fingerprint cannot be read (%s); voices are "
                    "kept and used without naming their model", exc)
        return None


@functools.lru_cache(maxsize=8)
def _maker(model_dir: str, codec_dir: str, stamps: tuple) -> Maker:
    codec = checkpoint.fingerprint(codec_dir)
    whole = hashlib.sha256(
        (checkpoint.fingerprint(model_dir) + codec).encode()).hexdigest()[:16]
    return Maker(_checkpoint_name(Path(model_dir)), whole, codec)


def _checkpoint_name(folder: Path) -> str:
    """What people call a checkpoint: the hub repo of a hub cache's snapshot
    (.../models--k2-fsa--OmniVoice/snapshots/<hash>), else its folder's name (never the
    server's path, which messages to clients must not show)."""
    parts = folder.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/")
    return folder.name


def made_by(record: dict) -> dict | None:
    """A record's maker, or None (a record from before makers were kept, or none at all)."""
    made = record.get("made_by")
    if isinstance(made, dict) and all(isinstance(made.get(k), str)
                                      for k in ("checkpoint", "codec")):
        return made
    return None


def is_stale(record: dict, model) -> bool:
    """Whether a preset's record says another checkpoint made it (its whole model's
    fingerprint differs from `model`'s), so it must be designed again with `model`. A record
    without a maker is not stale: it is used as it is (`note_unmarked` logs it once)."""
    made, now = made_by(record), maker(model)
    return made is not None and now is not None and made.get("model") != now.model


def check_made_by(name: str, record: dict, model, param: str = "voice") -> None:
    """A 409 for a user's voice whose codes another codec made (they would be noise here),
    naming both checkpoints and saying how to make it again."""
    made, now = made_by(record), maker(model)
    if made is None or now is None:
        note_unmarked(name, record, made is None)
        return
    if made["codec"] == now.codec:
        return
    again = ("design it again with this server (DELETE it, then create it with the same "
             f"description{' ' + repr(record['prompt']) if record.get('prompt') else ''})"
             if record.get("type") == "prompt" else
             "clone it again with this server (DELETE it, then create it from its clip)")
    raise HTTPError(409, f"voice {name!r} was made with the codec of checkpoint "
                         f"{made['checkpoint']!r} (codec {made['codec']}); this server runs "
                         f"{now.name!r} (codec {now.codec}), to which its codes are noise. "
                         f"To use it here, {again}", param, "voice_made_by_another_model")


_unmarked: set[tuple] = set()


def note_unmarked(name: str, record: dict, unmarked: bool) -> None:
    """Log once per voice (and record) that it does not say which model made it."""
    key = (name, record.get("created_at"))
    if unmarked and key not in _unmarked and len(_unmarked) < 4096:
        _unmarked.add(key)
        log.info("Voice library: voice %r does not say which model made it (made before voices "
                 "kept their model, or by hand); it is used as it is. If it sounds like noise, "
                 "another checkpoint made it: delete it and make it again", name)


def describe_voice(name: str, prompt, record: dict) -> dict:
    """A voice as /v1/voices shows it: its prompt's transcript and length, and its record. A
    preset not made yet (`prompt` None) has the same fields, those of its prompt null."""
    codes = None if prompt is None else np.asarray(prompt.ref_audio_tokens)  # [C, T]
    consent = record.get("consent")
    preset = PRESET_VOICES.get(name)
    return {"id": name, "object": "voice", "name": record.get("name", name),
            "type": record.get("type"), "created_at": record.get("created_at"),
            "ref_text": None if prompt is None else prompt.ref_text,
            "frames": None if codes is None else int(codes.shape[1]),
            "seconds": None if codes is None else codes.shape[1] / FRAME_RATE,
            "preset": preset[0] if preset else None, "seed": preset[1] if preset else None,
            "made": prompt is not None,
            "consent": consent["id"] if isinstance(consent, dict) else None}


def list_voices(voices: VoiceLibrary) -> list[dict]:
    """GET /v1/voices: the library's voices by name, then the presets not made yet (blocking:
    it reads the folder)."""
    items = voices.items()
    made = {n for n, _ in items}
    return ([describe_voice(n, prompt, voices.record(n)) for n, prompt in items]
            + [describe_voice(n, None, {"type": "prompt"}) for n in PRESET_VOICES if n not in made])


def openai_voice(name: str, record: dict) -> dict:
    """A voice as OpenAI's API shows it (audio.voice); `prompt` only for a designed one."""
    out = {"id": name, "object": "audio.voice", "name": record.get("name", name),
           "type": "prompt" if record.get("type") == "prompt" else "audio_sample",
           "created_at": record.get("created_at", 0)}
    if out["type"] == "prompt" and record.get("prompt"):
        out["prompt"] = record["prompt"]
    return out


def check_label(value, param: str) -> str:
    """An OpenAI `name`: any text that is not blank, up to MAX_LABEL_CHARS, one line, and
    text (a lone surrogate such as "\\ud800", which JSON can spell but UTF-8 cannot, would
    break every answer that lists it)."""
    if not isinstance(value, str) or not value.strip():
        raise HTTPError(400, f"{param} is required (a non-blank string)", param, "invalid_value")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise HTTPError(400, f"{param} holds an unpaired surrogate at character {exc.start}; "
                             "it is not text (send UTF-8)", param, "invalid_value") from None
    if len(value) > MAX_LABEL_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise HTTPError(400, f"{param} must be one line of at most {MAX_LABEL_CHARS} characters",
                        param, "invalid_value")
    return value


def check_language_tag(value) -> str:
    if not isinstance(value, str) or not LANGUAGE_TAG.fullmatch(value):
        raise HTTPError(400, "language must be a BCP 47 language tag, e.g. 'en-US'", "language",
                        "invalid_value")
    return value


def new_voice_id() -> str:
    """A fresh id for a voice made through OpenAI's routes (a library name like any other)."""
    return "voice_" + secrets.token_hex(12)


def new_voice_name(voices: VoiceLibrary, name) -> str:
    """A valid name that is neither taken in the library (409: VoiceLibrary.check_new) nor
    one of the preset names in any case (`Alloy` would sit beside `alloy` in every list),
    which stay the documented designed voices."""
    name = VoiceLibrary.check_name(name)
    if name.lower() in PRESET_VOICES:
        raise HTTPError(409, f"{name!r} is a preset voice's name (a documented designed voice; "
                             "preset names are reserved in any case); choose another name",
                        "name", "voice_reserved")
    voices.check_new(name)
    return name


def designed_voice(model, instruct: str, seed: int, language=None, sample: str | None = None,
                   on_step=None, num_step: int = GenerationConfig.num_step):
    """Generate a sample once (seeded: the same inputs make the same voice) and keep its
    codes as a voice. Always at the exact profile, whatever the model's default: a voice is
    made once and kept, so it must be the same voice from every door and from warmup."""
    result = model.synthesize(sample or PRESET_SAMPLE_TEXT, instruct=instruct, seed=seed,
                              language=language, num_step=num_step, on_step=on_step,
                              profile="exact")[0]
    return result.as_voice()


def parse_alias(spec: str) -> tuple[str, str]:
    """`NAME=VOICE` (omnicore serve --voice-alias) -> (NAME, VOICE), both valid voice names."""
    name, sep, target = spec.partition("=")
    if not sep or not VOICE_NAME.fullmatch(name) or not VOICE_NAME.fullmatch(target):
        raise InputError(f"--voice-alias takes NAME=VOICE, two voice names (letters, digits, "
                         f"'_' or '-'), e.g. alloy=my_voice; got {spec!r}")
    return name, target


def check_aliases(voices_dir, aliases: dict | None) -> None:
    """At start-up, before the model loads: every alias (--voice-alias NAME=VOICE) names a voice
    the library holds now or a preset (made before the door is ready: startup_voices), else an
    InputError saying how to make it (an alias to a missing voice would answer 404 to every
    request for its name)."""
    aliases = {name: target for name, target in (aliases or {}).items()
               if target not in PRESET_VOICES}
    if not aliases:
        return
    if voices_dir is None:
        raise InputError(f"--voice-alias {_alias_specs(aliases)} needs --voices-dir: without "
                         "it the voice library starts empty, so the alias has no voice to speak as")
    library = VoiceLibrary(voices_dir)
    missing = {name: target for name, target in aliases.items() if library.get(target) is None}
    if missing:
        target = next(iter(missing.values()))
        have = ", ".join(library.names()) or "none"
        raise InputError(
            f"--voice-alias {_alias_specs(missing)}: no voice "
            f"{', '.join(repr(t) for t in dict.fromkeys(missing.values()))} in {voices_dir} "
            f"(voices there: {have}). Make it first, e.g. `omnicore clone-prompt me.wav "
            f"--ref-text \"What I say in me.wav.\" -o {Path(voices_dir) / target}.npz` "
            "(docs/voices.md), then start the server")


def _alias_specs(aliases: dict) -> str:
    return ", ".join(f"{name}={target}" for name, target in aliases.items())


def voice_name(voice) -> str:
    """A request's `voice` (a name or {"id": name}) -> the name, checked whole."""
    if isinstance(voice, dict):
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice:
        raise HTTPError(400, "voice must be a voice name or {\"id\": name}", "voice", "invalid_voice")
    return VoiceLibrary.check_name(voice, "voice")


def check_voice(voices: VoiceLibrary, voice, aliases=None, model=None) -> None:
    """Before admission: a request's `voice` names a voice of the library, a preset or an
    alias of a library voice (404 otherwise), made with `model`'s codec when `model` is given
    (409 otherwise: check_made_by). Blocking: it reads the folder."""
    name = voice_name(voice)
    if name in (aliases or {}):
        if aliases[name] not in PRESET_VOICES:  # an alias of a preset: made before ready
            aliased(voices, name, aliases[name], model)
    elif voices.get(name) is not None:
        if name not in PRESET_VOICES and model is not None:
            check_made_by(name, voices.record(name), model)
    elif name not in PRESET_VOICES:
        raise voice_not_found(name)


def aliased(voices: VoiceLibrary, name: str, target: str, model=None):
    """The library voice an alias (--voice-alias NAME=TARGET) speaks as; 404 when it is gone,
    409 when another codec made it (check_made_by)."""
    prompt = voices.get(target)
    if prompt is None:
        raise HTTPError(404, f"voice {name!r} is an alias of {target!r} (--voice-alias), which is "
                             "not in the voice library", "voice", "voice_not_found",
                        hint="list_voices")
    if model is not None:
        check_made_by(target, voices.record(target), model)
    return prompt


def resolve_voice(model, voices: VoiceLibrary, voice, on_step=None, aliases=None):
    """A request's `voice` (a name or {"id": name}) -> a VoiceClonePrompt; a preset name not
    made yet, or made by another checkpoint (preset_missing), is designed now and stored (once,
    even for concurrent first uses). `aliases` (name -> library voice or preset) lets a name a
    client insists on (OpenAI's presets) speak as another voice: an alias wins over a preset or
    a voice of that name. A user's voice made with another codec is a 409 (check_made_by)."""
    voice = voice_name(voice)
    if voice in (aliases or {}) and aliases[voice] in PRESET_VOICES:
        voice = aliases[voice]  # an alias of a preset speaks as the preset, made if need be
    elif voice in (aliases or {}):
        return aliased(voices, voice, aliases[voice], model)
    if voice in PRESET_VOICES:
        return make_preset(model, voices, voice, on_step)
    prompt = voices.get(voice)
    if prompt is not None:
        check_made_by(voice, voices.record(voice), model)
        return prompt
    raise voice_not_found(voice)


def make_preset(model, voices: VoiceLibrary, name: str, on_step=None):
    """Preset `name` as `model` makes it: the library's when it holds one `model` made, else
    designed now and stored (replacing one another checkpoint made), once per process even for
    concurrent callers and across servers sharing the folder. What a door calls for its presets
    before it is ready (make_presets), and a request for a preset not made yet."""
    prompt = voices.get(name)  # (read once per change of its file: cheap on every request)
    if prompt is not None and not preset_missing(model, voices, name):
        return prompt
    with voices.making_lock(name):
        if not preset_missing(model, voices, name):  # made meanwhile
            return voices.get(name)
        stale = voices.get(name) is not None
        instruct, seed = PRESET_VOICES[name]
        if stale:
            made = made_by(voices.record(name)) or {}
            log.info("Voice library: preset %r was made by checkpoint %r; making it again with "
                     "%r", name, made.get("checkpoint"), getattr(maker(model), "name", None))
        prompt = designed_voice(model, instruct, seed, on_step=on_step)
        record = {"type": "prompt", "prompt": instruct}
        now = maker(model)
        if now is not None:
            record["made_by"] = now.record(designed=True)
        try:
            voices.add(name, prompt, record, replace=stale)
        except HTTPError as exc:  # another server sharing the folder made it meanwhile
            if exc.code != "voice_exists":
                raise
            prompt = voices.get(name) or prompt
        return prompt


def nothing_to_delete(name: str, param: str = "name") -> HTTPError:
    """What deleting a voice the library does not hold answers: a preset not made yet is
    listed (list_voices) but has no file to delete, and says so."""
    if name in PRESET_VOICES:
        return HTTPError(404, f"{name!r} is a preset voice not made in this library yet: "
                              "nothing to delete (it is designed on its first use; once made, "
                              "deleting it makes it again on its next use)", param,
                         "voice_not_found")
    return voice_not_found(name, param)


# -- a door's voices, made before it is ready ---------------------------------------------------

# The voice a door makes at start-up when its requests name one: OpenAI's clients send this
# name first (and Wyoming's --voice defaults to it).
DOOR_VOICE = "alloy"
MAKING = "making voice {name}: about {seconds} s, once"


def startup_voices(default: str | None, aliases: dict | None = None) -> list[str]:
    """The presets a door makes before it is ready: its default voice and its aliases' targets,
    those of them that are presets (a library voice is there already or refused at start)."""
    names = [default, *(aliases or {}).values()]
    return [n for n in dict.fromkeys(names) if n in PRESET_VOICES]


def preset_missing(model, voices: VoiceLibrary, name: str) -> bool:
    """Whether preset `name` must be made for `model`, the one place that decides: the library
    does not hold it, another checkpoint made it (is_stale), or its record names no maker while
    `model` has one. Unlike a user's voice, a preset is the product's own and can be made again
    from its instruct and seed, so one of unknown origin (perhaps noise from a test checkpoint)
    is not trusted."""
    if voices.get(name) is None:
        return True
    record = voices.record(name)
    return is_stale(record, model) or (made_by(record) is None and maker(model) is not None)


def preset_seconds(model, name: str) -> float:
    """About how long designing preset `name` takes on this machine (machinery/warmup.py:
    its FLOPs over the measured rate, else the assumed one)."""
    from ...machinery.warmup import estimate_seconds

    instruct, seed = PRESET_VOICES[name]
    return estimate_seconds(model, PRESET_SAMPLE_TEXT, instruct=instruct, seed=seed,
                            num_step=GenerationConfig.num_step, profile="exact")


def make_presets(model, voices: VoiceLibrary, names, say=None) -> list[str]:
    """Make the presets among `names` that are missing (preset_missing), one after another,
    each announced first by `say(MAKING...)` with its estimate; the ones made. What every door
    runs before it says it is ready, and `omnicore warmup --voices-dir`."""
    made = []
    for name in names:
        if name not in PRESET_VOICES or not preset_missing(model, voices, name):
            continue
        if say is not None:
            say(MAKING.format(name=name, seconds=max(1, round(preset_seconds(model, name)))))
        make_preset(model, voices, name)
        made.append(name)
    return made


def voice_not_found(name: str, param: str = "voice") -> HTTPError:
    return HTTPError(404, f"unknown voice {name!r}", param, "voice_not_found",
                     hint="list_voices")
