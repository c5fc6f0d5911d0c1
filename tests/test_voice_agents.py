"""LiveKit Agents and Pipecat driving `omnicore serve` (a subprocess on the tiny checkpoint),
each run directly, without a room or a transport server: their stock OpenAI TTS classes against
/v1/audio/speech, and omnicore's own adapters (omnicore.apps.voice_agents) against the WebSocket for
voice agents. Audio comes out in order at 24 kHz, a cancelled synthesis frees the server, and
what unblocks the stock classes holds: OpenAI's `instructions` as prose, `x-request-id` on every
response, mp3 frame by frame, voice aliases for clients that only allow OpenAI's names.

The stock classes' checks (`check_*`) take the server's URL: test_ray_serve.py runs the same
ones against `omnicore serve --ray`, through Serve's proxy."""

import asyncio
import json
import re
import shutil
import time

import pytest

from conftest import (HOUSE, doc_examples, free_port, require_module,  # noqa: E402
                      require_server_extra, start_server, stop_process)

require_server_extra()
httpx = require_module("httpx")
websockets = require_module("websockets", "server")
require_module("livekit.agents", "voice-agents")
require_module("livekit.plugins.openai", "voice-agents")
require_module("pipecat", "voice-agents")
from loguru import logger  # noqa: E402  (pipecat's logger)
from livekit.plugins import openai as livekit_openai  # noqa: E402
from pipecat.clocks.system_clock import SystemClock  # noqa: E402
from pipecat.frames.frames import (EndFrame, InterruptionFrame, LLMFullResponseEndFrame,  # noqa: E402
                                   LLMFullResponseStartFrame, LLMTextFrame, TTSAudioRawFrame,
                                   TTSStartedFrame, TTSStoppedFrame)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup  # noqa: E402
from pipecat.services.openai.tts import OpenAITTSService  # noqa: E402
from pipecat.tests.utils import QueuedFrameProcessor  # noqa: E402
from pipecat.utils.asyncio.task_manager import TaskManager  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from omnicore.apps.voice_agents.livekit_tts import TTS as OmnicoreLiveKitTTS  # noqa: E402
from omnicore.apps.voice_agents.pipecat_tts import OmnicoreTTSService  # noqa: E402

pytestmark = pytest.mark.subprocess

VOICE = HOUSE  # a library voice (conftest.house_voices)
GREEDY = {"num_step": 4, "position_temperature": 0.0}
STORY = ("The first sentence is short. The second sentence comes after it and is longer. "
         "A third sentence closes the little story.")
LONG = " ".join(f"Sentence {i} of a story that goes on and on." for i in range(300))


@pytest.fixture(scope="module")
def server(house_voices):
    # an alias must name a voice the library holds at start-up; ghost is deleted by a test
    shutil.copy(house_voices / f"{VOICE}.npz", house_voices / "ghost.npz")
    proc, url = start_server(house_voices, "--voice-alias", f"cedar={VOICE}", "--voice-alias",
                             "marin=ghost", log_path=house_voices / "server.log")
    yield url
    stop_process(proc, 30)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def speech(url, **body) -> httpx.Response:
    """One POST /v1/audio/speech, pcm streamed (the whole body read)."""
    return httpx.post(url + "/v1/audio/speech", timeout=120, json={
        "response_format": "pcm", **body})


def idle(url, replicas: int = 1) -> bool:
    """Whether the server's engine and admission hold nothing, within a minute (a synthesis
    that was not freed holds its place far longer: LONG is minutes of speech). Through Ray
    Serve any replica answers /health: each of the `replicas` (told apart by its
    X-Omnicore-Replica header) must be seen idle."""
    deadline = time.monotonic() + 60
    calm = set()
    while time.monotonic() < deadline:
        r = httpx.get(url + "/health", timeout=10)
        load, who = r.json(), r.headers.get("x-omnicore-replica")
        if load["in_flight"] == 0 and load["engine_passes"] == 0:
            calm.add(who)
            if len(calm) >= replicas:
                return True
        else:
            calm.discard(who)
        time.sleep(0.2)
    return False


def cancelled_streams(url, replicas: int = 1) -> float:
    """omnicore_streams_cancelled_total, summed over the `replicas` answering /metrics (as
    `idle`)."""
    seen = {}
    deadline = time.monotonic() + 60
    while len(seen) < replicas and time.monotonic() < deadline:
        r = httpx.get(url + "/metrics", timeout=10)
        seen[r.headers.get("x-omnicore-replica")] = float(next(
            line.split()[-1] for line in r.text.splitlines()
            if line.startswith("omnicore_streams_cancelled_total")))
    assert len(seen) == replicas, seen
    return sum(seen.values())


