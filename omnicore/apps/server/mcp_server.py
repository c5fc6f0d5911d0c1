"""`omnicore mcp`: an MCP server, so that LLM agents speak through tools (the `mcp` extra: the
official SDK's MCPServer), over stdio, or streamable HTTP with `--http`.

    speak(text, voice, language, instruct, speed, seed, response_format, path)
                      the audio as MCP audio content (and, given `path`, the same bytes
                      written into --output-dir), with a line saying what was made
    list_voices()     the presets and the voice library, one JSON block
    design_voice(name, instruct, seed, language, text)   a designed voice, kept
    clone_voice(name, audio_base64, ref_text, consent)   a cloned clip, kept
    delete_voice(name)                                   a library voice, gone
    list_languages(search)                               the model's languages, one block

One path per job, `omnicore serve`'s: each tool call is admitted like a request
(`ServerState.slot`: --max-queue, --max-concurrency), its voice resolved by the server's
resolver, its audio made by `model.synthesize` (the whole utterance, post-processed as the
reference does: the same audio as the speech route with flac) and encoded by the server's
encoders (speaking.py, every door's path); voices are made as every door makes them
(voice_making.py) and kept in the one voice library.
A call that asked for progress gets a notification per engine step; a cancelled call stops
its passes at the next step.

What an agent meets is said in its own terms: errors are tool errors (`is_error`) carrying
omnicore's message, naming tools where the HTTP API names routes; an argument a tool does not
take, or a language the model does not know, is refused (HTTP falls back to no language, as
the reference does; an agent learns more from an error naming the closest). A result never
carries more than MAX_INLINE_AUDIO bytes of audio inline (the SDK's HTTP client refuses an
event over 1 MiB): past it the audio is written into --output-dir and linked (over HTTP: named,
never linked, and only by a path the call gives; see McpDoor.deliver), or refused with a
message saying how to get it, before any work when the plan says so; over HTTP the default
format is mp3.

Nothing is written outside --output-dir, whatever the arguments: `path` is a file name (no
folder, no `..`, no absolute path, no NUL, at most 128 characters) with the format's
extension, and a symbolic link there is refused, never followed (audio/writers.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import io
import json
import logging
import queue
import re
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Literal

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import (INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR, AudioContent, ErrorData,
                       JSONRPCError, ResourceLink, TextContent, ToolAnnotations)
from pydantic import ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ...audio import writers
from ...errors import InputError, OmniCoreError
from ...model.config import FRAME_RATE, SAMPLE_RATE
from ...text import frontend, limits
from . import speaking
from .formats import FORMATS, encode_audio, encoder_missing
from .library import VoiceLibrary
from .protocol import MAX_UPLOAD_BYTES, PRECISION_LABELS, PROFILE_LABELS, HTTPError, as_http
from .state import ServerState
from .voice_making import check_consent, clip_voice_work, designed_voice_work, make_voice
from .voices import describe_voice, list_voices, new_voice_name, nothing_to_delete

log = logging.getLogger("omnicore.mcp")
AUDIO_FORMATS = ("wav", "mp3", "flac", "opus", "aac")  # self-describing files (not raw pcm)
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
EXTENSIONS = {"wav": ".wav", "mp3": ".mp3", "flac": ".flac", "opus": ".ogg", "aac": ".aac"}
MAX_AUDIO_BASE64 = (MAX_UPLOAD_BYTES + 2) // 3 * 4  # base64 of the largest clip the server takes
MAX_START_LINE = 1 << 20  # a client's line read by a server that cannot start
START_REFUSAL_S = 30.0  # how long a server that cannot start answers its client (refuse_start)
# The most audio a result carries inline: its base64 (4/3 as long) and the message around it
# stay well under the 1 MiB the SDK's streamable-HTTP client takes in one event. About 65 s
# of mp3 (64 kbit/s), 11 s of wav.
MAX_INLINE_AUDIO = 512 * 1024
FORMAT_OF = {ext: fmt for fmt, ext in EXTENSIONS.items()}  # a path's extension -> its format
# Bytes a second of speech takes, for the formats whose size the length alone decides (16-bit
# mono wav; the rest vary with the audio): a call whose plan is over the inline limit by
# OVERSIZE_MARGIN is refused before it runs (post-processing may trim silence: a plan just
# over the limit is made, and looked at once made).
BYTES_PER_SECOND = {"wav": 2 * SAMPLE_RATE}
OVERSIZE_MARGIN = 1.25
# The format of a speak call that must fit inline (its result cannot be a file), else None.
INLINE_ONLY: contextvars.ContextVar = contextvars.ContextVar("omnicore_mcp_inline_only",
                                                             default=None)
# What an agent can do about a refusal, in its terms: the tools it has (protocol.HTTP_HINTS
# words the same hints with the HTTP routes). Consents are made through `omnicore serve`.
TOOL_HINTS = {
    "list_voices": "; list_voices lists them",
    "replace_voice": "; delete_voice deletes it first",
    "list_consents": "; `omnicore serve` lists them (its voice consents, on this --voices-dir)",
    "create_consent": "; create it with `omnicore serve`'s voice consents (on this "
                      "--voices-dir)",
    "give_consent": ": upload their consent recording to `omnicore serve`'s voice consents (on "
                    "this --voices-dir) and pass its id as 'consent'",
}
# The call being served (its MCP Context), where its work reports progress.
CALL: contextvars.ContextVar = contextvars.ContextVar("omnicore_mcp_call", default=None)

INSTRUCTIONS = """omnicore speaks text with OmniVoice (600+ languages, voice cloning and voice
design). speak() returns the audio; name a voice from list_voices() to keep one speaker, or
give `instruct` (voice-design items: gender, age, pitch, style, accent) for a new one."""
SPEAK = f"""Speak `text` and return the audio, with a line saying how long and in which format.
Up to {MAX_INLINE_AUDIO // 1024} KiB of audio comes inline (about 65 s of mp3, 11 s of wav; a
default wav past it comes as mp3); past it the file is written into the server's output folder
and linked (over stdio), or refused (ask for mp3 or opus, or less text). A long text takes a
while: ask for progress to hear of each engine step."""


class ToolFailure(ToolError):
    """A tool call refused or failed: omnicore's own message, as the client reads it."""


