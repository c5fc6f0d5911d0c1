#!/usr/bin/env python3
"""`omnicore serve` under N concurrent clients on loopback: the engine (every admitted request
packed into shared forwards) vs the same server limited to one request at a time; then voice
agents on the WebSocket, feeding the text word by word as an LLM writes it.

    python3 benchmarks/bench_server.py [--model DIR] [--clients 4] [--requests 2] [--steps 8]
                                       [--word-interval 0.05] [--timeout 300] [--markdown FILE]

--model defaults to $OMNICORE_BENCH_MODEL, else weights/tiny-random. Each client sends its
requests one after another as streamed 16-bit PCM (`stream_format: audio`), greedy settings and
a fixed duration, so both servers do the same work. Per request: time to first byte (TTFB) and
latency (last byte), both from the request's start, so waiting for the one slot counts; per
run: throughput in audio seconds per wall second, and from the server's /metrics the engine
iterations it ran and the tokens it packed per iteration. On the WebSocket
(/v1/audio/speech/stream-input, engine server only) each client sends the same text one word
per --word-interval seconds, then closes: the time from its first fragment to its first audio
frame is what an agent's user waits. Bounded: at most 64 clients, and a run stops waiting
after --timeout seconds (its unfinished requests are counted, not timed).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
MAX_CLIENTS = 64
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs into the quiet forest."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, voices: Path, *extra) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "omnicore", "serve", "--model", model,
                             "--port", str(port), "--voices-dir", str(voices), "-q", *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("server did not start")


def one(url: str, body: dict, timeout: float) -> tuple[float, float, float]:
    """(ttfb, latency, audio seconds) of one streamed request."""
    t0 = time.perf_counter()
    ttfb, n = None, 0
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=timeout) as r:
        r.raise_for_status()
        for part in r.iter_bytes():
            if ttfb is None and part:
                ttfb = time.perf_counter() - t0
            n += len(part)
    return ttfb or 0.0, time.perf_counter() - t0, n / 2 / 24000


def one_socket(url: str, fields: dict, interval: float, timeout: float) -> tuple[float, float]:
    """(first fragment -> first audio, first fragment -> audio.done) of one utterance written
    one word per `interval` seconds (by a writer thread) over the WebSocket."""
    import json

    from websockets.sync.client import connect

    words = TEXT.split(" ")
    with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream-input",
                 open_timeout=timeout, close_timeout=5) as ws:
        ws.send(json.dumps(fields))
        t0 = time.perf_counter()

        def write():
            for i, word in enumerate(words):
                ws.send(json.dumps({"text": word if i + 1 == len(words) else word + " "}))
                time.sleep(interval)
            ws.send(json.dumps({"close": True}))
        threading.Thread(target=write, daemon=True).start()
        first = None
        while True:
            m = ws.recv(timeout=max(0.01, t0 + timeout - time.perf_counter()))
            if isinstance(m, bytes):
                first = time.perf_counter() - t0 if first is None else first
            elif (event := json.loads(m))["type"] == "audio.done":
                return (first if first is not None else float("nan")), time.perf_counter() - t0
            else:
                raise RuntimeError(event["error"]["message"])


def socket_run(url: str, clients: int, steps: int, interval: float, timeout: float) -> dict:
    """`clients` agents at once, one utterance each (greedy, `steps` steps)."""
    fields = {"response_format": "pcm", "num_step": steps, "position_temperature": 0.0}
    results, errors = in_parallel(clients, 1, lambda left: one_socket(url, fields, interval, left),
                                  time.perf_counter() + timeout)
    res = np.array(results) if results else np.zeros((0, 2))
    pct = (lambda col, q: float(np.percentile(res[:, col], q)) if len(res) else float("nan"))
    return {"utterances": len(res), "errors": len(errors), "p50_first_audio": pct(0, 50),
            "p95_first_audio": pct(0, 95), "p50_done": pct(1, 50), "p95_done": pct(1, 95)}


def in_parallel(clients: int, calls: int, work, deadline: float) -> tuple[list, list]:
    """`clients` threads, each calling work(seconds left) up to `calls` times one after another
    until `deadline`: (results, errors as reprs) of the calls that ended by then."""
    results, errors = [], []

    def client():
        for _ in range(calls):
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            try:
                results.append(work(left))
            except Exception as exc:  # noqa: BLE001 - counted, not fatal
                errors.append(repr(exc))
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    return list(results), list(errors)  # copies: late threads may still append


def engine_counts(url: str) -> tuple[float, float]:
    """(iterations, tokens packed) the server's engine has run so far, from /metrics."""
    got = {smp.name: smp.value
           for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text)
           for smp in fam.samples if not smp.labels}
    return (got["omnicore_engine_tokens_per_iteration_count"],
            got["omnicore_engine_tokens_per_iteration_sum"])


