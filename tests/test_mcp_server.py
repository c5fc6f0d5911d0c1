"""`omnicore mcp` as an agent reaches it: a subprocess on the tiny checkpoint, driven by the
official `mcp` SDK's client over stdio (one session for the module) and over streamable HTTP.
The tools are listed with bounded inputs, `speak` returns decodable audio and writes only into
--output-dir whatever the path, errors are tool errors with omnicore's message, the voice tools
work on the server's voice library; and the same text, voice and seed give the same audio
through Wyoming, MCP, HTTP and Python."""

import asyncio
import base64
import contextlib
import io
import json
import os
import queue
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import (HOUSE, TINY, doc_examples, free_port, require_module, spawn_omnicore,  # noqa: E402
                      start_server, start_wyoming, stop_process)

require_module("mcp", "mcp")
httpx = require_module("httpx")
sf = require_module("soundfile")
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from omnicore import VoiceClonePrompt  # noqa: E402
from omnicore.audio.writers import to_pcm16  # noqa: E402

pytestmark = pytest.mark.subprocess

ROOT = TINY.parents[1]
VOICE = HOUSE  # a library voice (conftest.house_voices)
STEPS = ("--steps", "4")
CLIP = ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav"
# Past 1 MiB of wav (the SDK's HTTP client takes no bigger event): ~25 s of speech.
LONG = " ".join(f"Sentence number {i} of a story that goes on a little longer." for i in range(7))


class Session:
    """One MCP client session (a server subprocess over stdio) held open for the module, in an
    event loop of its own: `call(tool, arguments)` -> the CallToolResult."""

    def __init__(self, server, log_path):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.ready, self.stop = threading.Event(), asyncio.Event()

        async def hold():
            with open(log_path, "w") as log:
                async with Client(stdio_client(server, errlog=log)) as client:
                    self.client = client
                    self.ready.set()
                    await self.stop.wait()
        self.task = asyncio.run_coroutine_threadsafe(hold(), self.loop)

    def run(self, coro_fn):
        if not self.ready.wait(120):
            raise AssertionError(f"the MCP server did not start: {self.task}")
        return asyncio.run_coroutine_threadsafe(coro_fn(self.client), self.loop).result(300)

    def call(self, tool, **arguments):
        return self.run(lambda c: c.call_tool(tool, arguments))

    def close(self):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.task.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)


def stdio_params(*flags) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "omnicore", "mcp", "--model", str(TINY),
                                       "--profile", "exact", *map(str, flags)],
                                 env={"PYTHONPATH": str(ROOT)}, cwd=str(ROOT))


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mcp") / "out"


@pytest.fixture(scope="module")
def mcp(house_voices, out_dir):
    session = Session(stdio_params("--output-dir", out_dir, "--voices-dir", house_voices, *STEPS),
                      out_dir.parent / "mcp.log")
    yield session
    session.close()


def audio_of(result) -> tuple[bytes, str]:
    assert not result.is_error, result.content
    block = result.content[0]
    assert block.type == "audio"
    return base64.b64decode(block.data), block.mime_type


def error_of(result) -> str:
    assert result.is_error
    return result.content[0].text


def test_tools_are_listed_with_bounded_inputs(mcp):
    tools = {t.name: t for t in mcp.run(lambda c: c.list_tools()).tools}
    assert set(tools) == {"speak", "list_voices", "design_voice", "clone_voice", "delete_voice",
                          "list_languages"}
    props = tools["speak"].input_schema["properties"]
    assert props["text"]["maxLength"] == 20_000 and tools["speak"].input_schema["required"] == ["text"]
    speed = props["speed"]["anyOf"][0]
    assert (speed["minimum"], speed["maximum"]) == (0.25, 4.0)
    assert props["response_format"]["anyOf"][0]["enum"] == ["wav", "mp3", "flac", "opus", "aac"]
    assert all(t.input_schema["additionalProperties"] is False for t in tools.values())
    assert tools["delete_voice"].annotations.destructive_hint
    assert tools["clone_voice"].input_schema["properties"]["audio_base64"]["maxLength"] > 20 * 2**20
    assert tools["list_voices"].annotations.read_only_hint
    assert tools["speak"].description


