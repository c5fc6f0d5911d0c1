"""`omnicore serve`'s routing table (create_app) over one ServerState
(`request.app.state.server`), and the demo at /ui. The handlers live by resource:
routes_speech.py, routes_voices.py, routes_consents.py, routes_operations.py, and the
WebSocket in stream_input.py; what every route shares in routes.py.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route, WebSocketRoute

from ...errors import ConfigError
from .routes import RequestId, not_found
from .routes_consents import (consent_delete, consent_get, consent_update, consents_create,
                              consents_list)
from .routes_operations import health, index, metrics, models
from .routes_speech import speech
from .routes_voices import (audio_voice_delete, audio_voices_create, voice_delete, voice_get,
                            voices_create, voices_list)
from .state import ServerState
from .stream_input import stream_input


def create_app(server: ServerState) -> Starlette:
    """The routing table over one ServerState."""
    routes = [
        Route("/", index, methods=["GET"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        WebSocketRoute("/v1/audio/speech/stream-input", stream_input),
        Route("/v1/voices", voices_list, methods=["GET"]),
        Route("/v1/voices", voices_create, methods=["POST"]),
        Route("/v1/voices/{name}", voice_get, methods=["GET"]),
        Route("/v1/voices/{name}", voice_delete, methods=["DELETE"]),
        Route("/v1/audio/voices", audio_voices_create, methods=["POST"]),
        Route("/v1/audio/voices/{voice_id}", audio_voice_delete, methods=["DELETE"]),
        Route("/v1/audio/voice_consents", consents_create, methods=["POST"]),
        Route("/v1/audio/voice_consents", consents_list, methods=["GET"]),
        Route("/v1/audio/voice_consents/{consent_id}", consent_get, methods=["GET"]),
        Route("/v1/audio/voice_consents/{consent_id}", consent_update, methods=["POST"]),
        Route("/v1/audio/voice_consents/{consent_id}", consent_delete, methods=["DELETE"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found},
                    middleware=[Middleware(RequestId)])
    app.state.server = server
    return app


# -- the demo at /ui ------------------------------------------------------------------------------

def demo_module():
    """The Gradio demo (demo/app.py of the source checkout, beside the package), imported for
    `--ui`; a ConfigError, before any model loads, when it or gradio is missing."""
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "demo" / "app.py"
    if not path.is_file():
        raise ConfigError(f"--ui serves the demo of a source checkout ({path} is missing): "
                          "install from the repository with pip install -e '.[server,demo]'")
    if importlib.util.find_spec("gradio") is None:
        raise ConfigError("--ui needs the demo extra: pip install -e '.[server,demo]'")
    spec = importlib.util.spec_from_file_location("omnicore_demo_app", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mount_ui(app, server: ServerState, demo, model_name: str) -> None:
    """The demo's Blocks on the server's own model (one model, one engine: its jobs are packed
    with the API's requests) at /ui. With an API key the page asks for it as the password."""
    import gradio as gr

    def auth(user: str, password: str) -> bool:
        return server.authorized(f"Bearer {password}")
    blocks = demo.build_demo(server.model, model_name, max_queue=server.max_queue)
    server.ui_path = "/ui"
    gr.mount_gradio_app(app, blocks, path="/ui",
                        auth=auth if server.api_key is not None else None,
                        auth_message="Any user name; the password is the server's API key.",
                        footer_links=["api", "gradio"], **demo.launch_options())
