"""`omnicore mcp`: an MCP server, so that LLM agents speak through tools (the `mcp` extra: the
official SDK's MCPServer), over stdio, or streamable HTTP with `--http`.

    speak(text, voice, language, instruct, speed, seed, response_format, path)
                      the audio as MCP audio content (and, given `path`, the same bytes
                      written into --output-dir), with a line saying what was made
    list_voices()     the presets and the voice library, as GET /v1/voices lists them
    design_voice(name, instruct, seed, language, text)   a designed voice, kept
    clone_voice(name, audio_base64, ref_text, consent)   a cloned clip, kept
    list_languages(search)                               the model's languages

One path per job, `omnicore serve`'s: each tool call is admitted like a request
(`ServerState.slot`: --max-queue, --max-concurrency), its voice resolved by the server's
resolver, its audio made by `model.synthesize` (the whole utterance, post-processed as the
reference does: the same audio as POST /v1/audio/speech with flac) and encoded by the
server's encoders; voices are made by the HTTP routes' own checks and kept in the one voice
library. Errors are tool errors (`isError`) carrying omnicore's message. A cancelled call
stops its passes at the next step.

Nothing is written outside --output-dir, whatever the arguments: `path` is a file name (no
folder, no `..`, no absolute path, no NUL, at most 128 characters) with the format's
extension, and a symbolic link there is refused, never followed (audio/writers.py).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import sys
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import AudioContent, TextContent, ToolAnnotations
from pydantic import Field

from ..audio import writers
from ..errors import InputError, OmniCoreError
from ..model.config import SAMPLE_RATE
from ..text import frontend, limits
from .app import check_consent, clip_voice_work, designed_voice_work
from .formats import FORMATS, encode_audio
from .protocol import MAX_UPLOAD_BYTES, HTTPError, as_http, check_input_length, has_words
from .state import ServerState
from .voices import describe_voice, list_voices, new_voice_name

log = logging.getLogger("omnicore.mcp")
AUDIO_FORMATS = ("wav", "mp3", "flac", "opus", "aac")  # self-describing files (not raw pcm)
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
EXTENSIONS = {"wav": ".wav", "mp3": ".mp3", "flac": ".flac", "opus": ".ogg", "aac": ".aac"}
MAX_AUDIO_BASE64 = (MAX_UPLOAD_BYTES + 2) // 3 * 4  # base64 of the largest clip the server takes

INSTRUCTIONS = """omnicore speaks text with OmniVoice (600+ languages, voice cloning and voice
design). speak() returns the audio; name a voice from list_voices() to keep one speaker, or
give `instruct` (voice-design items: gender, age, pitch, style, accent) for a new one."""


class ToolFailure(ToolError):
    """A tool call refused or failed: omnicore's own message, as the client reads it."""


def failure(exc: BaseException) -> ToolFailure:
    return ToolFailure(exc.message if isinstance(exc, HTTPError) else as_http(exc).message)


