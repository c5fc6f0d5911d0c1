"""Multi-speaker scripts: one line per turn, one voice per speaker, one output.

    alice: Hello there.
    bob: Hi! How are you?
    # comment lines and blank lines are skipped

    from omnicore import OmniVoice
    from omnicore.apps.script import synthesize_script
    model = OmniVoice.from_pretrained("k2-fsa/OmniVoice")
    result = synthesize_script(model, open("dialogue.txt").read(), {
        "alice": {"voice": "alice.npz"},                        # a saved voice prompt
        "bob": {"instruct": "male, low pitch", "seed": 7},      # a designed voice
        "carol": {"ref_audio": "carol.wav", "ref_text": "..."}, # a clip to clone
        "dan": {},                                              # an auto voice
    }, gap=0.4, num_step=16)
    result.audio, result.turns                # float32 [L] at 24 kHz; start/end of every turn

A speaker without a reference (designed or auto) is spoken by its first turn; that result is
then kept as the speaker's voice (`Synthesis.as_voice`: its codes, text and loudness) and
every later turn of the speaker is conditioned on it, so the speaker sounds the same throughout
(the rule the model itself follows for the chunks of one long text). Turns are joined by exactly
`gap` seconds of digital silence; each turn keeps its own edge padding (`pad_duration`, 0.1 s).

Built on the public API only (`OmniVoice.synthesize`, `create_voice_clone_prompt`,
`VoiceClonePrompt.load`, the atomic writers of `audio`).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..audio import writers
from ..errors import InputError, OmniCoreError
from ..model.config import FRAME_RATE, MAX_SEED, SAMPLE_RATE, validate_seed
from ..text import frontend, limits, planner

# A script is one job, like one call: its spoken text shares limits.MAX_TEXT_CHARS. Every turn is
# at least one generation pass, so the number of turns is bounded too (1,000 turns are 20
# characters each at the text limit); beyond that it is a wrongly piped file, not a dialogue.
MAX_TURNS = 1000
# The raw script (names, comments, blank lines included) that is read at all.
MAX_SCRIPT_CHARS = 10 * limits.MAX_TEXT_CHARS
# Speaker names: a word character first, then words, spaces, dots, apostrophes or hyphens
# ("Dr. Smith", "O'Brien", "李雷"); long enough for any name, short enough to spot a sentence.
MAX_NAME_CHARS = 64
_NAME = re.compile(r"\w[\w .'\-]*")
# Silence between turns; longer pauses belong in the text or in an editor.
MAX_GAP_S = 10.0
DEFAULT_GAP_S = 0.4

_LINE = re.compile(r"\s*(?P<name>[^:：]*?)\s*[:：](?P<text>.*)", re.DOTALL)  # ASCII or full-width colon
_SPEC_KEYS = ("voice", "instruct", "ref_audio", "ref_text", "seed", "language", "speed")
# What a turn's call takes from its speaker, not from the caller's keyword arguments.
_PER_SPEAKER = ("text", "voice_clone_prompt", "ref_audio", "ref_text", "instruct", "duration")


# ---------------------------------------------------------------------------------------------
# Parsing: script lines and the voice mapping
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One turn as written: 1-based line number, speaker name, text."""

    line: int
    speaker: str
    text: str