# -- what unblocks the stock classes ------------------------------------------------------------

def test_every_response_carries_a_request_id(server):
    for r in (httpx.get(server + "/health"), httpx.get(server + "/v1/models"),
              httpx.get(server + "/nowhere"), speech(server, input="")):
        assert r.headers["x-request-id"].startswith("req_"), (r.url, r.headers)
    mine = httpx.get(server + "/v1/models", headers={"X-Request-Id": "trace-42.a"})
    assert mine.headers["x-request-id"] == "trace-42.a"
    hostile = httpx.get(server + "/v1/models", headers={"X-Request-Id": "x" * 300})
    assert hostile.headers["x-request-id"].startswith("req_")

    async def handshake():
        async with websockets.connect(server.replace("http", "ws", 1)
                                      + "/v1/audio/speech/stream-input") as ws:
            return ws.response.headers["x-request-id"]
    assert run(handshake()).startswith("req_")


def test_instructions_are_prose_and_instruct_is_strict(server):
    """OpenAI's `instructions`: the voice-design items found in the prose are used, the rest is
    named in a header, never a 400. omnicore's `instruct` stays strict."""
    text = {"input": "Hello there.", **GREEDY}
    prose = speech(server, instructions="Speak warmly, as a female with a British accent.", **text)
    assert prose.status_code == 200
    assert json.loads(prose.headers["x-omnicore-instructions-ignored"]) == ["Speak warmly, as a"]
    assert prose.content == speech(server, **text, instruct="female, british accent").content
    nothing = speech(server, instructions="Speak cheerfully.", **text)
    assert json.loads(nothing.headers["x-omnicore-instructions-ignored"]) == ["Speak cheerfully"]
    assert nothing.content == speech(server, **text).content
    # everyday words mean items too; what means none, or loses to an earlier item, is named
    old = speech(server, instructions="Speak warmly, like an old british man. Or a woman.", **text)
    assert json.loads(old.headers["x-omnicore-instructions-ignored"]) == [
        "Speak warmly, like an", "woman (gender: kept 'male')"]
    assert old.content == speech(server, **text, instruct="elderly, british accent, male").content
    plain = speech(server, instructions="female, low pitch", **text)
    assert "x-omnicore-instructions-ignored" not in plain.headers
    strict = speech(server, instruct="Speak cheerfully.", **text)
    assert strict.status_code == 400 and strict.json()["error"]["param"] == "instruct"


def test_a_voice_alias_speaks_as_its_library_voice(server):
    assert speech(server, input="Hi.", voice="cedar", **GREEDY).content == \
        speech(server, input="Hi.", voice=VOICE, **GREEDY).content
    assert httpx.delete(server + "/v1/voices/ghost", timeout=60).status_code == 200
    missing = speech(server, input="Hi.", voice="marin")  # its voice deleted since start-up
    assert missing.status_code == 404 and "alias of 'ghost'" in missing.json()["error"]["message"]


# -- the stock classes --------------------------------------------------------------------------

def test_livekit_openai_plugin_default_mp3_streams_frames(server):
    check_livekit_openai_plugin(server)


def test_livekit_cancel_frees_the_server(server):
    check_livekit_cancel(server)


def test_pipecat_openai_service_with_an_aliased_voice(server):
    check_pipecat_openai_service(server)