def test_speak_returns_audio_and_writes_the_same_bytes_into_the_output_folder(mcp, out_dir):
    data, mime = audio_of(mcp.call("speak", text="Hello from the agent.", voice=VOICE,
                                   path="hello.wav"))
    audio, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert mime == "audio/wav" and sr == 24000 and len(audio) > 2400
    assert (out_dir / "hello.wav").read_bytes() == data
    assert sorted(p.name for p in out_dir.iterdir()) == ["hello.wav"]
    for fmt, ext in (("mp3", "mp3"), ("aac", "aac"), ("flac", "flac")):
        data, mime = audio_of(mcp.call("speak", text="Hello.", voice=VOICE, response_format=fmt))
        assert mime == {"mp3": "audio/mpeg", "aac": "audio/aac", "flac": "audio/flac"}[fmt]
        assert len(data) > 100, fmt


def test_no_path_writes_outside_the_output_folder(mcp, out_dir, tmp_path):
    """Whatever `path` says: parent folders, absolute paths, subfolders, NUL, very long names,
    hidden names, a symbolic link planted in the folder pointing outside: a tool error, and
    nothing outside the folder changes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "target.wav"
    target.write_bytes(b"untouched")
    (out_dir / "link.wav").symlink_to(target)
    (out_dir / "sub").symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in out_dir.iterdir())
    hostile = ["../escape.wav", "../../escape.wav", str(outside / "abs.wav"), "sub/x.wav",
               "a\0.wav", "x" * 5000 + ".wav", "..", ".hidden.wav", "link.wav", "", " .wav",
               "x.wav/", "x.txt", "C:\\x.wav", "%2e%2e/x.wav"]
    for path in hostile:
        message = error_of(mcp.call("speak", text="Hi.", path=path))
        assert "speak" in message, (path, message)
    assert target.read_bytes() == b"untouched" and sorted(p.name for p in outside.iterdir()) == [
        "target.wav"]
    assert sorted(p.name for p in out_dir.iterdir()) == before
    assert "symbolic link" in error_of(mcp.call("speak", text="Hi.", path="link.wav"))


def test_errors_are_tool_errors_with_omnicores_message(mcp):
    assert "unknown voice 'nobody'" in error_of(mcp.call("speak", text="Hi.", voice="nobody"))
    message = error_of(mcp.call("speak", text="Hi.", instruct="female, low pich"))
    assert "did you mean 'low pitch'" in message
    assert "nothing to say" in error_of(mcp.call("speak", text=" ... "))
    for bad in (dict(text="x" * 20_001), dict(text="Hi.", speed=9), dict(text="Hi.", seed=-1),
                dict(text="Hi.", response_format="pcm")):
        assert "validation error" in error_of(mcp.call("speak", **bad)), bad


def test_the_voice_tools_share_the_server_library(mcp, house_voices):
    made = json.loads(mcp.call("design_voice", name="aria", instruct="female, elderly",
                               seed=2).content[0].text)
    assert made["id"] == "aria" and (house_voices / "aria.npz").is_file()
    assert "already exists" in error_of(mcp.call("design_voice", name="aria", instruct="male"))
    assert "preset voice" in error_of(mcp.call("design_voice", name="alloy", instruct="male"))
    clip = base64.b64encode(CLIP.read_bytes()).decode()
    ref_text = (ROOT / "tests" / "fixtures" / "audio" / "speech.txt").read_text().strip()
    cloned = json.loads(mcp.call("clone_voice", name="clip", audio_base64=clip,
                                 ref_text=ref_text).content[0].text)
    assert cloned["type"] == "audio_sample" and cloned["ref_text"]
    assert "base64" in error_of(mcp.call("clone_voice", name="clip2", audio_base64="%%%",
                                         ref_text="Hi."))
    assert "could not read the uploaded audio" in error_of(mcp.call("clone_voice", name="clip2",
                                            audio_base64=base64.b64encode(b"noise" * 99).decode(),
                                            ref_text="Hi."))
    listed = mcp.call("list_voices")
    assert len(listed.content) == 1
    assert {"aria", "clip", VOICE, "alloy", "cedar"} <= {
        v["id"] for v in json.loads(listed.content[0].text)["voices"]}
    assert audio_of(mcp.call("speak", text="Hi.", voice="clip"))
    found = json.loads(mcp.call("list_languages", search="english").content[0].text)
    assert found["languages"]["en"] == "English" and found["count"] < 20
    assert json.loads(mcp.call("delete_voice", name="clip").content[0].text) == {
        "id": "clip", "deleted": True}
    assert not (house_voices / "clip.npz").exists()
    message = error_of(mcp.call("delete_voice", name="clip"))
    assert "unknown voice 'clip'" in message and "list_voices" in message


def test_messages_name_tools_and_refuse_what_is_not_taken(mcp):
    """What an agent reads names its tools, never the HTTP routes; an argument no tool takes
    and a language the model does not know are refused, naming them."""
    for message in (error_of(mcp.call("speak", text="Hi.", voice="nobody")),
                    error_of(mcp.call("design_voice", name=VOICE, instruct="male"))):
        assert "/v1/" not in message and ("list_voices" in message or "delete_voice" in message)
    message = error_of(mcp.call("speak", text="Hi.", volume=3))
    assert "speak" in message and "volume: speak takes no such argument" in message
    message = error_of(mcp.call("speak", text="Hi.", language="Klingon"))
    assert "unknown language 'Klingon'" in message and "list_languages" in message
    assert "did you mean 'en'" in error_of(mcp.call("speak", text="Hi.", language="Englsh"))
    assert "did you mean 'de'" in error_of(mcp.call("design_voice", name="x", instruct="male",
                                                    language="Germna"))
    assert not mcp.call("speak", text="Hi.", voice=VOICE, language="en").is_error
    every = mcp.call("list_languages")
    assert len(every.content) == 1 and len(every.content[0].text) < 16_000
    assert json.loads(every.content[0].text)["count"] == 646
    assert "did you mean" in mcp.call("list_languages", search="Englsh").content[0].text


def test_a_long_call_reports_its_progress(mcp):
    """A call that asks for progress hears of each engine step while it runs: several
    notifications, their progress growing, all before the result."""
    heard = []

    async def call(client):
        async def on_progress(progress, total, message):
            heard.append((progress, message))
        result = await client.call_tool("speak", {"text": "One sentence. And then another one.",
                                                  "voice": VOICE}, progress_callback=on_progress)
        return result, len(heard)
    result, before_result = mcp.run(call)
    assert audio_of(result) and before_result == len(heard) >= 4
    assert [p for p, _ in heard] == sorted({p for p, _ in heard})
    assert heard[0][1] == "step 1 of 4" and heard[-1][1] == "step 4 of 4"


def test_audio_past_the_inline_limit_is_linked_or_compressed(mcp, out_dir, house_voices,
                                                             tmp_path):
    """Past 512 KiB of audio a result links the file it wrote into --output-dir; a server
    without one sends a default wav that big as mp3, and refuses one asked for (saying how),
    before any of its work when the plan says it will not fit (no engine step is heard)."""
    mcp.run(lambda c: c.list_tools())  # the server has started, and made its folder
    before = set(out_dir.iterdir())
    result = mcp.call("speak", text=LONG, voice=VOICE)
    assert [b.type for b in result.content] == ["resource_link", "text"]
    (written,) = set(out_dir.iterdir()) - before
    assert result.content[0].uri == written.as_uri() and written.suffix == ".wav"
    assert written.stat().st_size == result.content[0].size > 512 * 1024
    written.unlink()
    bare = Session(stdio_params("--voices-dir", house_voices, *STEPS), tmp_path / "bare.log")
    try:
        data, mime = audio_of(bare.call("speak", text=LONG, voice=VOICE))
        assert mime == "audio/mpeg" and sf.info(io.BytesIO(data)).duration > 11
        assert "as wav it was over" in bare.call("speak", text=LONG, voice=VOICE).content[1].text
        heard = []

        async def refused(client):
            async def on_progress(progress, total, message):
                heard.append(progress)
            return await client.call_tool("speak", {"text": LONG, "voice": VOICE,
                                                    "response_format": "wav"},
                                          progress_callback=on_progress)
        message = error_of(bare.run(refused))
        assert "--output-dir" in message and "'mp3'" in message
        assert "this text would make about" in message and heard == []
    finally:
        bare.close()


def test_clone_voice_without_a_needed_consent_is_a_tool_error(tiny_model, tmp_path):
    """Where a cloned voice needs its speaker's consent, clone_voice without one (or with an
    unknown one) is a tool error naming the argument, in the agent's terms."""
    from omnicore.apps.server.mcp_server import McpDoor
    from omnicore.apps.server.state import ServerState

    server = ServerState(tiny_model, tmp_path / "voices", require_consent=True)
    clip = base64.b64encode(CLIP.read_bytes()).decode()

    async def clone(**extra):
        async with Client(McpDoor(server, None, {"num_step": 4}).mcp()) as client:
            return await client.call_tool("clone_voice", {"name": "c", "audio_base64": clip,
                                                          "ref_text": "Hello.", **extra})
    try:
        for extra in ({}, {"consent": "cons_nobody"}):
            message = error_of(asyncio.run(clone(**extra)))
            assert "clone_voice" in message and "consent" in message and "/v1/" not in message
    finally:
        server.close()