def parse_script(script) -> list[Line]:
    """The turns of a script, checked: `script` is the text (one `speaker: text` per line; blank
    lines and lines starting with `#` are skipped), a list of such lines, or a list of
    (speaker, text) pairs. InputError with the line number for a line without a speaker, an
    empty turn, a bad name; for too many turns or too much text in all."""
    if isinstance(script, str):
        if len(script) > MAX_SCRIPT_CHARS:
            raise InputError(f"the script is {len(script):,} characters long; the limit is "
                             f"{MAX_SCRIPT_CHARS:,}. Split it into several scripts.")
        lines = script.splitlines()
    elif isinstance(script, (list, tuple)):
        lines = list(script)
    else:
        raise InputError(f"a script is a string, a list of 'speaker: text' lines or a list of "
                         f"(speaker, text) pairs, got {type(script).__name__}")
    turns: list[Line] = []
    for number, raw in enumerate(lines, 1):
        if isinstance(raw, (tuple, list)) and len(raw) == 2:
            name, spoken = raw
            if not isinstance(name, str) or not isinstance(spoken, str):
                raise InputError(f"script line {number}: a (speaker, text) pair of strings was "
                                 f"expected, got ({type(name).__name__}, {type(spoken).__name__})")
            name, spoken = name.strip(), spoken.strip()
        elif isinstance(raw, str):
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            m = _LINE.fullmatch(raw)
            if m is None:
                raise InputError(f"script line {number}: no speaker in {_clip(raw)!r}; write each "
                                 "turn as 'speaker: text' (e.g. 'alice: Hello there.')")
            name, spoken = m["name"], m["text"].strip()
        else:
            raise InputError(f"script line {number}: expected a 'speaker: text' string or a "
                             f"(speaker, text) pair, got {type(raw).__name__}")
        _check_name(name, f"script line {number}")
        if not spoken:
            raise InputError(f"script line {number}: {name} has nothing to say; write the text "
                             "after the colon or remove the line")
        try:
            planner.split_pauses(limits.validate_text(spoken))  # [pause:1s] marks too
        except InputError as exc:
            raise InputError(f"script line {number} ({name}): {exc}") from None
        turns.append(Line(number, name, spoken))
        if len(turns) > MAX_TURNS:
            raise InputError(f"script line {number}: more than {MAX_TURNS:,} turns; the limit is "
                             f"{MAX_TURNS:,} per script. Split it into several scripts.")
    if not turns:
        raise InputError("the script has no turns; write one 'speaker: text' line per turn")
    total = sum(len(t.text) for t in turns)
    if total > limits.MAX_TEXT_CHARS:
        raise InputError(
            f"the script's turns hold {total:,} characters of text in all; the limit is "
            f"{limits.MAX_TEXT_CHARS:,} per script (as per call). Split it into several scripts.")
    return turns


