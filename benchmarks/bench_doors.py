#!/usr/bin/env python3
"""The time to first audio through each front door, measured the same way: one request at a
time, from the moment the request leaves the client (its connection already open, as a client
that keeps one holds it) to the first audio byte it gets back, the median of --reps runs after
one warm-up run, the same text and voice, the server's default generation settings (what the
frameworks' stock classes, which cannot set them, get). Each run stops at its first audio (the
request is closed or cancelled, as a barge-in would), so the server is idle for the next.

    python3 benchmarks/bench_doors.py [--model DIR] [--reps 3] [--steps N] [--markdown FILE]

--model defaults to $OMNICORE_BENCH_MODEL, else weights/tiny-random; --steps sets num_step for
every door (default: the reference's 32; the stock classes then cannot follow, and are left
out). One server process at a time (a full-size model is 3-6 GB): `omnicore serve` for HTTP
streaming pcm, the WebSocket, LiveKit's and Pipecat's stock OpenAI classes and omnicore's
adapters for them; then `omnicore wyoming` (one-shot, and the text streamed in word by word,
all at once); then `omnicore mcp` over stdio (`speak` returns the whole file: its first audio
is its last). `model.stream` in this process is the floor. The frameworks run directly,
without a room or a transport.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEXT = ("Hello! This is the first sentence, and it is long enough to be spoken on its own. "
        "The second one is made while the first one plays.")
VOICE = "alloy"
WORDS = [w + " " for w in TEXT.split(" ")]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(*args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "omnicore.cli", *map(str, args), "-q"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait(proc, ready, what: str, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            if ready():
                return
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} not up after {seconds} s")


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


async def timed(runs: int, once) -> list[float]:
    """`once()` -> its first-audio seconds; one warm-up run, then `runs`."""
    await once()
    return [await once() for _ in range(runs)]


# -- the doors ----------------------------------------------------------------------------------

async def http_pcm(url, settings):
    async with httpx.AsyncClient(timeout=900) as client:
        async def once():
            t0 = time.perf_counter()
            async with client.stream("POST", url + "/v1/audio/speech", json={
                    "input": TEXT, "voice": VOICE, "response_format": "pcm",
                    "stream_format": "audio", **settings}) as r:
                async for part in r.aiter_bytes():
                    if part:
                        return time.perf_counter() - t0  # leaving closes the response
        return await timed(ARGS.reps, once)


async def websocket(url, settings):
    import websockets

    async with websockets.connect(url.replace("http", "ws", 1) + "/v1/audio/speech/stream-input",
                                  max_size=None) as ws:
        await ws.send(json.dumps({"voice": VOICE, "response_format": "pcm", **settings}))

        async def once():
            t0 = time.perf_counter()
            for w in WORDS:
                await ws.send(json.dumps({"text": w}))
            await ws.send(json.dumps({"flush": True}))
            first = None
            while True:
                m = await ws.recv()
                if isinstance(m, bytes) and first is None:
                    first = time.perf_counter() - t0
                    await ws.send(json.dumps({"cancel": True}))
                elif isinstance(m, str) and json.loads(m)["type"] == "audio.done":
                    return first
        return await timed(ARGS.reps, once)


async def livekit_stock(url, settings):
    from livekit.plugins import openai

    tts = openai.TTS(base_url=url + "/v1", api_key="-", voice=VOICE)  # mp3 over SSE: its default

    async def once():
        t0 = time.perf_counter()
        async with tts.synthesize(TEXT) as stream:
            async for _ in stream:
                return time.perf_counter() - t0  # leaving closes the stream
    try:
        return await timed(ARGS.reps, once)
    finally:
        await tts.aclose()


async def livekit_adapter(url, settings):
    from omnicore.voice_agents.livekit_tts import TTS

    tts = TTS(base_url=url, voice=VOICE, **settings)

    async def once():
        t0 = time.perf_counter()  # the socket opens per stream: counted
        stream = tts.stream()
        for w in WORDS:
            stream.push_text(w)
        stream.end_input()
        async for _ in stream:
            first = time.perf_counter() - t0
            break
        await stream.aclose()  # a barge-in: the server cancels the rest
        return first
    try:
        return await timed(ARGS.reps, once)
    finally:
        await tts.aclose()


async def pipecat_stock(url, settings):
    from pipecat.clocks.system_clock import SystemClock
    from pipecat.processors.frame_processor import FrameProcessorSetup
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.utils.asyncio.task_manager import TaskManager

    svc = OpenAITTSService(api_key="-", base_url=url + "/v1",
                           settings=OpenAITTSService.Settings(voice=VOICE))
    await svc.setup(FrameProcessorSetup(clock=SystemClock(), task_manager=TaskManager(),
                                        pipeline_worker=None, audio_out_sample_rate=24000))

    async def once():
        t0 = time.perf_counter()
        async for _ in svc.run_tts(TEXT, "turn"):
            return time.perf_counter() - t0  # leaving closes the response
    try:
        return await timed(ARGS.reps, once)
    finally:
        await svc.cleanup()


async def pipecat_adapter(url, settings):
    from pipecat.frames.frames import (EndFrame, InterruptionFrame, LLMFullResponseEndFrame,
                                       LLMFullResponseStartFrame, LLMTextFrame, TTSAudioRawFrame)
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection
    from pipecat.tests.utils import QueuedFrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from omnicore.voice_agents.pipecat_tts import OmnicoreTTSService

    out = asyncio.Queue()
    svc = OmnicoreTTSService(base_url=url, voice=VOICE, fields=settings)
    worker = PipelineWorker(Pipeline([svc, QueuedFrameProcessor(
        queue=out, queue_direction=FrameDirection.DOWNSTREAM)]), cancel_on_idle_timeout=False)
    runner = WorkerRunner()
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())

    async def once():
        t0 = time.perf_counter()
        await worker.queue_frame(LLMFullResponseStartFrame())
        for w in WORDS:
            await worker.queue_frame(LLMTextFrame(text=w))
        await worker.queue_frame(LLMFullResponseEndFrame())
        while not isinstance(await out.get(), TTSAudioRawFrame):
            pass
        first = time.perf_counter() - t0
        await worker.queue_frame(InterruptionFrame())  # a barge-in: the server cancels the rest
        while True:  # until the interrupted turn's frames stop coming
            try:
                await asyncio.wait_for(out.get(), 2)
            except asyncio.TimeoutError:
                return first
    try:
        return await timed(ARGS.reps, once)
    finally:
        await worker.queue_frame(EndFrame())
        await running


async def wyoming(port, streamed: bool):
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop,
                             SynthesizeVoice)

    voice = SynthesizeVoice(name=VOICE)

    async def once():
        # Wyoming has no cancel: a client stops a text by leaving, so a run has its own
        # connection (opened before the clock starts).
        async with AsyncTcpClient("127.0.0.1", port) as client:
            t0 = time.perf_counter()
            if streamed:
                await client.write_event(SynthesizeStart(voice=voice).event())
                for w in WORDS:
                    await client.write_event(SynthesizeChunk(text=w).event())
                await client.write_event(SynthesizeStop().event())
            else:
                await client.write_event(Synthesize(text=TEXT, voice=voice).event())
            while (await client.read_event()).type != "audio-chunk":
                pass
            return time.perf_counter() - t0
    return await timed(ARGS.reps, once)


async def mcp_speak(model, settings_flags):
    from mcp import Client, StdioServerParameters

    env = {"PYTHONPATH": str(ROOT), **{k: v for k, v in os.environ.items()
                                       if k.startswith(("OMP_", "OPENBLAS_", "NUMBA_"))}}
    params = StdioServerParameters(command=sys.executable, env=env, args=[
        "-m", "omnicore.cli", "mcp", "--model", model, "-q", *settings_flags])
    with open(os.devnull, "w") as log:
        from mcp.client.stdio import stdio_client

        async with Client(stdio_client(params, errlog=log), read_timeout_seconds=900) as client:
            async def once():
                t0 = time.perf_counter()
                result = await client.call_tool("speak", {"text": TEXT, "voice": VOICE})
                assert not result.is_error, result.content
                return time.perf_counter() - t0
            return await timed(ARGS.reps, once)


def floor(model_dir, settings) -> list[float]:
    """model.stream in this process: no door at all."""
    from omnicore import OmniVoice

    from omnicore.server.voices import PRESET_VOICES, designed_voice

    model = OmniVoice.from_pretrained(model_dir)
    prompt = designed_voice(model, *PRESET_VOICES[VOICE])  # the preset, as the servers make it

    def once():
        t0 = time.perf_counter()
        with model.stream(TEXT, voice_clone_prompt=prompt, **settings) as stream:
            next(stream)
            return time.perf_counter() - t0  # leaving closes the stream
    once()
    return [once() for _ in range(ARGS.reps)]


def attempt(door, *args):
    """The door's runs, or what stopped its client (a framework's own read timeout, say) as a
    line of the table: one door failing does not lose the others' figures."""
    try:
        return asyncio.run(door(*args))
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        cause = exc.__cause__ or exc
        return f"{type(exc).__name__} ({type(cause).__name__})"


