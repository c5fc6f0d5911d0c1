"""The client side of `omnicore serve`'s WebSocket for voice agents, shared by the framework
adapters: the URL, the messages a client sends and what the server's messages mean.

    client -> server   settings(voice=..., ...)   first: the speech fields (pcm audio)
                       text(t)                     a fragment, as the LLM writes it
                       FLUSH / CANCEL / CLOSE      end the utterance / barge in / end of input
    server -> client   bytes                       16-bit mono pcm at SAMPLE_RATE, as made
                       Done                        an utterance ended (cancelled or not)
                       SpeechSocketError           the server's error event (OpenAI's shape)

Dimensions: audio is 16-bit little-endian mono samples at SAMPLE_RATE.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

SAMPLE_RATE = 24000
ROUTE = "/v1/audio/speech/stream-input"
FLUSH = json.dumps({"flush": True})
CANCEL = json.dumps({"cancel": True})
CLOSE = json.dumps({"close": True})
KEEPALIVE = json.dumps({"text": ""})  # a message that says nothing: the server's idle clock restarts


class SpeechSocketError(Exception):
    """An error event from the server: `error` is OpenAI's error object (message, type,
    param, code), `utterance` the utterance it ended (None: the session's)."""

    def __init__(self, error: dict, utterance: int | None = None):
        super().__init__(error.get("message", "error"))
        self.error, self.utterance = error, utterance
        self.code = error.get("code")


@dataclass(frozen=True)
class Done:
    """An utterance's end: its index, whether it was cancelled, its audio's length."""

    utterance: int
    cancelled: bool
    audio_seconds: float


def socket_url(base_url: str) -> str:
    """`http://host:8000` or `http://host:8000/v1` (the OpenAI client's base_url) -> the
    socket's `ws://host:8000/v1/audio/speech/stream-input` (https -> wss)."""
    parts = urlsplit(base_url if "://" in base_url else "http://" + base_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    path = path[:-len("/v1")] if path.endswith("/v1") else path
    return urlunsplit((scheme, parts.netloc, path + ROUTE, "", ""))


def auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def settings(voice: str | None = None, language: str | None = None,
             instructions: str | None = None, speed: float | None = None, **fields) -> str:
    """The first message: the speech fields of POST /v1/audio/speech (without the text), the
    audio as 16-bit pcm. `fields`: any other field the server takes (seed, num_step, ...)."""
    body = {"voice": voice, "language": language, "instructions": instructions, "speed": speed,
            **fields, "response_format": "pcm"}
    return json.dumps({k: v for k, v in body.items() if v is not None})


def text(fragment: str) -> str:
    return json.dumps({"text": fragment})


def read(message: str | bytes) -> bytes | Done:
    """A server message -> audio bytes or an utterance's Done; an error event raises
    SpeechSocketError (events this client does not know are read as no audio)."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        return bytes(message)
    event = json.loads(message)
    if event.get("type") == "error":
        raise SpeechSocketError(event.get("error") or {}, event.get("utterance"))
    if event.get("type") == "audio.done":
        return Done(event["utterance"], bool(event.get("cancelled")),
                    float(event.get("audio_seconds") or 0.0))
    return b""
