"""What the page says to a visitor: one short line per problem, in the page's own words.

The library's typed errors (omnicore/errors.py) are written for developers: they name
parameters, commands and files, which an API caller needs and a Space visitor cannot use. The
page keeps them for its log and shows `visitor_line` instead: which field it is about (so that
the line sits next to that field) and one sentence that names no parameter, command or server
path. Alongside:
  * `read_instruct`: a voice description as the model will read it, strict items first, else
    free prose through the mapping the HTTP server uses (omnicore.text.prose);
  * `clip_notes`: the checks of a reference clip the page asks for (3-10 s, a transcript that
    fits it) as warnings, before any work;
  * `language_choices`: the language picker's entries, with native names and codes, the most
    spoken languages first (the picker's search keeps the list's order).
"""

from __future__ import annotations

import difflib
import re

from omnicore.errors import AudioError, ConfigError, OmniCoreError, VoicePromptError
from omnicore.text import frontend, limits
from omnicore.text.prose import instruct_from_prose

# The fields a line can be about (elem ids on the page hold these names).
TEXT, CLIP, TRANSCRIPT, VOICE_FILE, INSTRUCT, SETTINGS = (
    "text", "clip", "transcript", "voice file", "description", "settings")

# The page's name of each setting the library checks by its parameter name.
SETTING_NAMES = {
    "num_step": "Steps", "guidance_scale": "Guidance", "speed": "Speed",
    "duration": "Fixed duration", "seed": "Seed", "t_shift": "Schedule shift",
    "layer_penalty_factor": "Layer penalty", "position_temperature": "Position temperature",
    "class_temperature": "Class temperature", "profile": "Quality",
}
CLIP_ASK = (3.0, 10.0)  # seconds of clip the page asks for
NO_PICK = "(any)"


def clean(line: str) -> str:
    """A line with no server path, no `command` and no parameter name left in it."""
    line = re.sub(r"`[^`]*`", "", line)  # commands and code
    line = re.sub(r"'?(?:[A-Za-z]:)?[/\\][^\s']*'?", "the file", line)  # paths
    for name, label in SETTING_NAMES.items():
        line = re.sub(rf"\b{name}\b", label, line)
    line = re.sub(r"\bref_text\b", "transcript", line)
    line = re.sub(r"\s*\([^()]*\)\s*", " ", line)  # asides: detail for developers
    line = re.sub(r"\s+", " ", line).strip(" ;,")
    first = re.split(r"(?<=[.!?])\s|;\s", line, maxsplit=1)[0].rstrip(".")
    return (first[:1].upper() + first[1:] + ".") if first else "This input cannot be used."


def visitor_line(exc: Exception, text_cap: int = limits.MAX_TEXT_CHARS) -> tuple[str, str]:
    """(field, one visitor-worded line) for an error a run raised."""
    msg = str(exc)
    if isinstance(exc, VoicePromptError):
        return VOICE_FILE, "This voice file cannot be read: use a .npz file saved by this page."
    if isinstance(exc, AudioError):
        if "not found" in msg:
            return CLIP, "The clip did not arrive: upload it again."
        if "cannot read" in msg:
            return CLIP, "This clip cannot be read: try a WAV, MP3 or FLAC recording."
        if "long" in msg:
            return CLIP, (f"The clip is too long: use {CLIP_ASK[0]:g}-{CLIP_ASK[1]:g} s of "
                          "speech.")
        return CLIP, ("This clip cannot be used: try another recording of "
                      f"{CLIP_ASK[0]:g}-{CLIP_ASK[1]:g} s of speech.")
    if isinstance(exc, ConfigError) and "tn" in msg:
        return SETTINGS, "Reading numbers as words is not available here: untick it."
    if msg.startswith("text is empty"):
        return TEXT, "Type some text to speak."
    if re.match(r"text is [\d,]+ characters", msg):
        return TEXT, f"The text is too long: at most {text_cap:,} characters here."
    if msg.startswith("one generation pass would be"):
        return TEXT, ("A sentence is too long to say in one go: add full stops or commas, or "
                      "lower the fixed duration.")
    if msg.startswith("ref_text is required"):
        return TRANSCRIPT, "Type what the clip says."
    if msg.startswith("ref_text is"):
        return TRANSCRIPT, (f"The transcript is too long: use a {CLIP_ASK[0]:g}-"
                            f"{CLIP_ASK[1]:g} s clip and what it says.")
    if "instruct" in msg:
        return INSTRUCT, describe_instruct_error(msg)
    for name, label in SETTING_NAMES.items():
        if msg.startswith(name + " "):
            return SETTINGS, clean(msg)
    if isinstance(exc, OmniCoreError):
        return SETTINGS, clean(msg)
    return SETTINGS, "Something went wrong on the server; please try again."