def test_a_folder_that_requires_consent_binds_a_door_started_without_the_flag(tiny_model,
                                                                               tmp_path):
    """A voices folder set to require consent (by `omnicore serve --require-consent`, say)
    binds `omnicore mcp` on it without the flag: clone_voice without a consent is refused and
    leaves nothing, the voice is made once a consent is named; design_voice needs none."""
    from omnicore.apps.server import VoiceLibrary
    from omnicore.apps.server.mcp_server import McpDoor
    from omnicore.apps.server.state import ServerState

    folder = tmp_path / "voices"
    VoiceLibrary(folder, require_consent=True)
    server = ServerState(tiny_model, folder)
    clip = base64.b64encode(CLIP.read_bytes()).decode()
    consent = server.voices.add_consent("Ann", "en", CLIP.read_bytes(), "wav")["id"]

    async def call(tool, **arguments):
        async with Client(McpDoor(server, None, {"num_step": 4}).mcp()) as client:
            return await client.call_tool(tool, arguments)
    try:
        refused = asyncio.run(call("clone_voice", name="c", audio_base64=clip, ref_text="Hello."))
        assert "consent" in error_of(refused)
        assert not list(folder.glob("c.*"))
        made = asyncio.run(call("clone_voice", name="c", audio_base64=clip, ref_text="Hello.",
                                consent=consent))
        assert not made.is_error, made.content
        assert server.voices.record("c")["consent"]["id"] == consent
        designed = asyncio.run(call("design_voice", name="d", instruct="female", text="Hi."))
        assert not designed.is_error, designed.content
    finally:
        server.close()


