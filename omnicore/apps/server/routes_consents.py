"""OpenAI's consent recordings, /v1/audio/voice_consents: create, list, get, rename, delete,
kept in the voice library (library.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from ...errors import OmniCoreError
from .protocol import HTTPError, blame, check_fields, read_object
from .routes import is_form, read_form, route
from .state import ServerState
from .uploads import check_recording
from .voices import check_label, check_language_tag

CONSENT_FIELDS = ("name", "language")


@route("voice_consents")
async def consents_create(request: Request):
    """POST /v1/audio/voice_consents (multipart `name`, `language`, `recording`): the
    recording is kept as uploaded, once it decodes within a clip's limits (uploads.py)."""
    server: ServerState = request.app.state.server
    if not is_form(request):
        raise HTTPError(400, "send the consent as multipart form data: name, language and the "
                             "file recording", "recording", "invalid_request")
    body, data = await read_form(request, "recording", CONSENT_FIELDS)
    label = check_label(body.get("name"), "name")
    language = check_language_tag(body.get("language"))
    if data is None:
        raise HTTPError(400, "the file 'recording' is required", "recording", "missing_file")
    with blame({OmniCoreError: "recording"}):
        ext = await server.in_thread(check_recording, data)
    return JSONResponse(await server.in_thread(server.voices.add_consent, label, language,
                                               data, ext))


@route("voice_consents", query=("limit", "after"))
async def consents_list(request: Request):
    """GET /v1/audio/voice_consents: oldest first, `limit` (1-100, default 20) after the id
    `after` (OpenAI's cursor page)."""
    server: ServerState = request.app.state.server
    query = request.query_params
    limit = query.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise HTTPError(400, f"limit must lie in [1, 100], got {limit!r}", "limit",
                        "invalid_value")
    limit = int(limit)
    items = await server.in_thread(server.voices.consents)
    after = query.get("after")
    if after is not None:
        ids = [c["id"] for c in items]
        if after not in ids:
            raise HTTPError(400, f"unknown cursor {after!r}", "after", "invalid_value")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page,
                         "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None,
                         "has_more": len(items) > limit})


def consent_not_found(cid) -> HTTPError:
    return HTTPError(404, f"unknown consent {cid!r}", "consent_id", "consent_not_found")


async def consent_answer(server: ServerState, cid: str, fn, *args) -> JSONResponse:
    """fn(cid, *args), the library's answer about one consent, as the response (404 if none)."""
    rec = await server.in_thread(fn, cid, *args)
    if rec is None:
        raise consent_not_found(cid)
    return JSONResponse(rec)


@route("voice_consents")
async def consent_get(request: Request):
    server: ServerState = request.app.state.server
    return await consent_answer(server, request.path_params["consent_id"],
                                server.voices.consent)


@route("voice_consents")
async def consent_update(request: Request):
    """POST /v1/audio/voice_consents/{id} with JSON {"name": ...}: a new label."""
    server: ServerState = request.app.state.server
    cid = request.path_params["consent_id"]
    body = await read_object(request)
    check_fields(body, ("name",))
    label = check_label(body.get("name"), "name")
    return await consent_answer(server, cid, server.voices.rename_consent, label)


@route("voice_consents")
async def consent_delete(request: Request):
    """DELETE /v1/audio/voice_consents/{id}; the voices it authorised keep their copy."""
    server: ServerState = request.app.state.server
    cid = request.path_params["consent_id"]
    if not await server.in_thread(server.voices.delete_consent, cid):
        raise consent_not_found(cid)
    return JSONResponse({"id": cid, "object": "audio.voice_consent", "deleted": True})