def describe_instruct_error(msg: str) -> str:
    """The library's instruct error as one line, "did you mean" first."""
    close = re.findall(r"'([^']+)': did you mean '([^']+)'", msg)
    if close:
        return "Did you mean " + ", ".join(f"'{good}'" for _, good in close) + "?"
    if "dialect" in msg and "accent" in msg:
        return "Pick an English accent or a Chinese dialect, not both."
    if "one item per category" in msg or "same category" in msg:
        return "Pick one word per kind (one gender, one age, one pitch)."
    if "mix" in msg or "all English" in msg:
        return "Describe the voice all in English or all in Chinese."
    return clean(msg)


def _typo(piece: str) -> str | None:
    """The vocabulary word a short piece was probably meant to be ("femal" -> "female")."""
    forms = [f for items in frontend.instruct_vocabulary().values() for item in items
             for f in (item.en, item.zh) if f]
    key = piece.strip().lower()
    if not key or len(key.split()) > 2 or key in forms:
        return None
    close = difflib.get_close_matches(key, forms, n=1, cutoff=0.6)
    return close[0] if close else None


def read_instruct(instruct: str | None, text: str | None = None
                  ) -> tuple[str | None, str | None, str | None]:
    """A voice description -> (the instruct the model reads or None, what was understood (a
    line) or None, a visitor error line or None).

    The design pickers' items ("female, british accent") are read strictly; a near miss of an
    item ("femal") is a "did you mean" error; anything else is free prose ("a warm, calm
    middle-aged man") mapped like the HTTP server maps OpenAI's `instructions`, and the line
    says what it understood and what it left out."""
    if not instruct or not instruct.strip():
        return None, None, None
    try:
        resolved = frontend.resolve_instruct(instruct, text or None)
        return instruct.strip(), f"The model reads: {resolved}.", None
    except OmniCoreError as exc:
        strict_error = str(exc)
    pieces = re.split(r"[,，、]", instruct)
    typos = [(p.strip(), _typo(p)) for p in pieces if _typo(p)]
    if typos:
        return None, None, "Did you mean " + ", ".join(f"'{good}'" for _, good in typos) + "?"
    if "unsupported voice-design item" not in strict_error:  # a combination of known items
        return None, None, describe_instruct_error(strict_error)
    found, ignored = instruct_from_prose(instruct)
    if found is None:
        return None, None, ("No voice words found: try e.g. 'female, low pitch, british "
                            "accent'.")
    try:
        frontend.resolve_instruct(found, text or None)
    except OmniCoreError as exc:
        return None, None, describe_instruct_error(str(exc))
    left = "; left out: " + ", ".join(f"'{s}'" for s in ignored) if ignored else ""
    return found, f"Understood as: {found}{left}.", None


def picker_items():
    """Picker choices per category: [(label, value), ...] with a leading "(any)"."""
    return {cat: [(NO_PICK, "")] + [(item.label, item.value) for item in items]
            for cat, items in frontend.instruct_vocabulary().items()}


def compose_instruct(*picked: str) -> str:
    """Join the picked attribute values with commas; resolve_instruct unifies the language."""
    return ", ".join(p for p in picked if p)


def check_instruct(instruct: str, text: str = "") -> str:
    """One line on a voice description: what the model will read (a prose description mapped
    as the HTTP server maps it: visitor.read_instruct), or what is wrong, "did you mean" first."""
    if not instruct or not instruct.strip():
        return "No attributes picked: the model will choose a voice (like *Auto voice*)."
    _, understood, problem = read_instruct(instruct, text)
    return f"⚠ {problem}" if problem else f"✓ {understood}"


def instruct_status(instruct: str, text: str = "") -> str:
    """The page's line under the description: what was understood (a problem is shown on the
    field itself, by the validator, so that it is said once)."""
    line = check_instruct(instruct, text)
    return "" if line.startswith("⚠") else line


