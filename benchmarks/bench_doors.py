#!/usr/bin/env python3
"""The time to first audio, and to all of it, through each front door, measured the same way:
one request at a time, from the moment the request leaves the client (its connection already
open, as a client that keeps one holds it) to the first audio byte it gets back and to the end
of the utterance, the median of --reps runs after one warm-up run, the same text and voice, the
server's default generation settings (what the frameworks' stock classes, which cannot set
them, get).

    python3 benchmarks/bench_doors.py [--model DIR] [--profile exact|fast|live] [--reps 3]
                                      [--steps N] [--no-stretch] [--rtf-profiles LIST]
                                      [--precision P] [--markdown FILE]

The text is a voice assistant's answer. One-shot doors get it whole; the text-in doors
(WebSocket, the adapters, Wyoming streamed) and `model.stream` get it as an LLM writes it:
LLM_CHARS characters every LLM_EVERY_S seconds, the clock starting at the first fragment.
--model defaults to $OMNICORE_BENCH_MODEL, else weights/tiny-random; --profile is every
server's default profile (`--profile` of serve, wyoming and mcp; left out, each door's own
default, DOOR_PROFILE) and the in-process stream's; --precision every server's and the
in-process model's precision profile (default fp32; int8 is the CPU's W8A8 approximation);
--steps sets num_step for every door (default: the profile's; the stock classes then cannot
follow, and are left out). One server process at a time (a full-size model is 3-6 GB):
`omnicore serve` for HTTP streaming pcm, the WebSocket, LiveKit's and Pipecat's stock OpenAI
classes and omnicore's adapters for them; then `omnicore wyoming` (one-shot, and streamed in);
then `omnicore mcp` over stdio (`speak` returns the whole file: its first audio is its last).
`model.stream` in this process is the floor. The frameworks run directly, without a room or a
transport.

The goal column: first audio <= GOAL_S at each door's default (a Home Assistant Voice PE
satellite gives up after ~5 s without audio); LiveKit's stock class must see its first frame
within its 10 s timeout, and MCP `speak` answer (whole) within the TypeScript SDK's 60 s
request timeout; the stretch rows (STRETCH: the most aggressive settings still offered,
the floor and HTTP) aim at <= STRETCH_GOAL_S. Last, the steady-state RTF after chunk 0 of each
profile in --rtf-profiles (bench_streaming.run_stream on the floor's text, one run each):
whether the chunks after the first keep up with playback.
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
sys.path.insert(0, str(ROOT / "benchmarks"))
TEXT = "The living room lights are now off, and the thermostat is set to twenty-one degrees."
VOICE = "alloy"
LLM_CHARS, LLM_EVERY_S = 4, 0.05  # an LLM writing: a few characters every 50 ms
FRAGMENTS = [TEXT[i:i + LLM_CHARS] for i in range(0, len(TEXT), LLM_CHARS)]
# Held-out replies whose first clause ends too early ("Okay,") or never (no punctuation): where
# chunk 0 runs to its cap unless the first-audio budget cuts it (docs/streaming.md).
EARLY_CLAUSE = ("Okay, so I turned off the living room lights and set the thermostat to "
                "twenty-one degrees for tonight.")
NO_PUNCTUATION = ("turning off the living room lights and setting the thermostat to twenty-one "
                  "degrees for the rest of the night")
HELD_OUT = {"early clause": EARLY_CLAUSE, "no punctuation": NO_PUNCTUATION}
GOAL_S = 5.0            # first audio at each door's default
LIVEKIT_TIMEOUT_S = 10.0  # LiveKit's stock OpenAI class gives up after this (3 retries)
STRETCH_GOAL_S = 2.5
MCP_TIMEOUT_S = 60.0  # the TypeScript MCP SDK's default request timeout (speak answers whole)
# The most aggressive first chunk still offered: 3 steps, cut at a clause end after 0.5 s of
# speech or a word break after 1.5 s (below 3 steps a pass is nearly one-shot prediction).
STRETCH = {"profile": "live", "first_chunk_steps": 3, "first_chunk_seconds": 0.5,
           "first_chunk_max_seconds": 1.5}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(*args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "omnicore", *map(str, args), "-q"],
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


async def timed(runs: int, once) -> list[tuple[float, float]]:
    """`once()` -> (first-audio seconds, whole-utterance seconds); one warm-up run, then `runs`."""
    await once()
    return [await once() for _ in range(runs)]


async def llm_writes(send, text: str = TEXT) -> None:
    """`send(fragment)` for each fragment of the text, paced as an LLM writes it."""
    for i, frag in enumerate(text[i:i + LLM_CHARS] for i in range(0, len(text), LLM_CHARS)):
        if i:
            await asyncio.sleep(LLM_EVERY_S)
        await send(frag)


async def first_and_all(write, receive, is_audio, is_end,
                        first_only: bool = False) -> tuple[float, float]:
    """Run `write()` (the request) beside reading `receive()` until `is_end(item)`: (seconds
    to the first item that `is_audio`, seconds to the end), from the start of the write.
    `first_only`: stop at the first audio (the end: None; the caller leaves, which cancels)."""
    t0 = time.perf_counter()
    writer = asyncio.create_task(write())
    first = None
    while True:
        item = await receive()
        if first is None and is_audio(item):
            first = time.perf_counter() - t0
            if first_only:
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
                return first, None
        elif is_end(item):
            await writer
            return first, time.perf_counter() - t0


# -- the doors ----------------------------------------------------------------------------------

async def http_pcm(url, settings):
    async with httpx.AsyncClient(timeout=900) as client:
        async def once():
            t0 = time.perf_counter()
            first = None
            async with client.stream("POST", url + "/v1/audio/speech", json={
                    "input": TEXT, "voice": VOICE, "response_format": "pcm",
                    "stream_format": "audio", **settings}) as r:
                r.raise_for_status()
                async for part in r.aiter_bytes():
                    if part and first is None:
                        first = time.perf_counter() - t0
            return first, time.perf_counter() - t0
        return await timed(ARGS.reps, once)


async def websocket(url, settings):
    import websockets

    async with websockets.connect(url.replace("http", "ws", 1) + "/v1/audio/speech/stream-input",
                                  max_size=None) as ws:
        await ws.send(json.dumps({"voice": VOICE, "response_format": "pcm", **settings}))

        async def once():
            async def write():
                await llm_writes(lambda f: ws.send(json.dumps({"text": f})))
                await ws.send(json.dumps({"flush": True}))

            return await first_and_all(
                write, ws.recv, lambda m: isinstance(m, bytes),
                lambda m: isinstance(m, str) and json.loads(m)["type"] == "audio.done")
        return await timed(ARGS.reps, once)


async def livekit_stock(url, settings):
    from livekit.plugins import openai

    tts = openai.TTS(base_url=url + "/v1", api_key="-", voice=VOICE)  # mp3 over SSE: its default

    async def once():
        t0 = time.perf_counter()
        first = None
        async with tts.synthesize(TEXT) as stream:
            async for _ in stream:
                first = first or time.perf_counter() - t0
        return first, time.perf_counter() - t0
    try:
        return await timed(ARGS.reps, once)
    finally:
        await tts.aclose()


async def livekit_adapter(url, settings):
    from omnicore.apps.voice_agents.livekit_tts import TTS

    tts = TTS(base_url=url, voice=VOICE, **settings)

    async def once():
        t0 = time.perf_counter()  # the socket opens per stream: counted
        stream = tts.stream()

        async def write():
            async def push(fragment):
                stream.push_text(fragment)
            await llm_writes(push)
            stream.end_input()
        writer = asyncio.create_task(write())
        first = None
        async for _ in stream:
            first = first or time.perf_counter() - t0
        total = time.perf_counter() - t0
        await writer
        await stream.aclose()
        return first, total
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
        first = None
        async for frame in svc.run_tts(TEXT, "turn"):
            if first is None and type(frame).__name__ == "TTSAudioRawFrame":
                first = time.perf_counter() - t0
        return first, time.perf_counter() - t0
    try:
        return await timed(ARGS.reps, once)
    finally:
        await svc.cleanup()


async def pipecat_adapter(url, settings):
    from pipecat.frames.frames import (EndFrame, LLMFullResponseEndFrame,
                                       LLMFullResponseStartFrame, LLMTextFrame, TTSAudioRawFrame,
                                       TTSStoppedFrame)
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection
    from pipecat.tests.utils import QueuedFrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from omnicore.apps.voice_agents.pipecat_tts import OmnicoreTTSService

    out = asyncio.Queue()
    svc = OmnicoreTTSService(base_url=url, voice=VOICE, fields=settings)
    worker = PipelineWorker(Pipeline([svc, QueuedFrameProcessor(
        queue=out, queue_direction=FrameDirection.DOWNSTREAM)]), cancel_on_idle_timeout=False)
    runner = WorkerRunner()
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())

    async def once():
        async def write():
            await worker.queue_frame(LLMFullResponseStartFrame())
            await llm_writes(lambda f: worker.queue_frame(LLMTextFrame(text=f)))
            await worker.queue_frame(LLMFullResponseEndFrame())

        return await first_and_all(write, out.get, lambda f: isinstance(f, TTSAudioRawFrame),
                                   lambda f: isinstance(f, TTSStoppedFrame))  # the utterance ends
    try:
        return await timed(ARGS.reps, once)
    finally:
        await worker.queue_frame(EndFrame())
        await running


async def wyoming(port, streamed: bool, text: str = TEXT, runs: int | None = None,
                  warm: bool = True, first_only: bool = False, voice_name: str | None = VOICE):
    """Wyoming's runs of `text` (one-shot or streamed in); `warm`: one warm-up run first;
    `voice_name` None: the door's default voice (the event names none)."""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop,
                             SynthesizeVoice)

    voice = SynthesizeVoice(name=voice_name) if voice_name else None

    async def once():
        # Wyoming has no cancel: a client stops a text by leaving, so a run has its own
        # connection (opened before the clock starts).
        async with AsyncTcpClient("127.0.0.1", port) as client:
            async def write():
                if not streamed:
                    return await client.write_event(Synthesize(text=text, voice=voice).event())
                await client.write_event(SynthesizeStart(voice=voice).event())
                await llm_writes(lambda f: client.write_event(SynthesizeChunk(text=f).event()),
                                 text)
                await client.write_event(SynthesizeStop().event())

            async def kind():
                return (await client.read_event()).type
            end = "synthesize-stopped" if streamed else "audio-stop"
            return await first_and_all(write, kind, lambda k: k == "audio-chunk",
                                       lambda k: k == end, first_only)
    runs = ARGS.reps if runs is None else runs
    if warm:
        return await timed(runs, once)
    return [await once() for _ in range(runs)]