def test_a_cancelled_call_leaves_the_engine_within_steps(tiny_model, tmp_path):
    """What an MCP client's cancel does to the tool (its task cancelled): the call's passes
    leave the model's engine within a step or two, and its place is given back."""
    from omnicore.apps.server.mcp_server import McpDoor
    from omnicore.apps.server.state import ServerState

    long = " ".join(f"Sentence {i} of a story that goes on and on." for i in range(60))
    server = ServerState(tiny_model, tmp_path / "voices")
    door = McpDoor(server, None, {"num_step": 64})

    async def cancel():
        task = asyncio.ensure_future(door.speak(text=long))
        while tiny_model.engine.load().active_passes == 0:
            await asyncio.sleep(0.01)
        before = tiny_model.engine.load().iterations
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while tiny_model.engine.load().active_passes + tiny_model.engine.load().waiting_passes:
            await asyncio.sleep(0.01)
        return tiny_model.engine.load().iterations - before
    try:
        assert asyncio.run(asyncio.wait_for(cancel(), 120)) <= 3
        assert server.load()["in_flight"] == 0
    finally:
        server.stop_all()
        server.close()


@contextlib.contextmanager
def mcp_over_http(tmp_path, *flags):
    """`omnicore mcp --http FLAGS` as a subprocess: its URL once it answers."""
    port = free_port()
    log = tmp_path / "mcp-http.log"
    proc = spawn_omnicore("mcp", "--http", "--port", port, "--model", TINY, "--profile", "exact",
                          *STEPS, *flags,
                          log_path=log)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 90
        while True:  # up once it answers at all
            assert proc.poll() is None, log.read_text()[-4000:]
            try:
                httpx.post(url, json={}, timeout=5)
                break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the MCP server is not up"
            time.sleep(0.3)
        yield url
    finally:
        stop_process(proc, 30)


