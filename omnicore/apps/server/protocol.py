"""The wire protocol of the OpenAI-compatible routes: OpenAI-shaped errors, the request limits,
reading a JSON body, and the speech body's fields checked and mapped onto the model's arguments.

Every route's failures pass through here: `HTTPError` for what a route refuses itself (each
with its OpenAI-style `code` and the `param` it concerns), `as_http` for omnicore's typed
errors (ERROR_KINDS; `blame` names the field a piece of work concerns), `check_fields` for
fields a route does not know, `checked` for one of omnicore's own checks on one field.
docs/errors.md lists every code.
"""

from __future__ import annotations

import contextlib
import json
import traceback
import unicodedata
from dataclasses import fields

from ...errors import (AudioError, CancelledError, ConfigError, InputError, OmniCoreError, VoicePromptError)
from ...model.backend import PRECISIONS
from ...model.config import (FAST_PROFILE, PROFILES, GenerationConfig, resolve_generation_config, validate_seed)
from ...text import frontend, limits, prose as prose_text
from .formats import FORMATS, PIECEWISE, encoder_missing

MAX_BODY_BYTES = 1 * 2**20       # a JSON speech request: text is capped at MAX_TEXT_CHARS anyway
MAX_UPLOAD_BYTES = 20 * 2**20    # a reference clip (a 30 s 48 kHz stereo float WAV is ~11 MB)
# Names a speech request's `model` may give besides the checkpoint's own: the model's family
# and OpenAI's speech models, so unchanged OpenAI code runs (every one is the one model).
MODEL_ALIASES = ("omnivoice", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")

# The JSON types a GenerationConfig field accepts, by its declared type (a float field takes a
# JSON integer too); the numbers themselves are checked by GenerationConfig.
_JSON_TYPES = {"int": int, "float": (int, float), "bool": bool, "str": str}
GEN_FIELDS = {f.name: _JSON_TYPES[f.type] for f in fields(GenerationConfig)}
# The speech body's fields: OpenAI's, then omnicore's (every GenerationConfig field too).
SPEECH_FIELDS = ("model", "input", "voice", "instructions", "response_format", "speed",
                 "stream_format", "language", "seed", "duration", "normalize_text", "instruct",
                 *GEN_FIELDS)
OPENAI_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # what OpenAI's API offers
# The ASGI scope extension the server's runtime gives each request: a function that drops its
# connection at once (runtime.py).
CUT = "omnicore.cut"


# Speech speeds OpenAI's API takes (the model itself takes any speed > 0).
SPEED_RANGE = (0.25, 4.0)
# What a client is told of each generation profile (GET /, and the X-Omnicore-Profile header).
PROFILE_LABELS = {p: p if p == "exact" else f"{p} (approximate)" for p in PROFILES}
# And of the model's precision profile (fixed when it loads): every one but fp32 approximates
# the float32 GEMMs (int8: int8 weights and activations in the layers' projections).
PRECISION_LABELS = {p: p if p == "fp32" else f"{p} (approximate)" for p in PRECISIONS}


def precision_note(model) -> str:
    """"" at fp32; else "; precision int8 (approximate)": what a door adds to a profile's label."""
    precision = getattr(model, "precision", "fp32")
    return "" if precision == "fp32" else f"; precision {PRECISION_LABELS[precision]}"


# What a client can do about a refusal, in the HTTP door's words (its routes); each other door
# words the same hints in its own terms (mcp_server.TOOL_HINTS: its tools).
HTTP_HINTS = {
    "list_voices": "; GET /v1/voices lists them",
    "replace_voice": "; DELETE it first to replace it",
    "list_consents": "; GET /v1/audio/voice_consents lists them",
    "create_consent": "; create it at /v1/audio/voice_consents",
    "give_consent": ": upload their consent recording to POST /v1/audio/voice_consents and pass "
                    "its id as 'consent'",
}


class HTTPError(Exception):
    """A failure the client is told about: status, message, and OpenAI's `param` (the field it
    concerns, or None) and `code` (what went wrong, docs/errors.md). `hint`: a key of
    HTTP_HINTS, what the client can do, which each door words in its own terms (`worded`)."""

    def __init__(self, status: int, message: str, param: str | None, code: str,
                 headers: dict | None = None, hint: str | None = None):
        self.detail, self.hint = message, hint
        message = self.worded(HTTP_HINTS)
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def worded(self, hints: dict) -> str:
        """The message with its hint in a door's words (`hints`: that door's table)."""
        return self.detail + (hints[self.hint] if self.hint else "")


def error_body(status: int, message: str, param=None, code=None) -> dict:
    kind = ("invalid_request_error" if status < 500 else "server_error")
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def shutting_down() -> HTTPError:
    """What a request is told while the server drains for shutdown: retry (on another
    replica, or on this one once it is back)."""
    return HTTPError(503, "the server is shutting down; retry shortly", None,
                     "server_shutting_down", {"Retry-After": "5"})


def warming_up() -> HTTPError:
    """What a request is told while the server gets ready at start-up (ServerState.warm_up)."""
    return HTTPError(503, "the server is warming up (compiling its kernels, once per machine, "
                          "and making its default voice, once per voices folder); retry shortly",
                     None, "server_warming_up", {"Retry-After": "5"})


# omnicore's typed errors as a route's failure: (kind, status, code), the first that matches.
ERROR_KINDS = ((CancelledError, 499, "cancelled"), (InputError, 400, "invalid_value"),
               (AudioError, 400, "invalid_audio"), (VoicePromptError, 400, "invalid_voice"),
               (ConfigError, 400, "unsupported_value"), (OmniCoreError, 500, "server_error"))


def as_http(exc: BaseException) -> HTTPError:
    """Any failure of a route as what the client is told: an HTTPError as it is, omnicore's
    errors by ERROR_KINDS (naming the field `blame` gave them), Starlette's own refusals (e.g. a
    multipart body over its limits) by their status, anything else a 500 that names only the
    exception's type."""
    from starlette.exceptions import HTTPException

    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, HTTPException) and 400 <= exc.status_code < 500:
        return HTTPError(exc.status_code, str(exc.detail), None, "invalid_request")
    for kind, status, code in ERROR_KINDS:
        if isinstance(exc, kind):
            return HTTPError(status, str(exc), getattr(exc, "param", None), code)
    return HTTPError(500, f"internal error ({type(exc).__name__})", None, "internal_error")