def failure(exc: BaseException) -> ToolFailure:
    return ToolFailure(as_http(exc).worded(TOOL_HINTS))


def check_language(language: str) -> None:
    """A language the model knows (as frontend.resolve_language reads it), else a tool error
    naming the closest."""
    if language.lower() != "none" and language not in frontend.ID_TO_NAME \
            and language.lower() not in frontend.NAME_TO_ID:
        raise ToolFailure(f"unknown language {language!r}{frontend.language_hint(language)}; "
                          "list_languages(search=...) finds its id")


def strict_arguments(loose: type, tool: str) -> type:
    """A tool's argument model that refuses an argument it does not name, and says what is
    wrong with each argument in a line an agent reads (not pydantic's report, its input
    and its links)."""
    takes = ", ".join(loose.model_fields) or "no arguments"

    def problem(error: dict) -> str:
        where = ".".join(map(str, error["loc"])) or "the arguments"
        if error["type"] == "extra_forbidden":
            return f"{where}: {tool} takes no such argument (it takes {takes})"
        return f"{where}: {error['msg']}"

    def explained(cls, data, handler):
        try:
            return handler(data)
        except ValidationError as exc:
            raise PydanticCustomError("invalid_arguments", "{problems}", {
                "problems": "; ".join(map(problem, exc.errors()))}) from None
    return type(loose.__name__, (loose,), {
        "__module__": loose.__module__, "explained": model_validator(mode="wrap")(explained),
        "model_config": ConfigDict(extra="forbid", hide_input_in_errors=True,
                                   arbitrary_types_allowed=True)})


def oversize(nbytes: int, fmt: str, hint: str, planned: bool = False) -> ToolFailure:
    """The refusal of audio too big to carry inline, saying how to get it."""
    what = (f"this text would make about {nbytes:,} bytes of {fmt}" if planned
            else f"the audio is {nbytes:,} bytes of {fmt}")
    return ToolFailure(
        f"{what}, over the {MAX_INLINE_AUDIO // 1024} KiB a result carries inline (MCP clients "
        f"refuse bigger messages): ask for a compressed response_format ('mp3' or 'opus'), "
        f"speak less text per call, or {hint}")