# -- the run ------------------------------------------------------------------------------------

def main() -> None:
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("OMNICORE_BENCH_MODEL",
                                                     str(ROOT / "weights" / "tiny-random")))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, help="num_step for every door (default: 32, the "
                                              "reference's; the stock classes need it)")
    p.add_argument("--markdown", help="also write the table here")
    ARGS = p.parse_args()
    settings = {"num_step": ARGS.steps} if ARGS.steps else {}
    flags = ("--steps", ARGS.steps) if ARGS.steps else ()
    voices = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-doors-{os.getpid()}"
    rows = []

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn("serve", "--model", ARGS.model, "--port", port, "--voices-dir", voices)
    try:
        wait(proc, lambda: httpx.get(url + "/health", timeout=2).status_code == 200, "serve")
        doors = [("HTTP POST, pcm streamed", http_pcm), ("WebSocket (stream-input)", websocket),
                 ("LiveKit adapter (WebSocket)", livekit_adapter),
                 ("Pipecat adapter (WebSocket)", pipecat_adapter)]
        if not ARGS.steps:
            doors += [("LiveKit stock OpenAI TTS (mp3 over SSE)", livekit_stock),
                      ("Pipecat stock OpenAITTSService (pcm)", pipecat_stock)]
        for name, door in doors:
            rows.append((name, attempt(door, url, settings)))
    finally:
        stop(proc)

    port = free_port()
    proc = spawn("wyoming", "--model", ARGS.model, "--uri", f"tcp://127.0.0.1:{port}",
                 "--voices-dir", voices, *flags)
    try:
        def up():
            import socket

            with socket.create_connection(("127.0.0.1", port), 1):
                return True
        wait(proc, up, "wyoming")
        rows.append(("Wyoming synthesize (one-shot)", attempt(wyoming, port, False)))
        rows.append(("Wyoming synthesize-chunk (streamed in)", attempt(wyoming, port, True)))
    finally:
        stop(proc)
    rows.append(("MCP speak (stdio; the whole file)", attempt(
        mcp_speak, ARGS.model, ("--voices-dir", str(voices), *map(str, flags)))))
    # Last: no server holds a model while this process does.
    rows.insert(0, ("model.stream (this process, no door)", floor(ARGS.model, settings)))

    load = os.getloadavg()
    http = statistics.median(rows[1][1])
    lines = [f"model {ARGS.model}, {ARGS.steps or 32} steps, voice {VOICE}, median of {ARGS.reps} "
             f"after a warm-up; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", "",
             "| door | first audio (s), median | runs (s) | / HTTP |", "|---|---|---|---|"]
    for name, runs in rows:
        if isinstance(runs, str):  # the client gave up: its own timeout, say
            lines.append(f"| {name} | failed | {runs} | |")
            continue
        med = statistics.median(runs)
        lines.append(f"| {name} | {med:.2f} | {', '.join(f'{r:.2f}' for r in runs)} | "
                     f"{med / http:.2f} |")
    print("\n".join(lines))
    if ARGS.markdown:
        Path(ARGS.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
