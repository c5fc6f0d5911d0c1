"""The voice library over HTTP: omnicore's /v1/voices and OpenAI's /v1/audio/voices.

One library (library.py) behind two APIs: omnicore's /v1/voices, where a voice's name is its
id, and OpenAI's /v1/audio/voices, which gives each voice a new id and keeps its name as a
label; a voice made through either is spoken with through either id. The folder is read in
worker threads: a slow or hostile file never holds the event loop. A voice is made as every
door makes one (voice_making.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from .library import VoiceLibrary
from .protocol import HTTPError, body_field, check_fields, read_object
from .routes import is_form, read_form, route
from .state import ServerState, client_gone
from .voice_making import check_consent, clip_voice_work, designed_voice_work, make_voice
from .voices import (check_label, describe_voice, list_voices, new_voice_id, new_voice_name,
                     nothing_to_delete, openai_voice, voice_not_found)


# The fields of a designed voice on /v1/voices (JSON), and of a cloned one (multipart).
VOICE_FIELDS = ("name", "instruct", "text", "seed", "language", "num_step")
CLONE_FIELDS = ("name", "ref_text", "consent")
# What OpenAI's voice creation sends (its form or JSON), and the extras taken here.
AUDIO_VOICE_FIELDS = ("name", "type", "consent", "prompt", "script_hint", "model",
                      "ref_text", "seed", "language", "num_step")


@route("voices")
async def voices_list(request: Request):
    """GET /v1/voices: the library's voices, then the presets not made yet, all one shape."""
    server: ServerState = request.app.state.server
    return JSONResponse({"object": "list", "data": await server.in_thread(list_voices,
                                                                          server.voices)})


@route("voices")
async def voices_create(request: Request):
    """POST /v1/voices: a clone of an uploaded clip (multipart name + audio + ref_text, and
    consent: a consent's id) or a designed voice (JSON name + instruct), made in an admitted
    slot like a speech request."""
    server: ServerState = request.app.state.server
    consent = None
    if is_form(request):
        body, data = await read_form(request, "audio", CLONE_FIELDS)
        name = await server.in_thread(new_voice_name, server.voices, body.get("name"))
        if data is None:
            raise HTTPError(400, "multipart field 'audio' (a file) is required", "audio",
                            "missing_file")
        work = clip_voice_work(server, data, body.get("ref_text"), "audio")
        consent = await check_consent(server, body.get("consent"))
        record = {"type": "audio_sample"}
    else:
        body = await read_object(request)
        check_fields(body, VOICE_FIELDS)
        name = await server.in_thread(new_voice_name, server.voices, body.get("name"))
        instruct, work = designed_voice_work(server, body, "instruct", "text")
        record = {"type": "prompt", "prompt": instruct}
    prompt, record = await make_voice(server, admitted(request, server), name, work, record,
                                      consent)
    return JSONResponse(describe_voice(name, prompt, record), 201, pace_warning(prompt))


def pace_warning(prompt) -> dict:
    """A header that says when a cloned voice's transcript cannot be what its clip says (the
    voice is kept: the caller decides)."""
    problem = prompt.pace_problem()
    return {"X-Omnicore-Warning": problem} if problem else {}


def admitted(request: Request, server: ServerState):
    """A voice's work(on_step) in an admitted slot, like a speech request (a client that
    leaves cancels it)."""
    async def run(work):
        async with client_gone(request) as gone, server.slot(gone) as slot:
            return await slot.run(work, slot.on_step)
    return run


@route("voice")
async def voice_get(request: Request):
    server: ServerState = request.app.state.server
    name = VoiceLibrary.check_name(request.path_params["name"])

    def find():
        prompt = server.voices.get(name)
        return None if prompt is None else describe_voice(name, prompt, server.voices.record(name))
    found = await server.in_thread(find)
    if found is None:
        raise voice_not_found(name, "name")
    return JSONResponse(found)


@route("voice")
async def voice_delete(request: Request):
    server: ServerState = request.app.state.server
    name = VoiceLibrary.check_name(request.path_params["name"])
    if not await server.in_thread(server.voices.delete, name):
        raise nothing_to_delete(name)
    return JSONResponse({"id": name, "object": "voice", "deleted": True})


# -- OpenAI's voice resources -------------------------------------------------------------------

@route("audio_voices")
async def audio_voices_create(request: Request):
    """POST /v1/audio/voices, as form or JSON: `type` "audio_sample" (the default; `name`,
    the `audio_sample` file, `consent`: a consent's id, and `ref_text`, the clip's transcript,
    as an extra field) or "prompt" (`name` and `prompt`, a voice description checked as an
    instruct; `script_hint`: the sample it speaks). The voice gets a new id, its `name` is its
    label."""
    server: ServerState = request.app.state.server
    data = None
    if is_form(request):
        body, data = await read_form(request, "audio_sample", AUDIO_VOICE_FIELDS)
        for key in ("seed", "num_step"):  # numbers arrive as text in a form
            if isinstance(body[key], str) and body[key].strip().isdigit():
                body[key] = int(body[key])
    else:
        body = await read_object(request)
        check_fields(body, AUDIO_VOICE_FIELDS)
    label = check_label(body.get("name"), "name")
    kind = body_field(body, "type", str, "audio_sample")
    consent = None
    if kind == "prompt":
        instruct, work = designed_voice_work(server, body, "prompt", "script_hint")
        record = {"name": label, "type": "prompt", "prompt": instruct}
    elif kind == "audio_sample":
        if data is None:
            raise HTTPError(400, "an audio_sample voice needs the file 'audio_sample' (multipart)",
                            "audio_sample", "missing_file")
        work = clip_voice_work(server, data, body.get("ref_text"), "audio_sample")
        consent = await check_consent(server, body.get("consent"))
        record = {"name": label, "type": "audio_sample"}
    else:
        raise HTTPError(400, f"type must be 'audio_sample' or 'prompt', got {kind!r}", "type",
                        "invalid_value")
    name = new_voice_id()
    prompt, record = await make_voice(server, admitted(request, server), name, work, record,
                                      consent)
    return JSONResponse(openai_voice(name, record), headers=pace_warning(prompt))


@route("audio_voices")
async def audio_voice_delete(request: Request):
    server: ServerState = request.app.state.server
    name = VoiceLibrary.check_name(request.path_params["voice_id"], "voice_id")
    if not await server.in_thread(server.voices.delete, name):
        raise nothing_to_delete(name, "voice_id")
    return JSONResponse({"id": name, "object": "audio.voice.deleted", "deleted": True})