def run(url: str, clients: int, requests: int, steps: int, timeout: float) -> dict:
    body = {"input": TEXT, "voice": None, "response_format": "pcm", "stream_format": "audio",
            "num_step": steps, "position_temperature": 0.0, "duration": 4.0}
    one(url, dict(body, num_step=1), timeout)  # warm-up: compile and load outside the timing
    iterations0, tokens0 = engine_counts(url)
    t0 = time.perf_counter()
    results, errors = in_parallel(clients, requests, lambda left: one(url, body, left),
                                  t0 + timeout)
    wall = time.perf_counter() - t0
    iterations1, tokens1 = engine_counts(url)
    res = np.array(results) if results else np.zeros((0, 3))
    pct = (lambda col, q: float(np.percentile(res[:, col], q)) if len(res) else float("nan"))
    iterations = iterations1 - iterations0
    return {"requests": len(results), "errors": len(errors),
            "unfinished": clients * requests - len(results) - len(errors), "wall_s": wall,
            "throughput": float(res[:, 2].sum() / wall) if len(res) else 0.0,
            "p50_latency": pct(1, 50), "p95_latency": pct(1, 95),
            "p50_ttfb": pct(0, 50), "p95_ttfb": pct(0, 95), "iterations": int(iterations),
            "tokens_per_iteration": (tokens1 - tokens0) / iterations if iterations else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("OMNICORE_BENCH_MODEL",
                                                      str(ROOT / "weights" / "tiny-random")))
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--word-interval", type=float, default=0.05,
                    help="seconds between the WebSocket's word fragments (default %(default)s: "
                         "an LLM writing ~20 words a second)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds each server's run may take (default %(default)s)")
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    if not 1 <= args.clients <= MAX_CLIENTS or args.requests < 1 or args.steps < 1:
        ap.error(f"--clients must be 1..{MAX_CLIENTS}; --requests and --steps at least 1")
    if not 0 <= args.word_interval <= 5:
        ap.error("--word-interval must be 0..5 seconds")
    import tempfile

    rows, socket_row = [], None
    for name, extra in (("engine (all admitted packed)", ()),
                        ("one at a time (--max-concurrency 1)", ("--max-concurrency", "1"))):
        with tempfile.TemporaryDirectory() as voices:
            proc, url = start(args.model, Path(voices), "--max-queue", str(args.clients + 1), *extra)
            try:
                r = run(url, args.clients, args.requests, args.steps, args.timeout)
                if socket_row is None:
                    socket_row = socket_run(url, args.clients, args.steps, args.word_interval,
                                            args.timeout)
                    print("socket", socket_row, file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(30)
        rows.append((name, r))
        print(name, r, file=sys.stderr)
    lines = [f"{args.clients} clients x {args.requests} requests, {args.steps} steps, 4 s each, "
             f"model {Path(args.model).name}", "",
             "| server | requests (errors, unfinished) | throughput (audio s / s) | "
             "p50 / p95 latency (s) | p50 / p95 TTFB (s) | engine iterations | tokens / iteration |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {r['requests']} ({r['errors']}, {r['unfinished']}) | "
                     f"{r['throughput']:.2f} | {r['p50_latency']:.2f} / {r['p95_latency']:.2f} | "
                     f"{r['p50_ttfb']:.2f} / {r['p95_ttfb']:.2f} | {r['iterations']} | "
                     f"{r['tokens_per_iteration']:.0f} |")
    s = socket_row
    lines += ["", f"WebSocket, engine server: {args.clients} agents at once, one word every "
              f"{args.word_interval:g} s ({len(TEXT.split())} words), then close", "",
              "| utterances (errors) | p50 / p95 first fragment -> first audio (s) | "
              "p50 / p95 first fragment -> done (s) |", "|---|---|---|",
              f"| {s['utterances']} ({s['errors']}) | {s['p50_first_audio']:.2f} / "
              f"{s['p95_first_audio']:.2f} | {s['p50_done']:.2f} / {s['p95_done']:.2f} |"]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