class McpDoor:
    """The tools over one ServerState, and where `speak` may write."""

    def __init__(self, server: ServerState, output_dir: str | None, synth: dict):
        self.server, self.synth = server, synth
        self.output_dir = None
        if output_dir is not None:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            self.output_dir = Path(output_dir).resolve()

    async def admitted(self, work, *args):
        """work(*args, on_step) in a worker thread, admitted like a request; a cancelled call
        (or a stopping server) stops its passes at the next step."""
        gone = asyncio.get_running_loop().create_future()  # an MCP call is cancelled, not left
        async with self.server.slot(gone) as slot:
            return await slot.run(work, *args, slot.on_step)

    def output_path(self, path: str, fmt: str) -> Path:
        """The file `path` names inside the output folder (see the module's docstring)."""
        if self.output_dir is None:
            raise ToolFailure("this server was started without --output-dir: it writes no files "
                              "(the audio is in the result)")
        if not isinstance(path, str) or not FILE_NAME.fullmatch(path):
            raise ToolFailure("path must be a plain file name (letters, digits, '.', '_' or '-', "
                              "starting with a letter or digit, at most 128 characters); it is "
                              "written into the server's output folder, nowhere else")
        if not path.lower().endswith(EXTENSIONS[fmt]):
            raise ToolFailure(f"path must end with {EXTENSIONS[fmt]} for response_format {fmt!r}")
        if Path(self.output_dir).resolve() != self.output_dir:
            raise ToolFailure("the output folder was moved or replaced since the server started")
        target = self.output_dir / path
        writers.check_output_path(target, InputError, follow_links=False)  # no link, no folder
        return target

    # -- the tools ------------------------------------------------------------------------------

    async def speak(
            self,
            text: Annotated[str, Field(description="the text to speak", min_length=1,
                                       max_length=limits.MAX_TEXT_CHARS)],
            voice: Annotated[str | None, Field(description="a voice from list_voices (a preset "
                                               "such as 'alloy', or a library voice); none: "
                                               "the model's auto voice", max_length=64)] = None,
            language: Annotated[str | None, Field(description="a language name or id, e.g. "
                                                  "'English' or 'en'", max_length=64)] = None,
            instruct: Annotated[str | None, Field(
                description="voice design for a new voice, comma-separated items, e.g. 'female, "
                            "low pitch, british accent' (gender, age, pitch, style, accent)",
                max_length=500)] = None,
            speed: Annotated[float | None, Field(ge=0.25, le=4.0,
                                                 description="speaking rate, >1 faster")] = None,
            seed: Annotated[int | None, Field(ge=0, lt=2**64, description="the same text, voice "
                                              "and seed give the same audio")] = None,
            response_format: Literal["wav", "mp3", "flac", "opus", "aac"] = "wav",
            path: Annotated[str | None, Field(description="also write the audio to this file "
                                              "name in the server's output folder",
                                              max_length=200)] = None,
    ) -> list:
        """Speak `text` and return the audio."""
        try:
            check_input_length(len(text))
            if not has_words(text):
                raise HTTPError(400, "the text has nothing to say (only punctuation, spaces or "
                                     "invisible characters)", "text", "invalid_input")
            target = None if path is None else self.output_path(path, response_format)
            if instruct is not None:
                frontend.resolve_instruct(instruct)  # strict: an unknown item is refused now
            if voice is not None:
                self.server.check_voice(voice)
            given = {"language": language, "instruct": instruct, "speed": speed, "seed": seed}
            kw = {**self.synth, **{k: v for k, v in given.items() if v is not None}}

            def work(on_step):
                if voice is not None:
                    kw["voice_clone_prompt"] = self.server.voice(voice, on_step)
                result = self.server.model.synthesize(text, on_step=on_step, **kw)[0]
                data = encode_audio(result.audio, response_format)
                if target is not None:
                    writers.write_atomic(target, lambda fh: fh.write(data), InputError,
                                         follow_links=False)
                return result, data
            result, data = await self.admitted(work)
        except ToolFailure:
            raise
        except (HTTPError, OmniCoreError) as exc:
            raise failure(exc) from None
        seconds = len(result.audio) / SAMPLE_RATE
        note = (f"{seconds:.2f} s of speech, {response_format}"
                + (f", written to {target.name} in the output folder" if target else ""))
        return [AudioContent(type="audio", data=base64.b64encode(data).decode("ascii"),
                             mime_type=FORMATS[response_format][2]),
                TextContent(type="text", text=note)]

    async def list_voices(self) -> list[dict]:
        """The voices: the library's, then the presets not made yet (made on first use)."""
        return await self.server.in_thread(list_voices, self.server.voices)

    async def design_voice(
            self,
            name: Annotated[str, Field(description="the new voice's name (letters, digits, '_', "
                                       "'-')", max_length=64)],
            instruct: Annotated[str, Field(description="comma-separated voice-design items, e.g. "
                                           "'female, elderly, low pitch'", max_length=500)],
            seed: Annotated[int, Field(ge=0, lt=2**64)] = 0,
            language: Annotated[str | None, Field(max_length=64)] = None,
            text: Annotated[str | None, Field(description="what the voice's sample says",
                                              max_length=1000)] = None,
    ) -> dict:
        """Design a voice from a description and keep it in the voice library."""
        return await self.make_voice(name, lambda: designed_voice_work(
            self.server, {"instruct": instruct, "seed": seed, "language": language, "text": text,
                          "num_step": self.synth.get("num_step")},
            "instruct", "text"), lambda ins: {"type": "prompt", "prompt": ins})

    async def clone_voice(
            self,
            name: Annotated[str, Field(description="the new voice's name", max_length=64)],
            audio_base64: Annotated[str, Field(description="the clip (wav, flac, ogg or mp3), "
                                               "base64", max_length=MAX_AUDIO_BASE64)],
            ref_text: Annotated[str, Field(description="what the clip says, word for word",
                                           min_length=1, max_length=limits.MAX_TEXT_CHARS)],
            consent: Annotated[str | None, Field(description="the id of the speaker's consent "
                                                 "recording", max_length=64)] = None,
    ) -> dict:
        """Clone the voice of a clip and keep it in the voice library."""
        def prepare():
            try:
                data = base64.b64decode(audio_base64, validate=True)
            except ValueError:
                raise HTTPError(400, "audio_base64 is not base64", "audio_base64",
                                "invalid_audio") from None
            return None, clip_voice_work(self.server, data, ref_text, "audio_base64")
        return await self.make_voice(name, prepare, lambda _: {"type": "audio_sample"}, consent)

    async def make_voice(self, name, prepare, record, consent=None) -> dict:
        """Check everything cheap, make the voice in an admitted slot, keep it."""
        try:
            name = new_voice_name(self.server.voices, name)
            instruct, work = prepare()
            consent = await check_consent(self.server, consent)
            prompt = await self.admitted(work)
            rec = await self.server.in_thread(self.server.voices.add, name, prompt,
                                              record(instruct), consent)
        except (HTTPError, OmniCoreError) as exc:
            raise failure(exc) from None
        return describe_voice(name, prompt, rec)

    async def list_languages(
            self, search: Annotated[str | None, Field(description="part of a language's name "
                                                      "or id", max_length=64)] = None,
    ) -> list[dict]:
        """The languages the model speaks: {id, name}, those matching `search` (any case)."""
        return [{"id": i, "name": n} for i, n in frontend.search_languages(search)]

    def mcp(self) -> MCPServer:
        from .. import __version__

        app = MCPServer("omnicore", instructions=INSTRUCTIONS, version=__version__)
        reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
        writes = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                 open_world_hint=False)
        app.add_tool(self.speak, annotations=writes, structured_output=False)
        app.add_tool(self.list_voices, annotations=reads)
        app.add_tool(self.design_voice, annotations=writes)
        app.add_tool(self.clone_voice, annotations=writes)
        app.add_tool(self.list_languages, annotations=reads)
        return app


