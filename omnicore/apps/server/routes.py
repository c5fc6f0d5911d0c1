"""What every HTTP route shares: the `route` decorator (the API key, a 503 while the server
drains, OpenAI-shaped errors, the request counter), forms, the 404/405 answer and the
X-Request-Id middleware. The routes themselves are by resource: routes_speech.py,
routes_voices.py, routes_consents.py, routes_operations.py; app.py is the routing table.
"""

from __future__ import annotations

import functools
import re
import secrets

from starlette.requests import Request
from starlette.responses import JSONResponse

from .protocol import (MAX_UPLOAD_BYTES, HTTPError, as_http, check_fields, error_body, forget,
                       shutting_down)
from .state import ServerState


def error_response(e: HTTPError) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, e.param, e.code), e.status, e.headers)


def route(name: str, needs_auth=True, probe: bool = False, query: tuple = ()):
    """A handler with what every route shares: the API key (when `needs_auth`, or when
    `needs_auth(server)` says so), a 503 while the server drains unless it is a `probe` (/,
    /health, /metrics answer to the end), no query parameter but those in `query`, every
    failure as an OpenAI-shaped JSON error (never a traceback, and nothing it held kept alive),
    the request counted by route and status."""
    def wrap(fn):
        @functools.wraps(fn)
        async def handler(request: Request):
            server: ServerState = request.app.state.server
            try:
                auth = needs_auth(server) if callable(needs_auth) else needs_auth
                if auth:
                    check_key(server, request.headers.get("authorization"))
                if server.draining and not probe:
                    raise shutting_down()
                check_fields(request.query_params, query, "the query")
                resp = await fn(request)
            except Exception as exc:  # noqa: BLE001 - every failure becomes JSON
                resp = error_response(as_http(exc))
                forget(exc)
            server.m_requests.labels(name, str(resp.status_code)).inc()
            return resp
        return handler
    return wrap


def check_key(server: ServerState, header: str | None) -> None:
    if not server.authorized(header):
        raise HTTPError(401, "missing or wrong API key (Authorization: Bearer KEY)", None,
                        "invalid_api_key", {"WWW-Authenticate": "Bearer"})


def is_form(request: Request) -> bool:
    kind = request.headers.get("content-type", "")
    return kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded"))


async def read_form(request: Request, file_field: str, fields) -> tuple[dict, bytes | None]:
    """A form body -> ({field: text or None} for `fields`, the bytes of the file `file_field`
    or None); 413 past MAX_UPLOAD_BYTES (or of unknown length); a field of another name is
    refused (check_fields)."""
    size = request.headers.get("content-length")
    if size is None or not size.isdigit() or int(size) > MAX_UPLOAD_BYTES:
        raise HTTPError(413, f"upload over {MAX_UPLOAD_BYTES:,} bytes (or of unknown "
                             "length)", file_field, "upload_too_large")
    async with request.form(max_files=1, max_fields=16) as form:
        check_fields(form, (*fields, file_field), "the form")
        body = {}
        for key in fields:
            value = form.get(key)
            if value is not None and not isinstance(value, str):
                raise HTTPError(400, f"form field {key!r} must be text, not a file", key,
                                "invalid_type")
            body[key] = value
        upload = form.get(file_field)
        if isinstance(upload, str):
            raise HTTPError(400, f"form field {file_field!r} must be a file", file_field,
                            "invalid_type")
        data = None if upload is None else await upload.read()
    return body, data


async def not_found(request: Request, exc):
    status = getattr(exc, "status_code", 404)
    if status == 404:
        e = HTTPError(404, f"{request.method} {request.url.path}: not found", None, "not_found")
    else:
        e = HTTPError(405, f"{request.method} is not allowed on {request.url.path}", None,
                      "method_not_allowed")
    return error_response(e)


# A client's own X-Request-Id is kept when it is a plain token (it ties its logs to ours).
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestId:
    """ASGI middleware: every response, and every WebSocket's handshake, carries
    `x-request-id`, as OpenAI's API's do (clients log it, and LiveKit warns on each utterance
    when it is missing): the client's own when it sent a plain one, else a new `req_<hex>`."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", ())).get(b"x-request-id", b"").decode("latin-1")
        rid = given if REQUEST_ID.fullmatch(given) else "req_" + secrets.token_hex(16)
        header = (b"x-request-id", rid.encode("ascii"))

        async def send_with_id(message):
            if message["type"] in ("http.response.start", "websocket.accept",
                                   "websocket.http.response.start"):
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)
        await self.app(scope, receive, send_with_id)