@contextlib.contextmanager
def blame(params: dict):
    """Name the field that omnicore's errors raised in the block concern (`concerning`)."""
    try:
        yield
    except OmniCoreError as exc:
        concerning(exc, params)
        raise


def concerning(exc: BaseException, params: dict) -> BaseException:
    """`exc`, naming the field it concerns: `params` maps an error class to a field (the first
    class that matches wins; an error that names one already keeps it), e.g.
    {AudioError: "audio", InputError: "ref_text"}."""
    if isinstance(exc, OmniCoreError) and getattr(exc, "param", None) is None:
        exc.param = next((p for kind, p in params.items() if isinstance(exc, kind)), None)
    return exc


def checked(param: str, check, *args, code: str | None = None):
    """check(*args), one of omnicore's own checks of a value: its error (whose message says
    the allowed range) is the client's, naming `param` (and `code`, else ERROR_KINDS's)."""
    try:
        return check(*args)
    except OmniCoreError as exc:
        e = as_http(exc)
        raise HTTPError(e.status, e.message, param, code or e.code) from None


def check_fields(body: dict, known, what: str = "the request body") -> None:
    """Refuse a field a route does not take, as OpenAI's API does (a typo must not pass for a
    setting that was applied)."""
    for key in body:
        if key not in known:
            fields = f"the fields are {', '.join(known)}" if known else "it takes none"
            raise HTTPError(400, f"unknown field {key!r} in {what}; {fields}", str(key),
                            "unknown_parameter")


def forget(exc: BaseException) -> None:
    """Drop the locals of every finished frame an exception (and those it chains) holds: a
    failed request's decoded audio or arrays then go with the request, instead of staying
    reachable through a traceback until the garbage collector breaks the cycle."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


async def read_json(request, limit: int = MAX_BODY_BYTES):
    """The request's JSON body, read up to `limit` bytes (413 past it, 400 if not JSON)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise HTTPError(413, f"request body over {limit:,} bytes", None, "body_too_large")
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise HTTPError(413, f"request body over {limit:,} bytes", None, "body_too_large")
    return parse_json(body)