def clip_notes(seconds: float | None, transcript: str | None,
               spoken_s: float | None = None) -> list[str]:
    """Warnings about a reference clip and its transcript, in the page's words (the run goes
    ahead: a short clip or a loose transcript still gives a voice, a worse one). `seconds`: the
    clip as uploaded; `spoken_s`: what the library's clean-up keeps of it (`spoken_seconds`),
    which the pace is judged on, as the API judges it (VoiceClonePrompt.pace_problem)."""
    notes = []
    if seconds is None:
        return notes
    low, high = CLIP_ASK
    if seconds < low:
        notes.append(f"The clip is {seconds:.1f} s long: the voice copies best from "
                     f"{low:g}-{high:g} s of speech.")
    elif high < seconds <= limits.MAX_REF_S:
        notes.append(f"The clip is {seconds:.0f} s long: {low:g}-{high:g} s copies as well and "
                     "runs faster.")
    spoken_s = seconds if spoken_s is None else spoken_s
    if transcript and transcript.strip():
        problem = frontend.reference_pace_problem(transcript.strip(), spoken_s)
        if problem and "alone" in problem:
            notes.append(f"The transcript looks too long for {spoken_s:.1f} s of speech: type "
                         "only the words the clip says.")
        elif problem:
            notes.append(f"The transcript looks too short for {spoken_s:.1f} s of speech: type "
                         "every word the clip says.")
    return notes


def clip_seconds(path) -> float | None:
    """Seconds of an uploaded clip, or None when it cannot be read (the run will say why)."""
    try:
        import soundfile as sf

        return float(sf.info(str(path)).duration)
    except Exception:  # noqa: BLE001 - unreadable here: the run reads it and explains
        return None


def spoken_seconds(model, path, preprocess: bool) -> float | None:
    """Seconds of a clip after the library's clean-up (silences trimmed: what a voice prompt
    encodes), without encoding it; None when it cannot be read (the run will say why)."""
    from omnicore.audio import postprocess

    try:
        wav, _ = postprocess.prepare_reference_audio(
            str(path), bool(preprocess), trim_long=False, sr=model.sampling_rate,
            hop_length=model.codec.hop_length)
    except Exception:  # noqa: BLE001 - unreadable here: the run reads it and explains
        return None
    return wav.shape[-1] / float(model.sampling_rate)


def voice_file_problem(path) -> str | None:
    """A visitor line when a voice file cannot be used, else None."""
    from omnicore import VoiceClonePrompt

    try:
        VoiceClonePrompt.load(path)
    except OmniCoreError as exc:
        return visitor_line(exc)[1]
    return None


# ------------------------------------------------------------------------------------------------
# Languages: native names and codes, the most spoken first
# ------------------------------------------------------------------------------------------------

# (id, native name), by number of speakers: the picker's search keeps this order, so "ja"
# finds Japanese before Javanese or Azerbaijani.
NATIVE = (
    ("en", "English"), ("zh", "中文"), ("hi", "हिन्दी"), ("es", "Español"), ("fr", "Français"),
    ("bn", "বাংলা"), ("pt", "Português"), ("ru", "Русский"), ("ja", "日本語"),
    ("de", "Deutsch"), ("yue", "粵語"), ("ko", "한국어"), ("vi", "Tiếng Việt"), ("tr", "Türkçe"),
    ("it", "Italiano"), ("ur", "اردو"), ("id", "Bahasa Indonesia"), ("fa", "فارسی"),
    ("ta", "தமிழ்"), ("te", "తెలుగు"), ("mr", "मराठी"), ("pl", "Polski"), ("uk", "Українська"),
    ("th", "ไทย"), ("nl", "Nederlands"), ("gu", "ગુજરાતી"), ("pa", "ਪੰਜਾਬੀ"),
    ("ms", "Bahasa Melayu"),
    ("sw", "Kiswahili"), ("fil", "Filipino"), ("ro", "Română"), ("el", "Ελληνικά"),
    ("cs", "Čeština"), ("hu", "Magyar"), ("sv", "Svenska"), ("he", "עברית"), ("da", "Dansk"),
    ("fi", "Suomi"), ("no", "Norsk"), ("sr", "Српски"), ("hr", "Hrvatski"), ("bg", "Български"),
    ("sk", "Slovenčina"), ("ca", "Català"), ("ka", "ქართული"), ("hy", "Հայերեն"),
    ("az", "Azərbaycanca"), ("kk", "Қазақша"), ("uz", "Oʻzbekcha"), ("am", "አማርኛ"),
)


def language_choices() -> list[tuple[str, str]]:
    """(label, id) per language: "Japanese · 日本語 (ja)" for the languages with a native
    name, most spoken first, then every other one by its English name ("Abkhazian (ab)")."""
    every = frontend.language_choices()  # ("Japanese (ja)", "ja"), by English name
    english = {i: label.rsplit(" (", 1)[0] for label, i in every}
    first = []
    for lang_id, native in NATIVE:
        if lang_id not in english:
            continue
        shown = english[lang_id] if native == english[lang_id] else (
            f"{english[lang_id]} · {native}")
        first.append((f"{shown} ({lang_id})", lang_id))
    seen = {i for _, i in first}
    return first + [(label, i) for label, i in every if i not in seen]

