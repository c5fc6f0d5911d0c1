"""`omnicore serve`: an OpenAI-compatible speech server (Starlette + uvicorn, the `server` extra).

One process, one model, one engine: every request's synthesis runs in a worker thread and the
model's engine packs the passes of all concurrent requests into shared forwards, so requests are
batched continuously instead of serialised.

    POST /v1/audio/speech      OpenAI's fields (+ language, num_step, guidance_scale, seed,
                               duration, normalize_text and every GenerationConfig field,
                               `profile` among them: "fast" is approximate)
    WS /v1/audio/speech/stream-input   text in fragments as an LLM writes it, audio as made
    GET/POST /v1/voices        the voice library (clone from a clip, or a designed voice kept)
    GET/DELETE /v1/voices/{id}
    POST /v1/audio/voices, DELETE /v1/audio/voices/{id}
                               OpenAI's voice resources, on the same library
    /v1/audio/voice_consents   OpenAI's consent recordings (create, list, get, rename, delete)
    GET /, /v1/models, /health, /metrics
                               (/health and speech say "warming up", 503, until the kernels
                               are compiled and the preset alloy and the aliases' presets are
                               made: ServerState.warm_up, run once the port is open)
    /ui                        the Gradio demo on the same model (--ui)

Voices are omnicore voice prompts (.npz, written atomically) in the voices folder, which several
servers may share (library.py). The OpenAI preset names map to designed voices (PRESET_VOICES:
instruct + seed); each is generated once, and its codes are kept as the voice, so every later
call speaks with that speaker: `alloy` and the presets aliases name before the server is ready,
the others on first use.

One module per job:

    app.py           the routing table (create_app) and the demo at /ui
    routes.py        what every route shares: the key, OpenAI-shaped errors, forms, request ids
    routes_speech.py POST /v1/audio/speech: a whole file, or a stream (raw or SSE)
    routes_voices.py the voice library's two APIs (/v1/voices, /v1/audio/voices)
    routes_consents.py  /v1/audio/voice_consents
    routes_operations.py  /, /v1/models, /health, /metrics
    stream_input.py  the WebSocket for voice agents: text in fragments, audio as it is made
    speaking.py      the one speaking path of every door (HTTP, WebSocket, Wyoming, MCP): the
                     text's checks, its voice, synthesis or streaming, an Utterance's fragments
    voice_making.py  a voice made for the library (clip or description, consent), every door's
    state.py         ServerState: model, worker threads, admission (`async with
                     server.slot()`), shutdown's drain and stop, metrics
    runtime.py       uvicorn with the connections' clocks (send, idle) and graceful shutdown
    protocol.py      OpenAI-shaped errors, request limits, the speech body's fields
    uploads.py       uploaded clips, bounded by their header before decoding
    library.py       the voice library on disk: voices, their records, consents; locked changes
    voices.py        the preset voices, names and labels, a voice as each API shows it, a
                     request's voice -> a prompt
    formats.py       audio encoders: whole files, and the pieces a stream sends

Only formats.py, library.py and voices.py are imported here: the package imports without the
extra.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from .formats import encode_audio
from .library import VoiceLibrary
from .voices import PRESET_VOICES

__all__ = ["PRESET_VOICES", "VoiceLibrary", "encode_audio", "serve"]


def serve(model_path: str, host: str = "127.0.0.1", port: int = 8000, voices_dir=None,
          api_key: str | None = None, max_queue: int = 16, log_level: str = "warning",
          max_concurrency: int | None = None, ui: bool = False, send_timeout: float = 30.0,
          idle_timeout: float = 30.0, grace: float = 30.0, metrics_public: bool = False,
          require_consent: bool | None = None, precision: str = "fp32",
          voice_aliases: dict | None = None, profile: str = "exact",
          body_timeout: float | None = None) -> None:
    """Load the model once and serve until a signal, then drain (see runtime.py); with `ui`,
    the demo at /ui too. `precision` and `profile` (the generation profile of requests that
    name none): OmniVoice.from_pretrained's; `voice_aliases`: name -> library voice
    (voices.resolve_voice); `voices_dir` None: library.default_folder(); `require_consent`
    True or False sets or lifts the folder's policy, None keeps it (library.py);
    `body_timeout`: a request body's overall deadline (None: runtime.BODY_TIMEOUT_S)."""
    import importlib.util

    if importlib.util.find_spec("uvicorn") is None:  # the extra, checked before the model loads
        raise ConfigError("the server needs its extra: pip install 'omnicore[server]'")
    from . import runtime
    from .app import create_app, demo_module, mount_ui
    from .voices import DOOR_VOICE, check_aliases

    check_aliases(voices_dir, voice_aliases)  # a missing voice is refused before the model loads

    demo = demo_module() if ui else None
    server = server_state(model_path, precision, voices_dir=voices_dir, api_key=api_key,
                          max_queue=max_queue, max_concurrency=max_concurrency,
                          metrics_public=metrics_public, idle_timeout=idle_timeout,
                          require_consent=require_consent, voice_aliases=voice_aliases,
                          profile=profile, default_voice=DOOR_VOICE)
    app = create_app(server)
    if demo is not None:
        mount_ui(app, server, demo, str(model_path))

    def started():
        log_startup(server, model_path, host, port)
        server.warm_up_in_background()
    runtime.run(app, server, host, port, log_level, send_timeout, idle_timeout, grace,
                on_started=started, body_timeout=body_timeout or runtime.BODY_TIMEOUT_S)