def check_livekit_openai_plugin(url, request_id=r"req_\w+"):
    """LiveKit's OpenAI TTS as a user configures it (mp3 over SSE by default, prose
    instructions): 24 kHz mono frames of the text's length, carrying the server's request id
    (`request_id`: its form)."""
    async def synthesize():
        tts = livekit_openai.TTS(base_url=url + "/v1", api_key="-", voice="ash",
                                 instructions="Speak calmly, like an elderly man.")
        async with tts.synthesize(STORY) as stream:
            frames = [ev async for ev in stream]
        await tts.aclose()
        return frames
    frames = run(synthesize())
    assert {(f.frame.sample_rate, f.frame.num_channels) for f in frames} == {(24000, 1)}
    assert {f.request_id for f in frames} == {frames[0].request_id}
    assert re.fullmatch(request_id, frames[0].request_id), frames[0].request_id
    samples = sum(f.frame.samples_per_channel for f in frames)
    assert abs(samples - len(speech(url, input=STORY, voice="ash").content) // 2) < 0.2 * 24000


def check_livekit_cancel(url, replicas: int = 1):
    """LiveKit's OpenAI TTS closed after its first frame of a long text: the server counts the
    stream cancelled and its engine and admission empty."""
    before = cancelled_streams(url, replicas)

    async def cancel():
        tts = livekit_openai.TTS(base_url=url + "/v1", api_key="-", voice=VOICE,
                                 response_format="pcm")
        stream = tts.synthesize(LONG)
        first = await stream.__anext__()
        await stream.aclose()
        await tts.aclose()
        return first
    assert run(cancel()).frame.sample_rate == 24000
    assert idle(url, replicas) and cancelled_streams(url, replicas) > before


def pipecat_service(cls, **kw):
    """A Pipecat TTS service set up as a pipeline would set it up (its clock, task manager and
    output rate), without a pipeline."""
    async def make():
        svc = cls(**kw)
        await svc.setup(FrameProcessorSetup(clock=SystemClock(), task_manager=TaskManager(),
                                            pipeline_worker=None, audio_out_sample_rate=24000))
        return svc
    return make()


def check_pipecat_openai_service(url, replicas: int = 1):
    """Pipecat's OpenAITTSService allows only OpenAI's voice names: `cedar`, aliased to a
    library voice, speaks as that voice; prose instructions pass; frames are 24 kHz pcm in
    order; leaving the stream early frees the server."""
    async def speak(text, stop_after=None):
        svc = await pipecat_service(OpenAITTSService, api_key="-", base_url=url + "/v1",
                                    settings=OpenAITTSService.Settings(
                                        voice="cedar", instructions="Speak warmly."))
        frames = []
        async for frame in svc.run_tts(text, "turn-1"):
            frames.append(frame)
            if stop_after and len(frames) >= stop_after:
                break
        await svc.cleanup()
        return frames
    frames = run(speak("Hello there. This is Pipecat speaking."))
    assert frames and all(isinstance(f, TTSAudioRawFrame) for f in frames)
    assert {(f.sample_rate, f.num_channels) for f in frames} == {(24000, 1)}
    pcm = b"".join(f.audio for f in frames)
    assert abs(len(pcm) - len(speech(url, input="Hello there. This is Pipecat speaking.",
                                     voice=VOICE).content)) < 0.2 * 48000
    assert run(speak(LONG, stop_after=1)) and idle(url, replicas)


# -- omnicore's adapters (text in as it is written) ---------------------------------------------

def test_livekit_adapter_streams_text_in_and_barges_in(server):
    """Tokens pushed as an LLM writes them give the bytes of one streamed POST of the whole
    text; closing the stream mid-audio cancels on the server."""
    want = speech(server, input=STORY, voice=VOICE, **GREEDY).content

    async def stream():
        tts = OmnicoreLiveKitTTS(base_url=server, voice=VOICE, **GREEDY)
        assert tts.capabilities.streaming
        s = tts.stream()
        for word in STORY.split(" "):
            s.push_text(word + " ")
        s.end_input()
        frames = [ev async for ev in s]
        await s.aclose()
        async with tts.synthesize("Short one.") as one:
            whole = await one.collect()
        barge = tts.stream()
        barge.push_text(LONG)
        first = await barge.__anext__()
        await barge.aclose()
        await tts.aclose()
        return frames, whole, first
    frames, whole, first = run(stream())
    assert {(f.frame.sample_rate, f.frame.num_channels) for f in frames} == {(24000, 1)}
    assert b"".join(bytes(f.frame.data) for f in frames) == want
    assert whole.sample_rate == 24000 and whole.samples_per_channel > 0
    assert first.frame.samples_per_channel > 0 and idle(server)


async def pipecat_turns(svc, turns, interrupt_first: bool, within: float = 240):
    """Run `svc` in a pipeline (no transport) and speak `turns` (texts, as LLM tokens); with
    `interrupt_first`, interrupt the first turn once its audio has begun. The frames that came
    out, per turn; a turn that has not ended `within` seconds ends the run (the pipeline
    cancelled) with what it had."""
    out = asyncio.Queue()
    pipeline = Pipeline([svc, QueuedFrameProcessor(queue=out, queue_direction=FrameDirection.DOWNSTREAM)])
    worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False)
    runner = WorkerRunner()
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    per_turn = []
    for i, text in enumerate(turns):
        await worker.queue_frame(LLMFullResponseStartFrame())
        for word in text.split(" "):
            await worker.queue_frame(LLMTextFrame(text=word + " "))
        await worker.queue_frame(LLMFullResponseEndFrame())
        frames = []
        while True:
            try:
                frame = await asyncio.wait_for(out.get(), within)
            except asyncio.TimeoutError:
                per_turn.append(frames)
                await runner.cancel()
                await running
                return per_turn
            frames.append(frame)
            if i == 0 and interrupt_first and isinstance(frame, TTSAudioRawFrame):
                await worker.queue_frame(InterruptionFrame())
                # what left the service before the interruption reached it is this turn's (a
                # transport drops it on the interruption); anything of it after would be a leak
                while not isinstance(frame := await out.get(), InterruptionFrame):
                    frames.append(frame)
                break
            if isinstance(frame, TTSStoppedFrame):
                break
        per_turn.append(frames)
    await worker.queue_frame(EndFrame())
    await running
    return per_turn