def too_big(audio: AudioContent) -> bool:
    """Over MAX_INLINE_AUDIO bytes of audio (as its base64)."""
    return len(audio.data) > (MAX_INLINE_AUDIO + 2) // 3 * 4


def recoded(content: list, fmt: str) -> list:
    """speak's wav result in `fmt` instead (blocking: it encodes)."""
    import soundfile as sf

    samples, _ = sf.read(io.BytesIO(base64.b64decode(content[0].data)), dtype="float32")
    data = encode_audio(samples, fmt)
    return [AudioContent(type="audio", data=base64.b64encode(data).decode("ascii"),
                         mime_type=FORMATS[fmt][2]),
            TextContent(type="text", text=f"{len(samples) / SAMPLE_RATE:.2f} s of speech, {fmt} "
                        f"(as wav it was over the {MAX_INLINE_AUDIO // 1024} KiB a result "
                        f"carries inline)")]


class Progress:
    """A call's progress for its client (nothing unless it sent a progress token): each
    engine step of its work, counted, since a wave of passes starts its steps again and MCP's
    progress must only grow; sent in order by one task on the event loop."""

    def __init__(self, ctx):
        self.ctx, self.count = ctx, 0
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.sender = self.loop.create_task(self.send())

    def on_step(self, step: int, total: int) -> None:  # in the worker thread
        self.count += 1
        self.loop.call_soon_threadsafe(self.queue.put_nowait,
                                       (self.count, f"step {step} of {total}"))

    async def send(self) -> None:
        try:
            while (item := await self.queue.get()) is not None:
                await self.ctx.report_progress(item[0], None, item[1])
        except Exception as exc:  # a courtesy: a client that is gone is the call's business
            log.debug("progress not sent: %r", exc)

    async def close(self, flush: bool) -> None:
        """Send what is queued first (the result follows its progress), or drop it."""
        if flush:
            self.queue.put_nowait(None)
            await self.sender
        else:
            self.sender.cancel()


