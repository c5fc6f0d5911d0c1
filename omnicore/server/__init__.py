"""`omnicore serve`: an OpenAI-compatible speech server (Starlette + uvicorn, the `server` extra).

One process, one model, one engine: every request's synthesis runs in a worker thread and the
model's engine packs the passes of all concurrent requests into shared forwards, so requests are
batched continuously instead of serialised.

    POST /v1/audio/speech      OpenAI's fields (+ language, num_step, guidance_scale, seed,
                               duration, normalize_text and every GenerationConfig field)
    GET/POST /v1/voices        the voice library (clone from a clip, or a designed voice kept)
    GET/DELETE /v1/voices/{id}
    POST /v1/audio/voices, DELETE /v1/audio/voices/{id}
                               OpenAI's voice resources, on the same library
    /v1/audio/voice_consents   OpenAI's consent recordings (create, list, get, rename, delete)
    GET /v1/models, /health, /metrics
    /ui                        the Gradio demo on the same model (--ui)

Voices are omnicore voice prompts (.npz, written atomically) in the voices folder, which several
servers may share (library.py). The OpenAI preset names map to designed voices (PRESET_VOICES:
instruct + seed); each is generated once on first use, and its codes are kept as the voice, so
every later call speaks with that speaker.

One module per job:

    app.py       the handlers, the routing table (create_app) and the demo at /ui
    state.py     ServerState: model, worker threads, admission (`async with server.slot()`), metrics
    protocol.py  OpenAI-shaped errors, request limits, the speech body's fields
    library.py   the voice library on disk: voices, their records, consents; locked changes
    voices.py    the preset voices, names and labels, a voice as each API shows it, a
                 request's voice -> a prompt
    formats.py   audio encoders: whole files, and the pieces a stream sends

Only formats.py, library.py and voices.py are imported here: the package imports without the
extra.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .formats import encode_audio
from .library import VoiceLibrary
from .voices import PRESET_VOICES

__all__ = ["PRESET_VOICES", "VoiceLibrary", "encode_audio", "serve"]


def serve(model_path: str, host: str = "127.0.0.1", port: int = 8000, voices_dir=None,
          api_key: str | None = None, max_queue: int = 16, log_level: str = "warning",
          max_concurrency: int | None = None, ui: bool = False,
          require_consent: bool = False) -> None:
    """Load the model once and serve until interrupted (with `ui`, the demo at /ui too)."""
    try:
        import uvicorn
    except ImportError:
        raise ConfigError("the server needs its extra: pip install 'omnicore[server]'") from None
    from .. import OmniVoice
    from .app import create_app, demo_module, mount_ui
    from .state import ServerState

    demo = demo_module() if ui else None
    model = OmniVoice.from_pretrained(model_path)
    name = Path(str(model_path)).name
    server = ServerState(model, voices_dir, api_key, max_queue, model_name=name,
                         max_concurrency=max_concurrency, require_consent=require_consent)
    app = create_app(server)
    if demo is not None:
        mount_ui(app, server, demo, str(model_path))
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
