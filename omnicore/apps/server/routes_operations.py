"""The server's operations: GET /v1/models, /health, / (the index) and /metrics."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .protocol import PRECISION_LABELS, PROFILE_LABELS
from .routes import route
from .state import ServerState


@route("models")
async def models(request: Request):
    """GET /v1/models: the checkpoint's name, the model's family and OpenAI's speech model
    names (all one model)."""
    server: ServerState = request.app.state.server
    return JSONResponse({"object": "list", "data": [
        {"id": n, "object": "model", "created": 0, "owned_by": "omnicore"}
        for n in server.model_ids]})


@route("health", needs_auth=False, probe=True)
async def health(request: Request):
    """Open for probes: 200 and the load; 503 ("warming up") until the kernels are compiled at
    start-up, and ("draining") once shutdown began, so a load balancer sends requests elsewhere."""
    server: ServerState = request.app.state.server
    if server.draining or server.warming:
        status = "draining" if server.draining else "warming up"
        return JSONResponse({"status": status, **server.load()}, 503, {"Retry-After": "5"})
    return JSONResponse({"status": "ok", **server.load()})


@route("index", needs_auth=False, probe=True)
async def index(request: Request):
    """GET /: what this is and where its routes are (no secrets: open like /health)."""
    from ... import __version__

    server: ServerState = request.app.state.server
    links = {"speech": "/v1/audio/speech", "speech_stream_input": "/v1/audio/speech/stream-input",
             "voices": "/v1/voices", "audio_voices": "/v1/audio/voices",
             "voice_consents": "/v1/audio/voice_consents", "models": "/v1/models", "health": "/health",
             "metrics": "/metrics"}
    if server.ui_path:
        links["ui"] = server.ui_path
    return JSONResponse({"object": "api", "name": "omnicore", "version": __version__,
                         "description": "OpenAI-compatible text-to-speech (OmniVoice)",
                         "model": server.model_name, "links": links,
                         "profiles": PROFILE_LABELS,
                         "default_profile": getattr(server.model, "profile", "exact"),
                         "precisions": PRECISION_LABELS,
                         "precision": getattr(server.model, "precision", "fp32")})


@route("metrics", needs_auth=lambda server: not server.metrics_public, probe=True)
async def metrics(request: Request):
    """Prometheus text; the gauges of the queue and the engine's passes are sampled now."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    server: ServerState = request.app.state.server
    ld = server.load()
    server.m_queue.set(ld["queued"])
    server.m_passes.labels("active").set(ld["engine"]["active_passes"])
    server.m_passes.labels("waiting").set(ld["engine"]["waiting_passes"])
    server.m_prompts.labels("lookups").set(sum(server.voices.lookups.values()))
    server.m_prompts.labels("loads").set(sum(server.voices.loads.values()))
    text = generate_latest(server.registry)
    if server.metrics_extra is not None:
        text += (await server.in_thread(server.metrics_extra)).encode("utf-8")
    return Response(text, media_type=CONTENT_TYPE_LATEST)