class McpDoor:
    """The tools over one ServerState, and where `speak` may write."""

    def __init__(self, server: ServerState, output_dir: str | None, synth: dict,
                 http: bool = False):
        self.server, self.synth, self.http = server, synth, http
        # wav is exact, and small enough on stdio; HTTP gets mp3, a sixth of its size
        self.default_format = "mp3" if http else "wav"
        self.output_dir = None
        if output_dir is not None:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            self.output_dir = Path(output_dir).resolve()

    async def admitted(self, work, *args):
        """work(*args, on_step) in a worker thread, admitted like a request; a cancelled call
        (or a stopping server) stops its passes at the next step."""
        gone = asyncio.get_running_loop().create_future()  # an MCP call is cancelled, not left
        async with self.server.slot(gone) as slot:
            progress = None if CALL.get() is None else Progress(CALL.get())

            def on_step(step: int, total: int) -> None:
                slot.on_step(step, total)
                if progress is not None:
                    progress.on_step(step, total)
            try:
                result = await slot.run(work, *args, on_step)
            except BaseException:
                if progress is not None:
                    await progress.close(flush=False)
                raise
            if progress is not None:
                await progress.close(flush=True)
            return result

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
            response_format: Annotated[Literal["wav", "mp3", "flac", "opus", "aac"] | None, Field(
                description="the audio's format; none: the path's (.wav, .mp3, .flac, .ogg, "
                            ".aac), else wav over stdio and mp3 over HTTP")] = None,
            path: Annotated[str | None, Field(description="also write the audio to this file "
                                              "name in the server's output folder",
                                              max_length=200)] = None,
    ) -> list:
        """Speak `text` and return the audio."""
        try:
            speaking.check_text(text, "text")
            target = None if path is None else self.output_path(path, response_format)
            if instruct is not None:
                frontend.resolve_instruct(instruct)  # strict: an unknown item is refused now
            if voice is not None:  # the library is read off the loop
                await self.server.in_thread(self.server.check_voice, voice)
            given = {"language": language, "instruct": instruct, "speed": speed, "seed": seed}
            kw = {**self.synth, **{k: v for k, v in given.items() if v is not None}}
            if INLINE_ONLY.get() in BYTES_PER_SECOND:  # its size known from the plan: checked
                kw["_on_passes"] = self.check_planned_size(INLINE_ONLY.get(), path)

            def write(data: bytes) -> None:
                writers.write_atomic(target, lambda fh: fh.write(data), InputError,
                                     follow_links=False)

            def work(on_step):  # the voice in the same admitted work, so its steps count
                prompt = None if voice is None else self.server.voice(voice, on_step)
                return speaking.synthesize(self.server, text, speaking.with_voice(kw, prompt),
                                           response_format, on_step,
                                           None if target is None else write)
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

    def inline_only(self, path: str | None) -> bool:
        """Whether a result must carry its audio inline: with no output folder, and over HTTP
        unless the call names its file (a remote client cannot read the server's files)."""
        return self.output_dir is None or (self.http and path is None)

    def file_hint(self, path: str | None) -> str:
        if self.output_dir is None:
            return "start the server with --output-dir so that speak writes the file"
        if self.http and path is None:
            return "give `path` to have it written into the server's output folder"
        return "give another path"

    def check_planned_size(self, fmt: str, path: str | None):
        """The passes' check (model.synthesize's _on_passes, before any runs): a text whose
        plan is clearly over what a result carries is refused before its work."""
        def check(specs) -> None:
            seconds = sum(spec.frames for spec in specs) / FRAME_RATE
            nbytes = int(seconds * BYTES_PER_SECOND[fmt])
            if nbytes > OVERSIZE_MARGIN * MAX_INLINE_AUDIO:
                raise oversize(nbytes, fmt, self.file_hint(path), planned=True)
        return check

    async def speak_call(self, **arguments) -> list:
        """speak, in the format the call names, else its path's, else the transport's; its
        result as the client can take it (deliver)."""
        fmt, path = arguments["response_format"], arguments["path"]
        if fmt is None:
            fmt = FORMAT_OF.get(Path(path).suffix.lower() if path else "", self.default_format)
        if why := encoder_missing(fmt):
            raise ToolFailure(why)
        recodes = (arguments["response_format"] is None and fmt == "wav"
                   and self.inline_only(path) and not encoder_missing("mp3"))
        token = INLINE_ONLY.set(fmt if self.inline_only(path) and not recodes else None)
        try:
            content = await self.speak(**{**arguments, "response_format": fmt})
        finally:
            INLINE_ONLY.reset(token)
        if recodes and too_big(content[0]):
            # the default's wav is too big to send: mp3 carries six times as much
            content, fmt = await self.server.in_thread(recoded, content, "mp3"), "mp3"
        return await self.deliver(content, fmt, path)

    async def deliver(self, content: list, fmt: str, path: str | None) -> list:
        """speak's result, its audio inline up to MAX_INLINE_AUDIO; past it the file in the
        output folder (the call's path, else, over stdio, a new name), linked over stdio and
        named over HTTP, or a tool error that says how to get the audio.

        Over HTTP nothing is linked: a file:// link names a file on the server's machine,
        which a remote client cannot read; and serving it as an MCP resource would not carry
        it either, since a resource's contents come in one message, under the same 1 MiB as a
        result's. So a remote client gets its audio inline, or on the server's disk by a name
        it gave."""
        audio, note = content
        if not too_big(audio):
            return content
        data = base64.b64decode(audio.data)
        if self.inline_only(path):
            raise oversize(len(data), fmt, self.file_hint(path))
        if self.http:
            return [TextContent(type="text", text=f"{note.text}; over the "
                                f"{MAX_INLINE_AUDIO // 1024} KiB a result carries inline, so it "
                                f"is only in the server's output folder, as {path} (not linked: "
                                f"a remote client cannot read the server's files)")]
        if path is None:  # speak wrote nothing yet
            path = (f"speech-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
                    f"{EXTENSIONS[fmt]}")
            target = self.output_path(path, fmt)
            await self.server.in_thread(lambda: writers.write_atomic(
                target, lambda fh: fh.write(data), InputError, follow_links=False))
        target = self.output_dir / path
        return [ResourceLink(type="resource_link", uri=target.as_uri(), name=target.name,
                             mime_type=audio.mime_type, size=len(data)),
                TextContent(type="text", text=f"{note.text}; over the {MAX_INLINE_AUDIO // 1024} "
                            f"KiB a result carries inline, so it is linked: {target.name} in the "
                            f"output folder")]

    async def list_voices(self) -> dict:
        """The voices, {"voices": [...]}: the library's, then the presets not made yet (made
        on first use)."""
        return {"voices": await self.server.in_thread(list_voices, self.server.voices)}

    async def design_voice(
            self,
            name: Annotated[str, Field(description="the new voice's name (letters, digits, '_', "
                                       "'-')", max_length=64)],
            instruct: Annotated[str, Field(description="comma-separated voice-design items, e.g. "
                                           "'female, elderly, low pitch'", max_length=500)],
            seed: Annotated[int, Field(ge=0, lt=2**64)] = 0,
            language: Annotated[str | None, Field(description="the sample's language, a name "
                                                  "or id, e.g. 'English' or 'en'",
                                                  max_length=64)] = None,
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
                                                 "recording, which a voice library that "
                                                 "requires consent needs", max_length=64)] = None,
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
            if record(instruct)["type"] != "prompt":  # a designed voice needs no consent
                consent = await check_consent(self.server, consent)
            prompt, rec = await make_voice(self.server, self.admitted, name, work,
                                           record(instruct), consent)
        except (HTTPError, OmniCoreError) as exc:
            raise failure(exc) from None
        return describe_voice(name, prompt, rec)

    async def delete_voice(
            self, name: Annotated[str, Field(description="a voice of the library (list_voices)",
                                             max_length=64)],
    ) -> dict:
        """Delete a voice from the voice library (a preset is made again on its next use)."""
        name = VoiceLibrary.check_name(name)
        if not await self.server.in_thread(self.server.voices.delete, name):
            raise nothing_to_delete(name)
        return {"id": name, "deleted": True}

    async def list_languages(
            self, search: Annotated[str | None, Field(description="part of a language's name "
                                                      "or id, any case", max_length=64)] = None,
    ) -> str:
        """The languages the model speaks, one JSON object {"count": n, "languages": {id:
        name}}: all of them (646), or those whose id or name contains `search`."""
        found = frontend.search_languages(search)
        if not found:
            return (f"no language's id or name contains {search!r}"
                    f"{frontend.language_hint(search)}")
        return json.dumps({"count": len(found), "languages": dict(found)}, ensure_ascii=False,
                          separators=(",", ":"))

    def tool(self, fn, run=None, **kw) -> Tool:
        """fn's tool (its signature is the input schema), run as run(**arguments) (default:
        fn): an argument it does not take is refused (the SDK drops one without a word), a
        language is checked, omnicore's errors are tool errors, and the call's context is at
        hand (CALL) for its progress."""
        tool = Tool.from_function(fn, context_kwarg="ctx", **kw)
        strict = strict_arguments(tool.fn_metadata.arg_model, tool.name)
        tool.fn_metadata.arg_model = strict
        tool.parameters = strict.model_json_schema(by_alias=True)  # additionalProperties: false
        run = run or fn

        async def call(ctx, **arguments):
            token = CALL.set(ctx)
            try:
                if arguments.get("language") is not None:
                    check_language(arguments["language"])
                return await run(**arguments)
            except (HTTPError, OmniCoreError) as exc:
                raise failure(exc) from None
            finally:
                CALL.reset(token)
        tool.fn = call
        return tool

    def mcp(self) -> MCPServer:
        from ... import __version__

        reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
        writes = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                 open_world_hint=False)
        deletes = ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                  idempotent_hint=True, open_world_hint=False)
        profile = getattr(self.server.model, "profile", "exact")
        precision = getattr(self.server.model, "precision", "fp32")
        spoken = (f"\nSpoken with the {PROFILE_LABELS[profile]} profile (the server's "
                  "--profile)" + ("." if profile == "exact" else ", chosen so that a call "
                                  "answers in time on a CPU; `omnicore mcp --profile exact` "
                                  "runs the reference's algorithm.")
                  + ("" if precision == "fp32" else f" Its precision is {PRECISION_LABELS[precision]}"
                     " (the server's --precision): the model's products are not the float32 "
                     "ones; --precision fp32 runs them."))
        tools = [self.tool(self.speak, self.speak_call, annotations=writes,
                           structured_output=False, description=SPEAK + spoken),
                 self.tool(self.list_voices, annotations=reads),
                 self.tool(self.design_voice, annotations=writes),
                 self.tool(self.clone_voice, annotations=writes),
                 self.tool(self.delete_voice, annotations=deletes),
                 self.tool(self.list_languages, annotations=reads, structured_output=False)]
        return DoorServer("omnicore", instructions=INSTRUCTIONS, version=__version__, tools=tools)