def serve(model_path: str, output_dir: str | None, synth: dict, http: bool = False,
          host: str = "127.0.0.1", port: int = 8001, api_key: str | None = None,
          precision: str = "fp32", send_timeout: float = 30.0, grace: float = 30.0,
          quiet: bool = False, **state_args) -> None:
    """Load the model once and serve the tools over stdio (until the client closes it) or, with
    `http`, streamable HTTP at http://HOST:PORT/mcp (until a signal, then drain, as `omnicore
    serve` does). `synth`: the generation settings every call starts from."""
    from . import log_model, server_state

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, stream=sys.stderr,
                        format="%(levelname)s: %(message)s")
    server = server_state(model_path, precision, api_key=api_key, **state_args)
    door = McpDoor(server, output_dir, synth)
    app = door.mcp()
    log_model(log, server, model_path)
    log.info("Output folder: %s", door.output_dir or "none (--output-dir): no files are written")
    server.warm_up(log)  # before it serves: a tool call never waits for a compile
    if not http:
        try:
            app.run("stdio")
        finally:
            server.stop_all()
            server.close()
        return
    from . import runtime

    web = app.streamable_http_app(host=host)
    log.info("MCP: http://%s:%d/mcp", host, port)
    runtime.run(Authorized(web, server) if api_key else web, server, host, port,
                "warning" if quiet else "info", send_timeout, server.idle_timeout, grace)


class Authorized:
    """ASGI middleware: with --api-key, every HTTP request needs `Authorization: Bearer KEY`
    (401 otherwise), compared as `omnicore serve` compares it."""

    def __init__(self, app, server: ServerState):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            header = dict(scope.get("headers", ())).get(b"authorization", b"")
            if not self.server.authorized(header.decode("latin-1")):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"),
                                        (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body",
                            "body": b"missing or wrong API key (Authorization: Bearer KEY)"})
                return
        await self.app(scope, receive, send)