async def mcp_speak(model, settings_flags):
    from mcp import Client, StdioServerParameters

    env = {"PYTHONPATH": str(ROOT), **{k: v for k, v in os.environ.items()
                                       if k.startswith(("OMP_", "OPENBLAS_", "NUMBA_"))}}
    params = StdioServerParameters(command=sys.executable, env=env, args=[
        "-m", "omnicore", "mcp", "--model", model, "-q", *settings_flags])
    with open(os.devnull, "w") as log:
        from mcp.client.stdio import stdio_client

        async with Client(stdio_client(params, errlog=log), read_timeout_seconds=900) as client:
            async def once():
                t0 = time.perf_counter()
                result = await client.call_tool("speak", {"text": TEXT, "voice": VOICE})
                assert not result.is_error, result.content
                took = time.perf_counter() - t0
                return took, took
            return await timed(ARGS.reps, once)


def llm_text():
    """The text as an LLM writes it, for `model.stream` (read in its reader thread)."""
    for i, fragment in enumerate(FRAGMENTS):
        if i:
            time.sleep(LLM_EVERY_S)
        yield fragment


def floor(model_dir, settings) -> tuple[list, list]:
    """model.stream in this process, no door at all: (rows, steady-state RTF per profile)."""
    from bench_streaming import run_stream

    from omnicore import OmniVoice
    from omnicore.apps.server.voices import PRESET_VOICES, designed_voice

    model = OmniVoice.from_pretrained(model_dir, profile=ARGS.profile, precision=ARGS.precision)
    prompt = designed_voice(model, *PRESET_VOICES[VOICE])  # the preset, as the servers make it

    def runs(text, kw, voice=prompt):
        def once():
            t0 = time.perf_counter()
            first = None
            with model.stream(text() if callable(text) else text, voice_clone_prompt=voice,
                              **kw) as stream:
                for _ in stream:
                    first = first or time.perf_counter() - t0
            return first, time.perf_counter() - t0
        once()
        return [once() for _ in range(ARGS.reps)]

    rows = [("model.stream, one-shot (this process, no door)", runs(TEXT, settings), GOAL_S),
            ("model.stream, streamed in (this process)", runs(llm_text, settings), GOAL_S)]
    if ARGS.stretch:
        rows.append(("stretch: model.stream, streamed in", runs(llm_text, {**settings, **STRETCH}),
                     STRETCH_GOAL_S))
        # A voice prompt's positions run in full on chunk 0's first step: the auto voice has
        # almost none, so this is the floor of what fewer steps can give.
        rows.append(("stretch, auto voice: model.stream, streamed in",
                     runs(llm_text, {**settings, **STRETCH}, voice=None), STRETCH_GOAL_S))
    rtf = []
    for profile in ARGS.rtf_profiles:
        r = run_stream(model, TEXT, dict(voice_clone_prompt=prompt, profile=profile, seed=0))
        rtf.append((profile, r))
    return rows, rtf