class DoorServer(MCPServer):
    """The SDK's server, answering what it cannot read on stdio."""

    async def run_stdio_async(self) -> None:
        """The SDK's stdio loop, but a line that is no JSON-RPC message gets JSON-RPC's error
        (-32700 for a line that is not JSON, -32600 for JSON that is no message): the SDK
        drops it without a word, and its client waits."""
        server = self._lowlevel_server
        async with stdio_server() as (read, write), anyio.create_task_group() as tasks:
            forward, messages = anyio.create_memory_object_stream(0)
            tasks.start_soon(answer_malformed, read, write, forward)
            await server.run(messages, write, server.create_initialization_options())
            tasks.cancel_scope.cancel()


async def answer_malformed(read, write, forward) -> None:
    """Pass the messages read on; answer what could not be read as one."""
    async with forward:
        async for item in read:
            if not isinstance(item, Exception):
                await forward.send(item)
                continue
            if isinstance(item, ValidationError) and any(
                    e["type"] == "json_invalid" for e in item.errors()):
                error = ErrorData(code=PARSE_ERROR, message="Parse error: the line is not JSON")
            else:
                error = ErrorData(code=INVALID_REQUEST, message="Invalid Request: the line is "
                                                                "not a JSON-RPC 2.0 message")
            await write.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=error)))