def http_session(url, key=None):
    import httpx2

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers,
                                                                              timeout=300)))


def test_streamable_http_needs_the_key(house_voices, tmp_path):
    with mcp_over_http(tmp_path, "--api-key", "k-123", "--voices-dir", house_voices) as url:
        async def talk(key, arguments):
            async with http_session(url, key) as c:
                names = [t.name for t in (await c.list_tools()).tools]
                return names, await c.call_tool("speak", arguments)
        names, result = asyncio.run(talk("k-123", {"text": "Over HTTP.", "voice": VOICE}))
        data, mime = audio_of(result)
        assert "speak" in names and mime == "audio/mpeg"
        assert sf.info(io.BytesIO(data)).samplerate == 24000
        assert httpx.post(url, json={}, timeout=10).status_code == 401
        with pytest.raises(Exception):
            asyncio.run(talk("wrong", {"text": "Hi."}))
        # Too big to carry inline, and no --output-dir: a refusal that says how to get it.
        message = error_of(asyncio.run(talk("k-123", {"text": LONG, "voice": VOICE,
                                                      "response_format": "wav"}))[1])
        assert "KiB a result carries inline" in message and "'mp3'" in message
        assert "--output-dir" in message
    assert f"MCP: serving streamable HTTP at {url}" in (tmp_path / "mcp-http.log").read_text()


def test_long_speech_over_http_reaches_the_sdks_own_client(house_voices, tmp_path):
    """The SDK's HTTP client refuses an event over 1 MiB, ~25 s of wav: by default speak
    answers in mp3 over HTTP, inline, with progress on the way. Over HTTP nothing is linked (a
    remote client cannot read a file:// link to the server's disk): a wav past the inline
    limit is refused before its work, unless its call names a path, which is written into
    --output-dir and named."""
    out = tmp_path / "out"
    with mcp_over_http(tmp_path, "--voices-dir", house_voices, "--output-dir", out) as url:
        heard = []

        async def talk():
            async with http_session(url) as c:
                async def on_progress(progress, total, message):
                    heard.append(progress)
                mp3 = await c.call_tool("speak", {"text": LONG, "voice": VOICE},
                                        progress_callback=on_progress)
                steps = len(heard)
                unnamed = await c.call_tool("speak", {"text": LONG, "voice": VOICE,
                                                      "response_format": "wav"},
                                            progress_callback=on_progress)
                assert len(heard) == steps  # refused before any step
                return mp3, unnamed, await c.call_tool("speak", {"text": LONG, "voice": VOICE,
                                                                 "path": "long.wav"})
        mp3, unnamed, named = asyncio.run(talk())
    data, mime = audio_of(mp3)
    assert mime == "audio/mpeg" and sf.info(io.BytesIO(data)).duration * 48_000 > 1.1 * 2**20
    assert len(heard) >= 4 and heard == sorted(set(heard))
    assert "give `path`" in error_of(unnamed)
    assert not named.is_error and [b.type for b in named.content] == ["text"]
    written = out / "long.wav"
    assert "long.wav" in named.content[0].text and "not linked" in named.content[0].text
    assert written.stat().st_size > 2**20 and sf.info(written).samplerate == 24000
    assert sorted(out.iterdir()) == [written]  # the unnamed call wrote nothing