def server_state(model_path: str, precision: str = "fp32", profile: str = "exact", **state_args):
    """The model, loaded once, in the state every front door shares (`omnicore serve`,
    `wyoming`, `mcp`): its engine, the voice library, admission and the limits. `profile`: the
    generation profile of requests that name none. Without `voices_dir`, the voices are kept
    in the user's data folder (library.default_folder), so they outlive the process."""
    from ... import OmniVoice
    from .library import default_folder
    from .state import ServerState

    if state_args.get("voices_dir") is None:
        state_args["voices_dir"] = default_folder()

    model = OmniVoice.from_pretrained(model_path, precision=precision, profile=profile)
    return ServerState(model, model_name=Path(str(model_path)).name, **state_args)


def log_startup(server, model_path, host: str, port: int) -> None:
    """What an operator checks first: which model, where voices live, whether a key is
    needed, where the demo and the agents' socket are."""
    import logging

    log = logging.getLogger("uvicorn.error")
    base = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    log_model(log, server, model_path)
    log.info("Auth: %s", "API key required (Authorization: Bearer KEY)" if server.api_key
             else "off: anyone who reaches this port can use it (set --api-key)")
    log.info("Metrics: http://%s/metrics, %s", base,
             "open (no --api-key)" if not server.api_key else "open (--metrics-public)"
             if server.metrics_public else "behind the API key (--metrics-public opens it)")
    log.info("Demo: %s", f"http://{base}{server.ui_path}" if server.ui_path else "off (--ui)")
    log.info("Voice agents: ws://%s/v1/audio/speech/stream-input", base)


def precision_line(precision: str) -> str:
    """The start-up line's precision, labelled, and what the CPU's int8 units offer: where the
    int8 kernels have dot-product instructions to run on, fp32 servers say that --precision
    int8 exists; where they have none, an int8 server says it runs the plain loops."""
    from ...model.int8_kernels import path
    from .protocol import PRECISION_LABELS

    label = PRECISION_LABELS[precision]
    units = path() != "plain"
    if precision == "fp32":
        return label + (" (this CPU has int8 dot-product units: --precision int8 runs the "
                        "layers' products on them, approximate; docs/configuration.md)"
                        if units else "")
    note = " (the model's products are not the float32 ones; --precision fp32 runs them)"
    if precision == "int8" and not units:
        note += "; no int8 dot-product units here: the int8 products run as plain loops, slowly"
    return label + note


def log_model(log, server, model_path) -> None:
    """The start-up lines every front door shares: which model, where voices live."""
    from ... import __version__
    from .protocol import PROFILE_LABELS

    voices = server.voices
    log.info("omnicore %s: model %s (%s)", __version__, server.model_name, model_path)
    profile = getattr(server.model, "profile", "exact")
    log.info("Profile: %s for requests that name none%s", PROFILE_LABELS[profile],
             "" if profile == "exact" else " (early first audio on a CPU; --profile exact "
                                           "for the reference's algorithm)")
    log.info("Precision: %s", precision_line(getattr(server.model, "precision", "fp32")))
    if not voices.persistent:
        log.info("Voices: not kept (a private temporary folder): voices made now are gone "
                 "after a restart")
    else:
        log.info("Voices: %d in %s%s; cloned voices %s", len(voices.names()), voices.folder,
                 f" ({voices.removed_temporaries} stale temporary files removed)"
                 if voices.removed_temporaries else "",
                 "need a consent (this folder requires it: --no-require-consent lifts it)"
                 if voices.require_consent else "need no consent (--require-consent sets it)")
    if server.voice_aliases:
        log.info("Voice aliases: %s", ", ".join(f"{a} -> {v}"
                                                for a, v in server.voice_aliases.items()))


def log_to_stderr(log, quiet: bool = False) -> None:
    """A front door's own lines (start-up, drain) on stderr at INFO (WARNING with --quiet):
    the command line keeps only the warnings of the `omnicore` logger, which `log` is under,
    so it gets a handler of its own (and stops there: a warning is shown once)."""
    import logging
    import sys

    if not log.handlers:  # once, however many times a door starts in one process
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False