def parse_json(data: bytes | str, what: str = "the request body"):
    """JSON text -> its value; a 400 when it is not JSON or nests too deep to parse."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise HTTPError(400, f"{what} is not valid JSON", None, "invalid_json") from None
    except RecursionError:
        raise HTTPError(400, f"{what} nests too deep", None, "invalid_json") from None


def has_words(text: str) -> bool:
    """Whether `text` has anything to speak: a letter, digit or symbol, not only punctuation,
    spaces, marks or invisible characters (a zero-width space is text, not speech)."""
    return any(unicodedata.category(c)[0] in "LNS" for c in text)


async def read_object(request) -> dict:
    """The request's JSON body, which must be an object (400 otherwise)."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object", None, "invalid_json")
    return body


def body_field(body: dict, name: str, types, default=None, *, within=None):
    """body[name] if it is of `types` (JSON true is not a number) and, with `within` = (lo, hi),
    between lo and hi; `default` when absent or null; else a 400 naming the field."""
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise HTTPError(400, f"{name} has the wrong type: {v!r}", name, "invalid_type")
    if not isinstance(v, types):
        raise HTTPError(400, f"{name} has the wrong type: {type(v).__name__}", name, "invalid_type")
    if within is not None and not within[0] <= v <= within[1]:
        raise HTTPError(400, f"{name} must lie in [{within[0]:g}, {within[1]:g}], got {v!r}",
                        name, "invalid_value")
    return v


def parse_speech(body, models=None) -> dict:
    """OpenAI's speech body -> checked fields (HTTPError 4xx for a client mistake; `models`:
    see speech_options). An unset `stream_format` is OpenAI's default, `audio`, for the formats
    a stream sends as they are made (None: a whole file)."""
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object", None, "invalid_json")
    inp = body.get("input")
    if not isinstance(inp, str) or not inp.strip():
        raise HTTPError(400, "input must be a non-empty string", "input", "invalid_input")
    check_text(inp, "input")
    opts = speech_options(body, models=models)
    if opts["stream_format"] is None and opts["format"] in PIECEWISE:
        opts["stream_format"] = "audio"
    return {"input": inp, **opts}


def check_text(text: str, param: str) -> None:
    """A whole text to speak (every door's, speaking.py): within the length limit, and with
    words to speak."""
    check_input_length(len(text))
    if not has_words(text):
        raise HTTPError(400, f"{param} has nothing to say (only punctuation, spaces or "
                             "invisible characters): send the words to speak", param,
                        "invalid_input")


def check_input_length(n: int) -> None:
    if n > limits.MAX_TEXT_CHARS:
        raise HTTPError(400, f"input is {n:,} characters; the limit is "
                             f"{limits.MAX_TEXT_CHARS:,}", "input", "input_too_long")


def speech_options(body: dict, default_format: str = "mp3", models=None) -> dict:
    """Every speech field but the text: voice, formats, the voice-design instruct and the
    generation settings (shared by the POST body and the WebSocket's first message), each
    checked here, before admission, by omnicore's own checks. `model`, when given, must be one
    of `models` (when known): a 404 in OpenAI's shape otherwise."""
    check_fields(body, SPEECH_FIELDS)
    model = body_field(body, "model", str, None)
    if models is not None and model is not None and model not in models:
        raise HTTPError(404, f"the model {model!r} does not exist here; GET /v1/models lists "
                             f"the names this server answers to ({', '.join(models)})", "model",
                        "model_not_found")
    fmt = body_field(body, "response_format", str, default_format)
    if fmt not in FORMATS:
        known = fmt in OPENAI_FORMATS
        raise HTTPError(400, f"response_format {fmt!r} is {'not available here' if known else 'unknown'}; "
                             f"use one of {', '.join(FORMATS)}", "response_format",
                        "unsupported_format" if known else "invalid_format")
    if encoder_missing(fmt):
        raise HTTPError(400, encoder_missing(fmt), "response_format", "unsupported_format")
    stream_format = body_field(body, "stream_format", str, None)
    if stream_format not in (None, "audio", "sse"):
        raise HTTPError(400, f"stream_format must be 'audio' or 'sse', got {stream_format!r}",
                        "stream_format", "invalid_value")
    speed = body_field(body, "speed", (int, float), None, within=SPEED_RANGE)
    instruct, ignored = voice_design(body)
    seed = body_field(body, "seed", int, None)
    checked("seed", validate_seed, seed)
    duration = body_field(body, "duration", (int, float), None)
    checked("duration", limits.validate_duration, duration)
    out = {
        "voice": body.get("voice"), "format": fmt, "stream_format": stream_format,
        "instruct": instruct, "instructions_ignored": ignored,
        "speed": None if speed is None or speed == 1 else float(speed),
        "language": body_field(body, "language", str, None), "seed": seed, "duration": duration,
        "normalize_text": body_field(body, "normalize_text", bool, False),
    }
    gen = {name: body_field(body, name, types) for name, types in GEN_FIELDS.items()}
    out["gen"] = {name: v for name, v in gen.items() if v is not None}  # absent: the defaults
    for name, v in out["gen"].items():  # each alone (the fast profile's knobs within it)
        fast = {"profile": "fast"} if name in FAST_PROFILE and name != "num_step" else {}
        checked(name, resolve_generation_config, None, {**fast, name: v})
    return out