def attempt(door, *args):
    """The door's runs, or what stopped its client (a framework's own read timeout, say) as a
    line of the table: one door failing does not lose the others' figures."""
    try:
        return asyncio.run(door(*args))
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        cause = exc.__cause__ or exc
        return f"{type(exc).__name__} ({type(cause).__name__})"


# -- a new install's first reply ------------------------------------------------------------------

def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


def start_wyoming(voices, flags, log_path) -> tuple[subprocess.Popen, int, float]:
    """`omnicore wyoming` at its default voice (no --voice) on `voices`: (process, port,
    seconds from spawn until it listens), its stderr into `log_path`."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "omnicore", "wyoming", "--model",
                                 ARGS.model, "--uri", f"tcp://127.0.0.1:{port}", "--voices-dir",
                                 voices, *map(str, flags)], env=env, stdout=log, stderr=log)
    while not listening(port):
        if proc.poll() is not None:
            raise SystemExit(f"wyoming exited with {proc.returncode}: see {log_path}")
        if time.perf_counter() - t0 > ARGS.start_timeout:
            stop(proc)
            raise SystemExit(f"wyoming not listening after {ARGS.start_timeout:g} s: see "
                             f"{log_path}")
        time.sleep(0.05)
    return proc, port, time.perf_counter() - t0


def first_reply(flags) -> list[str]:
    """On a fresh voices folder, Wyoming at its default: start-up to listening (the default
    voice made before it), the first-ever request from the moment it listens, the held-out
    texts' first audio (one-shot and streamed in, first audio only: the client then leaves),
    and start-up again with the voice made. Each line with the load average."""
    import tempfile

    lines = [f"model {ARGS.model}, Wyoming at its default voice ({VOICE}), {ARGS.profile}"]
    folder = Path(tempfile.mkdtemp(prefix="bench-first-reply-"))
    voices = folder / "voices"
    proc, port, up_s = start_wyoming(voices, flags, folder / "first.log")
    try:
        lines.append(f"start-up, fresh voices folder, to listening: {up_s:.1f} s ({load()})")
        (first, _), = asyncio.run(wyoming(port, False, TEXT, 1, False, True, None))
        lines.append(f"first-ever request (one-shot), first audio: {first:.2f} s ({load()})")
        for name, text in HELD_OUT.items():
            for streamed in (False, True):
                got = asyncio.run(wyoming(port, streamed, text, ARGS.reps, False, True, None))
                firsts = ", ".join(f"{f:.2f}" for f, _ in got)
                how = "streamed in" if streamed else "one-shot"
                median = statistics.median(f for f, _ in got)
                lines.append(f"{name}, {how}: first audio {median:.2f} s (runs {firsts}; "
                             f"{load()})")
    finally:
        stop(proc)
    lines += [f"  log: {line}" for line in (folder / "first.log").read_text().splitlines()
              if "making voice" in line or "Ready in" in line or "Rate:" in line]
    proc, port, up_s = start_wyoming(voices, flags, folder / "again.log")
    stop(proc)
    lines.append(f"start-up again, the voice made, to listening: {up_s:.1f} s ({load()})")
    return lines


# -- the run ------------------------------------------------------------------------------------

def table(rows, rtf) -> list[str]:
    load = os.getloadavg()
    http = next((statistics.median(f for f, _ in r) for name, r, _ in rows
                 if name.startswith("HTTP") and not isinstance(r, str)), None)
    steps = ARGS.steps or "the profile's"
    lines = [f"model {ARGS.model}, profile {ARGS.profile}, precision {ARGS.precision}, {steps} steps, "
             f"voice {VOICE}, text streamed in {LLM_CHARS} characters every {LLM_EVERY_S * 1000:.0f} "
             f"ms where a door takes text in; median of {ARGS.reps} after a warm-up; load average "
             f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", "",
             "| door | first audio (s), median | all of it (s), median | runs: first / all (s) "
             "| first / HTTP | goal |", "|---|---|---|---|---|---|"]
    for name, runs, goal in rows:
        if isinstance(runs, str):  # the client gave up: its own timeout, say
            lines.append(f"| {name} | failed | | {runs} | | <= {goal:g} s: missed |")
            continue
        first = statistics.median(f for f, _ in runs)
        total = statistics.median(t for _, t in runs)
        met = "met" if first <= goal else "missed"
        lines.append(f"| {name} | {first:.2f} | {total:.2f} | "
                     f"{', '.join(f'{f:.2f} / {t:.2f}' for f, t in runs)} | "
                     f"{first / http:.2f} | <= {goal:g} s: {met} |" if http else
                     f"| {name} | {first:.2f} | {total:.2f} | | | <= {goal:g} s: {met} |")
    if rtf:
        lines += ["", "| profile (model.stream, one-shot, one run) | first audio (s) | all of it (s) "
                  "| chunk 0: frames, unmask (s) | steady-state RTF after chunk 0 |",
                  "|---|---|---|---|---|"]
        for profile, r in rtf:
            c0 = r["chunks"][0]
            lines.append(f"| {profile} | {r['ttfb_s']:.2f} | {r['total_s']:.2f} | {c0['frames']}, "
                         f"{c0['unmask_s']:.2f} | {r['steady_rtf']:.2f} |")
    return lines


def main() -> None:
    global ARGS
    from omnicore.apps.cli.serve import DOOR_PROFILE
    from omnicore.model.backend import PRECISIONS
    from omnicore.model.config import PROFILES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("OMNICORE_BENCH_MODEL",
                                                     str(ROOT / "weights" / "tiny-random")))
    p.add_argument("--profile", choices=PROFILES, default=DOOR_PROFILE,
                   help="every server's default profile, and the in-process stream's "
                        "(default: the doors' own, %(default)s)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, help="num_step for every door (default: the profile's; "
                                              "the stock classes need it)")
    p.add_argument("--no-stretch", dest="stretch", action="store_false",
                   help="leave out the stretch rows (STRETCH settings)")
    p.add_argument("--rtf-profiles", default=",".join(PROFILES),
                   help="profiles whose steady-state RTF after chunk 0 is measured, comma-"
                        "separated, or 'none' (default %(default)s)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="every server's --precision and the in-process model's (default fp32; "
                        "int8 and the rounded profiles are approximations)")
    p.add_argument("--markdown", help="also write the table here")
    p.add_argument("--first-reply", action="store_true",
                   help="only a new install's first reply through Wyoming: start-up on a fresh "
                        "voices folder, the first-ever request, the held-out texts' first audio, "
                        "start-up again (--reps runs each, no warm-up run)")
    p.add_argument("--start-timeout", type=float, default=3600,
                   help="--first-reply: seconds Wyoming may take to listen (default %(default)g)")
    ARGS = p.parse_args()
    ARGS.rtf_profiles = [] if ARGS.rtf_profiles == "none" else ARGS.rtf_profiles.split(",")
    bad = [x for x in ARGS.rtf_profiles if x not in PROFILES]
    if bad:
        p.error(f"--rtf-profiles: unknown profile(s) {', '.join(bad)}")
    settings = {"num_step": ARGS.steps} if ARGS.steps else {}
    flags = ((("--steps", ARGS.steps) if ARGS.steps else ()) + ("--profile", ARGS.profile)
             + ("--precision", ARGS.precision))
    if ARGS.first_reply:
        lines = first_reply(flags)
        print("\n".join(lines))
        if ARGS.markdown:
            Path(ARGS.markdown).write_text("\n".join(lines) + "\n")
        return
    voices = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-doors-{os.getpid()}"
    rows = []

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn("serve", "--model", ARGS.model, "--port", port, "--voices-dir", voices,
                 "--profile", ARGS.profile, "--precision", ARGS.precision)
    try:
        wait(proc, lambda: httpx.get(url + "/health", timeout=2).status_code == 200, "serve")
        doors = [("HTTP POST, pcm streamed (one-shot)", http_pcm, GOAL_S),
                 ("WebSocket (stream-input), streamed in", websocket, GOAL_S),
                 ("LiveKit adapter (WebSocket), streamed in", livekit_adapter, GOAL_S),
                 ("Pipecat adapter (WebSocket), streamed in", pipecat_adapter, GOAL_S)]
        if not ARGS.steps:
            doors += [("LiveKit stock OpenAI TTS (mp3 over SSE, one-shot)", livekit_stock,
                       LIVEKIT_TIMEOUT_S),
                      ("Pipecat stock OpenAITTSService (pcm, one-shot)", pipecat_stock, GOAL_S)]
        for name, door, goal in doors:
            rows.append((name, attempt(door, url, settings), goal))
        if ARGS.stretch:
            rows.append(("stretch: HTTP POST, pcm streamed", attempt(
                http_pcm, url, {**settings, **STRETCH}), STRETCH_GOAL_S))
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
        rows.append(("Wyoming synthesize (one-shot)", attempt(wyoming, port, False), GOAL_S))
        rows.append(("Wyoming synthesize-chunk (streamed in)", attempt(wyoming, port, True), GOAL_S))
        for name, text in HELD_OUT.items():
            rows.append((f"Wyoming one-shot, {name}", attempt(wyoming, port, False, text), GOAL_S))
            rows.append((f"Wyoming streamed in, {name}", attempt(wyoming, port, True, text),
                         GOAL_S))
    finally:
        stop(proc)
    rows.append(("MCP speak (stdio; the whole file)", attempt(
        mcp_speak, ARGS.model, ("--voices-dir", str(voices), *map(str, flags))), MCP_TIMEOUT_S))
    # Last: no server holds a model while this process does.
    floor_rows, rtf = floor(ARGS.model, settings)
    rows = floor_rows + rows

    lines = table(rows, rtf)
    print("\n".join(lines))
    if ARGS.markdown:
        Path(ARGS.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