def test_pipecat_adapter_streams_tokens_and_barges_in(server):
    """LLM tokens in, the turn's audio out as one streamed POST of its text gives it; an
    interruption cancels the turn on the server (its passes leave), and the next turn speaks."""
    want = speech(server, input=STORY, voice=VOICE, **GREEDY).content

    async def talk():
        svc = OmnicoreTTSService(base_url=server, voice=VOICE, fields=GREEDY)
        (spoken,) = await pipecat_turns(svc, [STORY], interrupt_first=False)
        svc = OmnicoreTTSService(base_url=server, voice=VOICE, fields=GREEDY)
        barged, after = await pipecat_turns(svc, [LONG, "Yes?"], interrupt_first=True)
        return spoken, barged, after
    spoken, barged, after = run(talk())
    kinds = [type(f) for f in spoken if isinstance(f, (TTSStartedFrame, TTSAudioRawFrame,
                                                       TTSStoppedFrame))]
    assert kinds[0] is TTSStartedFrame and kinds[-1] is TTSStoppedFrame
    audio = [f for f in spoken if isinstance(f, TTSAudioRawFrame)]
    assert {(f.sample_rate, f.num_channels) for f in audio} == {(24000, 1)}
    assert b"".join(f.audio for f in audio) == want
    assert any(isinstance(f, TTSAudioRawFrame) for f in barged)
    assert b"".join(f.audio for f in after if isinstance(f, TTSAudioRawFrame)) == \
        speech(server, input="Yes?", voice=VOICE, **GREEDY).content
    assert idle(server)


def test_pipecat_adapter_ends_a_turn_it_cannot_speak_at_once():
    """A server that cannot be reached: the turn ends with its error reported and its
    TTSStoppedFrame pushed by the adapter as soon as the connection fails, not when Pipecat's
    stop-frame clock (FIRST_AUDIO_TIMEOUT_S, minutes) gives up on it; nothing is sent on the
    socket it does not have."""
    logged = []
    sink = logger.add(lambda m: logged.append(str(m)), level="DEBUG")

    async def talk():
        svc = OmnicoreTTSService(base_url=f"http://127.0.0.1:{free_port()}", voice=VOICE)
        assert svc._stop_frame_timeout_s >= 60  # a stop frame within the wait below is ours
        return await pipecat_turns(svc, ["Hello there."], False, within=45)
    try:
        (frames,) = run(talk())
    finally:
        logger.remove(sink)
    kinds = [type(f) for f in frames]
    assert TTSStoppedFrame in kinds and TTSAudioRawFrame not in kinds, kinds
    text = "".join(logged)
    assert "cannot reach omnicore" in text and "NoneType" not in text, text[-3000:]


AGENT_EXAMPLES = [ex for ex in doc_examples("docs/integrations.md") if "livekit" in ex[1]
                  or "pipecat" in ex[1]]


def test_the_docs_have_livekit_and_pipecat_examples():
    code = "".join(c for _, c in AGENT_EXAMPLES)
    assert "livekit" in code and "pipecat" in code


@pytest.mark.parametrize("where, code", AGENT_EXAMPLES, ids=[w for w, _ in AGENT_EXAMPLES])
def test_the_docs_agent_examples_run(where, code, server, capsys):
    assert "127.0.0.1:8000" in code
    exec(compile(code.replace("127.0.0.1:8000", server.removeprefix("http://")), where, "exec"),
         {"__name__": "__example__"})
    assert capsys.readouterr().out