def voice_design(body: dict) -> tuple[str | None, list[str]]:
    """The voice-design instruct of a speech body: (instruct or None, what was ignored).
    OpenAI's `instructions` is free prose: the voice-design items found in it are used, the
    rest is ignored and named (prose.instruct_from_prose), never a 400. omnicore's own
    `instruct` is read strictly: an unknown item is a 400 naming the closest one."""
    prose = body_field(body, "instructions", str, None)
    strict = body_field(body, "instruct", str, None)
    for param, value in (("instructions", prose), ("instruct", strict)):
        if value is not None and len(value) > limits.MAX_INSTRUCT_CHARS:  # before any reading
            raise HTTPError(400, f"{param} is {len(value):,} characters; the limit is "
                                 f"{limits.MAX_INSTRUCT_CHARS:,}: describe the voice in a few "
                                 "words", param, "instructions_too_long")
    if prose is not None and strict is not None:
        raise HTTPError(400, "give either instructions (free prose) or instruct (voice-design "
                             "items), not both", "instruct", "invalid_value")
    if strict is None:
        return prose_text.instruct_from_prose(prose)
    checked("instruct", frontend.resolve_instruct, strict, code="invalid_instruct")
    return strict.strip() or None, []


# The X-Omnicore-Instructions-Ignored header's most bytes: far inside any client's limit on a
# response head (httpcore's, under httpx and the OpenAI SDK, is 100 KiB for all of it).
MAX_IGNORED_HEADER_BYTES = 1024


def ignored_header(ignored: list[str]) -> dict:
    """The response header that names what a speech request's `instructions` left unused (a
    JSON list of the prose's fragments, ASCII-escaped as a header must be); none when nothing
    was. Over MAX_IGNORED_HEADER_BYTES, the fragments that fit, then "… N more"."""
    if not ignored:
        return {}
    kept, size = [], 2  # the brackets
    for fragment in ignored:
        size += len(json.dumps(fragment)) + 2  # ", " before the next one
        if size > MAX_IGNORED_HEADER_BYTES - 24:  # room for the count
            break
        kept.append(fragment)
    left = len(ignored) - len(kept)
    return {"X-Omnicore-Instructions-Ignored":
            json.dumps(kept + ([f"… {left:,} more"] if left else []))}


def synth_kwargs(req: dict, prompt) -> dict:
    """A parsed speech request (and its voice's prompt, if any) as the model's keyword
    arguments, the same for `synthesize` and `stream`."""
    kw = dict(language=req["language"], instruct=req["instruct"], speed=req["speed"],
              seed=req["seed"], duration=req["duration"], normalize_text=req["normalize_text"],
              **req["gen"])
    if prompt is not None:
        kw["voice_clone_prompt"] = prompt
    return kw


def profile_header(req: dict, model) -> dict:
    """The X-Omnicore-Profile header of a speech response: which profile made the audio, said
    "approximate" when it is fast or live, and the model's precision when it is not fp32
    ("live (approximate); precision int8 (approximate)")."""
    profile = req["gen"].get("profile", getattr(model, "profile", "exact"))
    return {"X-Omnicore-Profile": PROFILE_LABELS[profile] + precision_note(model)}


def timings_header(timings: dict) -> str:
    return ", ".join(f"{k}={v:.4f}" for k, v in timings.items())