def test_a_server_that_cannot_start_tells_its_client_why(tmp_path):
    """A model that cannot be loaded (here a folder that is not there; offline, a hub id not
    in the cache): the SDK's client is answered with the reason in one line, not a bare
    "connection closed", and the server exits 2 with the error on stderr."""
    from mcp.shared.exceptions import MCPError

    missing = tmp_path / "no-model"
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "omnicore", "mcp", "--model", str(missing)],
                                   env={"PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    errors = []

    async def start():
        with open(tmp_path / "err.log", "w") as log:
            try:
                async with Client(stdio_client(params, errlog=log)):
                    pass
            except BaseException as exc:  # noqa: BLE001 - the SDK raises a group of them
                stack = [exc]
                while stack:
                    e = stack.pop()
                    errors.append(e)
                    stack += list(getattr(e, "exceptions", ()))
    asyncio.run(asyncio.wait_for(start(), 120))
    told = [str(e) for e in errors if isinstance(e, MCPError)]
    assert told and all(m.startswith("omnicore could not start: ") for m in told), errors
    assert str(missing) in told[0] and "\n" not in told[0]
    assert "omnicore: error:" in (tmp_path / "err.log").read_text()


def test_stdio_answers_unreadable_lines_and_logs_its_start_on_stderr(house_voices, tmp_path):
    """A line that is no JSON-RPC message gets JSON-RPC's error (the SDK alone says nothing,
    and the client waits); the start-up lines go to stderr, stdout carries only messages."""
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"}}}
    with open(tmp_path / "stderr.log", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "omnicore", "mcp", "--model",
                                 str(TINY), "--voices-dir", str(house_voices), *STEPS],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        proc.stdin.write(b"this is not json\n" + b'{"jsonrpc": "2.0", "method": 5}\n'
                         + json.dumps(initialize).encode() + b"\n")
        proc.stdin.flush()
        answers = [json.loads(lines.get(timeout=120)) for _ in range(3)]
        proc.stdin.close()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            stop_process(proc, 10)
    assert [(a.get("id"), a.get("error", {}).get("code")) for a in answers] == [
        (None, -32700), (None, -32600), (1, None)]
    assert answers[2]["result"]["serverInfo"]["name"] == "omnicore" and lines.empty()
    log = (tmp_path / "stderr.log").read_text()
    for line in ("model tiny-random", f" in {house_voices}", "Ready in ",
                 "MCP: serving on stdio", "Profile: live (approximate)"):  # the door's default
        assert line in log, log


def test_speak_names_its_profile(tiny_model, tmp_path):
    """The speak tool's description says which profile speaks (the server's --profile): an
    agent's user can see that the door's default, live, is approximate."""
    from omnicore import OmniVoice
    from omnicore.apps.server.mcp_server import McpDoor
    from omnicore.apps.server.state import ServerState

    async def description(model):
        server = ServerState(model, tmp_path / "voices")
        async with Client(McpDoor(server, None, {}).mcp()) as client:
            tools = (await client.list_tools()).tools
        return next(t.description for t in tools if t.name == "speak")
    live = OmniVoice.from_pretrained(TINY, profile="live")
    assert "Spoken with the live (approximate) profile" in asyncio.run(description(live))
    assert "--profile exact" in asyncio.run(description(live))
    assert "Spoken with the exact profile" in asyncio.run(description(tiny_model))
    assert "precision" not in asyncio.run(description(tiny_model))  # fp32 goes unsaid
    int8 = OmniVoice.from_pretrained(TINY, precision="int8", profile="live")
    said = asyncio.run(description(int8))
    assert "Its precision is int8 (approximate)" in said and "--precision fp32" in said


def test_same_text_voice_and_seed_same_audio_through_every_door(mcp, tiny_model, house_voices,
                                                                 tmp_path):
    """Seeded sampling (one pass: nothing shares its forwards). The streamed doors (Wyoming,
    HTTP pcm) give `model.stream`'s audio; the whole-file doors (MCP, HTTP flac) give
    `model.generate`'s; another seed gives other audio."""
    text, seed = "Hello there, friend.", 11
    prompt = VoiceClonePrompt.load(house_voices / f"{VOICE}.npz")
    kw = dict(voice_clone_prompt=prompt, seed=seed, num_step=4)
    streamed = np.concatenate([to_pcm16(x) for x in tiny_model.stream(text, **kw)]).tobytes()
    whole = to_pcm16(tiny_model.generate(text, **kw)[0])

    proc, url = start_server(house_voices, "-q", log_path=tmp_path / "serve.log")
    wyoming, port = start_wyoming(house_voices, "--seed", seed, "--profile", "exact", *STEPS,
                                  log_path=tmp_path / "wy.log")
    try:
        body = {"input": text, "voice": VOICE, "seed": seed, "num_step": 4}
        pcm = httpx.post(url + "/v1/audio/speech", json={**body, "response_format": "pcm"},
                         timeout=120).content
        flac = httpx.post(url + "/v1/audio/speech", json={**body, "response_format": "flac"},
                          timeout=120).content

        async def wyoming_audio():
            from wyoming.client import AsyncTcpClient
            from wyoming.tts import Synthesize, SynthesizeVoice

            async with AsyncTcpClient("127.0.0.1", port) as c:
                await c.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=VOICE)).event())
                audio = b""
                while (event := await c.read_event()).type != "audio-stop":
                    audio += event.payload or b""
                return audio
        by_wyoming = asyncio.run(wyoming_audio())
    finally:
        stop_process(proc, 30)
        stop_process(wyoming, 30)
    by_mcp, _ = audio_of(mcp.call("speak", text=text, voice=VOICE, seed=seed))
    other, _ = audio_of(mcp.call("speak", text=text, voice=VOICE, seed=seed + 1))

    # The same audio, up to float rounding: a process's BLAS may round a sample of the decode
    # the other way (how its buffers happen to be aligned), one 16-bit step at most.
    def same(a, b):
        a, b = np.asarray(a, np.int32), np.asarray(b, np.int32)
        return a.shape == b.shape and np.abs(a - b).max() <= 1
    pcm16 = lambda data: np.frombuffer(data, "<i2")  # noqa: E731
    decode = lambda data: sf.read(io.BytesIO(data), dtype="int16")[0]  # noqa: E731
    assert same(pcm16(by_wyoming), pcm16(pcm)) and same(pcm16(pcm), pcm16(streamed))
    assert same(decode(by_mcp), decode(flac)) and same(decode(flac), whole)
    assert not same(decode(other), whole)