def _clip(s: str, limit: int = 60) -> str:
    s = s.strip()
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _check_name(name, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: the speaker name is empty; write 'speaker: text'")
    if len(name) > MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise InputError(
            f"{where}: {_clip(name)!r} is not a speaker name (a letter or digit first, then "
            f"letters, digits, spaces, . ' - ; at most {MAX_NAME_CHARS} characters); write each "
            "turn as 'speaker: text'")
    return name


@dataclass(frozen=True)
class Speaker:
    """How one speaker sounds. At most one of `prompt` (a loaded VoiceClonePrompt), `ref_audio`
    (+ `ref_text`) and `instruct`; none of them is an auto voice. `seed`, `language` and `speed`
    apply to the speaker's turns (None: the script's defaults)."""

    name: str
    prompt: object = None
    ref_audio: object = None
    ref_text: str | None = None
    instruct: str | None = None
    seed: int | None = None
    language: str | None = None
    speed: float | None = None

    @property
    def kind(self) -> str:
        if self.prompt is not None:
            return "voice"
        if self.ref_audio is not None:
            return "ref_audio"
        return "instruct" if self.instruct is not None else "auto"


def parse_voices(voices: Mapping, base_dir: str | os.PathLike | None = None) -> dict[str, Speaker]:
    """The voice mapping, checked: speaker name -> one of
        a VoiceClonePrompt, or a path to a voice prompt file (str / PathLike)
        {"voice": path}                         a voice prompt file (.npz, or a reference .pt)
        {"ref_audio": path, "ref_text": "..."}  a clip to clone (encoded once per script)
        {"instruct": "female, low pitch"}       a designed voice
        {} or None                              an auto voice
    each dict optionally with "seed", "language", "speed". Relative paths are taken from
    `base_dir` (the mapping file's folder) when given. Names match script lines ignoring case.
    Voice files are loaded here (VoicePromptError for a bad one)."""
    from .. import VoiceClonePrompt

    if not isinstance(voices, Mapping):
        raise InputError(f"voices must be a mapping of speaker name -> voice, got "
                         f"{type(voices).__name__}")
    out: dict[str, Speaker] = {}
    folded: dict[str, str] = {}

    def path_of(value, what):
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
            raise InputError(f"{what} must be a file path, got {value!r}")
        p = Path(os.fspath(value)).expanduser()
        return p if base_dir is None or p.is_absolute() else Path(base_dir) / p

    for name, spec in voices.items():
        _check_name(name, "voices")
        key = name.casefold()
        if key in folded:
            raise InputError(f"voices: {folded[key]!r} and {name!r} name one speaker (names "
                             "match ignoring case); keep one of them")
        folded[key] = name
        where = f"voices[{name!r}]"
        if isinstance(spec, Speaker):  # already parsed (e.g. by load_voices_file)
            out[name] = replace(spec, name=name)
            continue
        if isinstance(spec, VoiceClonePrompt):
            out[name] = Speaker(name, prompt=spec)
            continue
        if isinstance(spec, (str, os.PathLike)):
            spec = {"voice": spec}
        if spec is None:
            spec = {}
        if not isinstance(spec, Mapping):
            raise InputError(f"{where} must be a voice file path, a VoiceClonePrompt or an "
                             f"object with {', '.join(_SPEC_KEYS)}; got {type(spec).__name__}")
        unknown = sorted(set(spec) - set(_SPEC_KEYS), key=str)
        if unknown:
            raise InputError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; the keys "
                             f"are {', '.join(_SPEC_KEYS)}")
        given = [k for k in ("voice", "ref_audio", "instruct") if spec.get(k) is not None]
        if len(given) > 1:
            raise InputError(f"{where}: give one of voice, ref_audio and instruct, not "
                             f"{' and '.join(given)}")
        if spec.get("ref_text") is not None and spec.get("ref_audio") is None:
            raise InputError(f"{where}: ref_text needs ref_audio (the clip it transcribes)")
        prompt = ref_audio = ref_text = instruct = None
        if spec.get("voice") is not None:
            prompt = spec["voice"]
            if not isinstance(prompt, VoiceClonePrompt):
                prompt = VoiceClonePrompt.load(path_of(prompt, f"{where}['voice']"))
        elif spec.get("ref_audio") is not None:
            ref_audio = spec["ref_audio"]
            if isinstance(ref_audio, (str, os.PathLike)):
                ref_audio = path_of(ref_audio, f"{where}['ref_audio']")
                if not ref_audio.is_file():
                    raise InputError(f"{where}: ref_audio {os.fspath(ref_audio)!r} is not a file")
            ref_text = spec.get("ref_text")
            if ref_text is None:
                raise InputError(f"{where}: ref_audio needs ref_text, the transcript of the clip")
            ref_text = _checked(limits.validate_ref_text, ref_text, f"{where}['ref_text']")
        elif spec.get("instruct") is not None:
            instruct = spec["instruct"]
            if not isinstance(instruct, str) or not instruct.strip():
                raise InputError(f"{where}: instruct must be a non-empty string such as "
                                 "'female, low pitch'")
        seed = spec.get("seed")
        if seed is not None:
            seed = _checked(lambda s: validate_seed(s)[0], seed, f"{where}['seed']")
        language = spec.get("language")
        if language is not None:
            _checked(frontend.resolve_language, language, f"{where}['language']")
        speed = spec.get("speed")
        if speed is not None:
            speed = _checked(limits.validate_speed, speed, f"{where}['speed']")
        out[name] = Speaker(name, prompt, ref_audio, ref_text, instruct, seed, language, speed)
    return out