def refuse_start(exc: OmniCoreError, stdin=None, stdout=None,
                 seconds: float = START_REFUSAL_S) -> None:
    """A server that cannot start on stdio (its model cannot be loaded: offline, say) answers
    each request its client sends (`initialize`, and a newer client's `server/discover` first)
    with the reason in one line, so the client shows what to do, not just "connection closed",
    until the client leaves or for `seconds`; then the caller exits with the error on stderr,
    as every command does. Lines that are not requests get nothing."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    message = "omnicore could not start: " + " ".join(str(exc).split())
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in iter(lambda: stdin.readline(MAX_START_LINE), b""):
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            return
        if line is None:
            return
        try:
            request_id = json.loads(line).get("id")
        except (ValueError, AttributeError, RecursionError):
            continue
        if request_id is None:  # a notification: nothing to answer
            continue
        reply = JSONRPCError(jsonrpc="2.0", id=request_id,
                             error=ErrorData(code=INTERNAL_ERROR, message=message))
        stdout.write(reply.model_dump_json(by_alias=True, exclude_none=True).encode() + b"\n")
        stdout.flush()


def serve(model_path: str, output_dir: str | None, synth: dict, http: bool = False,
          host: str = "127.0.0.1", port: int = 8001, api_key: str | None = None,
          precision: str = "fp32", send_timeout: float = 30.0, grace: float = 30.0,
          quiet: bool = False, **state_args) -> None:
    """Load the model once and serve the tools over stdio (until the client closes it) or, with
    `http`, streamable HTTP at http://HOST:PORT/mcp (until a signal, then drain, as `omnicore
    serve` does). `synth`: the generation settings every call starts from."""
    from . import log_model, log_to_stderr, server_state
    from .voices import DOOR_VOICE

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, stream=sys.stderr,
                        format="%(levelname)s: %(message)s")
    log_to_stderr(log, quiet)  # stderr: on stdio, stdout is the protocol's
    try:
        server = server_state(model_path, precision, api_key=api_key, default_voice=DOOR_VOICE,
                              **state_args)
    except OmniCoreError as exc:
        if not http:
            refuse_start(exc)
        raise
    door = McpDoor(server, output_dir, synth, http)
    app = door.mcp()
    log_model(log, server, model_path)
    log.info("Output folder: %s", door.output_dir or "none (--output-dir): no files are written")
    server.warm_up(log)  # before it serves: a tool call never waits for a compile or alloy
    if not http:
        log.info("MCP: serving on stdio (stdin and stdout are the protocol's; log lines "
                 "come here, on stderr)")
        try:
            app.run("stdio")
        finally:
            server.stop_all()
            server.close()
        return
    from . import runtime

    web = app.streamable_http_app(host=host)
    log.info("MCP: serving streamable HTTP at http://%s:%d/mcp", host, port)
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