MCP_EXAMPLES = [ex for ex in doc_examples("docs/integrations.md") if "omnicore mcp" in ex[1]
                or '"mcp"' in ex[1]]


def test_the_docs_have_an_mcp_example():
    assert MCP_EXAMPLES


@pytest.mark.parametrize("where, code", MCP_EXAMPLES, ids=[w for w, _ in MCP_EXAMPLES])
def test_the_docs_mcp_example_runs(where, code, tmp_path, monkeypatch, capsys):
    """As written, but on the tiny checkpoint, and its server on this checkout (the SDK passes
    a server only a few variables of its environment)."""
    import mcp.client.stdio as stdio

    monkeypatch.chdir(tmp_path)
    default = stdio.get_default_environment
    monkeypatch.setattr(stdio, "get_default_environment",
                        lambda: {**default(), "PYTHONPATH": str(ROOT)})
    assert '"k2-fsa/OmniVoice"' in code, "the example names the model it serves"
    code = code.replace('"k2-fsa/OmniVoice"', repr(str(TINY)))
    exec(compile(code, where, "exec"), {"__name__": "__example__"})
    assert "s of speech" in capsys.readouterr().out and (tmp_path / "speech" / "reminder.wav").is_file()


def test_list_voices_survives_a_label_that_is_not_text_and_a_preset_says_it_is_one(
        mcp, house_voices):
    """A record on disk whose label holds a lone surrogate costs its own label, not the list;
    deleting a listed preset that is not made yet says so, not "unknown voice"."""
    import shutil

    shutil.copy(house_voices / f"{VOICE}.npz", house_voices / "odd.npz")
    (house_voices / "odd.voice.json").write_text(
        '{"name": "\\ud800 x", "type": "audio_sample", "created_at": 1}')
    try:
        listed = mcp.call("list_voices")
        assert not listed.is_error, listed.content
        shown = {v["id"]: v for v in json.loads(listed.content[0].text)["voices"]}
        assert shown["odd"]["name"] == "odd" and shown["ash"]["made"] is False
    finally:
        for p in house_voices.glob("odd.*"):
            p.unlink()
    message = error_of(mcp.call("delete_voice", name="ash"))
    assert "preset voice not made" in message and "nothing to delete" in message, message