def _checked(check, value, where: str):
    try:
        return check(value)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def load_voices_file(path: str | os.PathLike) -> dict[str, Speaker]:
    """A JSON voice mapping file (see `parse_voices`); its relative paths are taken from its
    folder. InputError for a file that cannot be read or is not such a mapping."""
    path = Path(os.fspath(path))
    try:
        if not path.is_file():
            raise InputError(f"voices file {os.fspath(path)!r} is not a file")
        if path.stat().st_size > 1 << 20:
            raise InputError(f"voices file {os.fspath(path)!r} is over 1 MiB; a voice mapping "
                             "is a few lines of JSON")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read voices file {os.fspath(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"voices file {os.fspath(path)!r}: expected a JSON object of speaker "
                         "name -> voice, e.g. {\"alice\": {\"voice\": \"alice.npz\"}}")
    return parse_voices(data, path.parent)


# ---------------------------------------------------------------------------------------------
# Synthesis
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One spoken turn in the joined output: samples [start_sample, end_sample)."""

    index: int
    line: int
    speaker: str
    text: str
    start_sample: int
    end_sample: int
    sample_rate: int

    @property
    def start(self) -> float:
        return self.start_sample / self.sample_rate

    @property
    def end(self) -> float:
        return self.end_sample / self.sample_rate


@dataclass(frozen=True)
class ScriptResult:
    """The joined audio, every turn's place in it, and the voice each speaker ended up with
    (kept voices included: save one with `.save(path)` to reuse the speaker)."""

    audio: np.ndarray                 # float32 [L]
    turns: list[Turn]
    voices: dict = field(default_factory=dict)  # speaker -> VoiceClonePrompt (None: never spoke)
    kinds: dict = field(default_factory=dict)   # speaker -> voice / ref_audio / instruct / auto
    gap: float = DEFAULT_GAP_S
    sample_rate: int = SAMPLE_RATE

    def timings(self) -> dict:
        """The per-turn start/end times as a JSON-ready dict (what the CLI writes)."""
        return {
            "sample_rate": self.sample_rate,
            "gap": self.gap,
            "duration": len(self.audio) / self.sample_rate,
            "num_samples": int(len(self.audio)),
            "speakers": {name: self.kinds[name] for name in self.kinds},
            "turns": [{"index": t.index, "line": t.line, "speaker": t.speaker, "text": t.text,
                       "start": t.start, "end": t.end, "start_sample": t.start_sample,
                       "end_sample": t.end_sample} for t in self.turns],
        }


def check_gap(gap, num_turns: int = 2, sr: int = SAMPLE_RATE) -> int:
    """`gap` seconds as whole samples at `sr`; InputError outside 0 .. MAX_GAP_S, or when the
    gaps of `num_turns` turns alone would pass the output limit (limits.MAX_DURATION_S)."""
    ok = isinstance(gap, numbers.Real) and not isinstance(gap, bool)
    try:
        g = float(gap) if ok else math.nan
    except OverflowError:  # an int beyond the float range
        g = math.inf
    if not 0 <= g <= MAX_GAP_S:
        raise InputError(f"gap is {gap!r}; the silence between turns lies in 0 .. {MAX_GAP_S:g} "
                         "seconds")
    limits.check_total_frames(int(g * max(num_turns - 1, 0) * FRAME_RATE))
    return int(round(g * sr))


def check_script(script, voices: Mapping, voices_dir: str | os.PathLike | None = None
                 ) -> tuple[list[Line], dict[str, Speaker]]:
    """Everything about a script that can be checked without the model: its lines
    (`parse_script`), its voices (`parse_voices`, which loads voice files), every speaker of a
    line having a voice, every instruct valid for the turns it speaks, and the first turn of a
    speaker without a voice short enough to become its voice's transcript. Returns (lines,
    speakers); InputError with the line number otherwise."""
    lines = parse_script(script)
    speakers = parse_voices(voices, voices_dir)
    by_key = {name.casefold(): sp for name, sp in speakers.items()}
    turns_of: dict[str, list[Line]] = {}
    for ln in lines:
        sp = by_key.get(ln.speaker.casefold())
        if sp is None:
            known = ", ".join(sorted(speakers)) or "none"
            raise InputError(f"script line {ln.line}: unknown speaker {ln.speaker!r}; the voices "
                             f"given are: {known}. Add it to the voice mapping or fix the name.")
        turns_of.setdefault(sp.name, []).append(ln)
    for name, own in turns_of.items():
        sp = speakers[name]
        if sp.instruct is not None:  # the instruct's language follows each turn's text
            for ln in own:
                _checked(lambda t: frontend.resolve_instruct(sp.instruct, t), ln.text,
                         f"script line {ln.line} ({name}), instruct")
        if sp.kind in ("instruct", "auto") and len(own[0].text) > limits.MAX_REF_TEXT_CHARS:
            raise InputError(
                f"script line {own[0].line} ({name}): a speaker without a voice is given one by "
                f"its first turn, whose text becomes the voice's transcript; this one is "
                f"{len(own[0].text):,} characters, the limit is {limits.MAX_REF_TEXT_CHARS:,}. "
                "Put a shorter line first for this speaker, or give it a voice file.")
    return lines, speakers


def synthesize_script(model, script, voices: Mapping, *, gap: float = DEFAULT_GAP_S,
                      language=None, speed=None, seed: int | None = None,
                      on_turn: Callable[[int, int, Line], None] | None = None,
                      voices_dir: str | os.PathLike | None = None,
                      **gen_kwargs) -> ScriptResult:
    """Speak a multi-speaker `script` (see `parse_script`) with `voices` (see `parse_voices`,
    or a dict of `Speaker`s) on `model` (an OmniVoice), one turn after another.

    `gap`: seconds of silence between turns (0 .. MAX_GAP_S). `language`, `speed`: defaults for
    speakers that set none. `seed`: turn k (from 0) uses seed + k unless its speaker has a seed
    of its own. `on_turn(k, num_turns, line)` is called before each turn. Other keyword
    arguments go to every `model.synthesize` call (num_step, guidance_scale, denoise, ...).

    Everything is checked before the first turn is generated (script lines, speaker names,
    voice files, instructs, seeds); a failure while a turn runs is raised with its line number.
    """
    for key in _PER_SPEAKER:
        if key in gen_kwargs:
            raise InputError(f"{key} is set per speaker in a script (the voices mapping), not "
                             "for the whole call")
    if on_turn is not None and not callable(on_turn):
        raise InputError("on_turn must be a function (turn, num_turns, line) or None")
    lines, speakers = check_script(script, voices, voices_dir)
    sr = int(model.sampling_rate)
    gap_n = check_gap(gap, len(lines), sr)
    base_seed = _checked(lambda s: validate_seed(s)[0], seed, "seed")
    default_speed = None if speed is None else _checked(limits.validate_speed, speed, "speed")
    if language is not None:
        _checked(frontend.resolve_language, language, "language")
    by_key = {name.casefold(): sp for name, sp in speakers.items()}
    spoken = {by_key[ln.speaker.casefold()].name for ln in lines}

    # Clips are encoded once per speaker, not once per turn.
    voice: dict[str, object] = {}
    for name, sp in speakers.items():
        if sp.prompt is not None:
            voice[name] = sp.prompt
        elif sp.ref_audio is not None and name in spoken:
            try:
                voice[name] = model.create_voice_clone_prompt(sp.ref_audio, sp.ref_text)
            except OmniCoreError as exc:
                raise type(exc)(f"voices[{name!r}]: {exc}") from None

    pieces: list[np.ndarray] = []
    turns: list[Turn] = []
    pos = 0
    for k, ln in enumerate(lines):
        sp = by_key[ln.speaker.casefold()]
        if on_turn is not None:
            on_turn(k, len(lines), ln)
        turn_seed = sp.seed if sp.seed is not None else (
            None if base_seed is None else (base_seed + k) % (MAX_SEED + 1))
        kw = dict(gen_kwargs, language=sp.language if sp.language is not None else language,
                  speed=sp.speed if sp.speed is not None else default_speed, seed=turn_seed,
                  instruct=sp.instruct, voice_clone_prompt=voice.get(sp.name))
        try:
            result = model.synthesize(ln.text, **kw)[0]
            if sp.name not in voice:  # the first turn of a designed / auto speaker
                # The text as spoken (the result's chunks: normalised, when asked), not as written.
                voice[sp.name] = result.as_voice()
        except OmniCoreError as exc:
            raise type(exc)(f"script line {ln.line} ({sp.name}): {exc}") from None
        if k:
            pieces.append(np.zeros(gap_n, np.float32))
            pos += gap_n
        wav = np.asarray(result.audio, np.float32)
        pieces.append(wav)
        turns.append(Turn(k, ln.line, sp.name, ln.text, pos, pos + len(wav), sr))
        pos += len(wav)
    joined = np.concatenate(pieces)  # [sum of turns + gaps]
    return ScriptResult(joined, turns, {n: voice.get(n) for n in speakers},
                        {n: speakers[n].kind for n in speakers}, gap_n / sr, sr)


def timings_path_for(output: str | os.PathLike) -> str:
    """Where the per-turn timings go by default: the audio's name with .json."""
    return os.fspath(Path(os.fspath(output)).with_suffix(".json"))


def write_script_outputs(result: ScriptResult, output: str | os.PathLike,
                         timings: str | os.PathLike | None = None) -> str:
    """Write the joined audio to `output` and the per-turn timings JSON to `timings` (default:
    beside the audio, `timings_path_for`), each complete or untouched. Returns the JSON path."""
    timings = timings_path_for(output) if timings is None else os.fspath(timings)
    payload = json.dumps(result.timings(), ensure_ascii=False, indent=1).encode("utf-8") + b"\n"
    writers.write_audio_atomic(output, result.audio, result.sample_rate)
    writers.write_atomic(timings, lambda fh: fh.write(payload), InputError)
    return timings
