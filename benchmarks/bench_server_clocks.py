#!/usr/bin/env python3
"""The send clock of `omnicore serve` under load: N clients ask for endless streamed PCM and
never read (a 4 KiB receive buffer each), while the server's queue holds exactly N requests.

    python3 benchmarks/bench_server_clocks.py [--model DIR] [--clients 16] [--send-timeout 10]
                                              [--steps 8] [--timeout 600] [--door wyoming]

--door wyoming: the same stalled clients against `omnicore wyoming` (each sends one long
`synthesize`); the normal request is HTTP's only.

--model defaults to $OMNICORE_BENCH_MODEL, else weights/tiny-random. Per stalled client, from
the server end of its connection as `ss -tin` shows it (Linux, iproute2; sampled every 50 ms):
when the client last acknowledged a byte (its kernel still takes a few after the application
stopped reading, as it compacts its receive queue), when the server's send queue stopped
growing (the buffers are full), the most it held, and when the connection was cut. The cut's
lateness is the cut's time minus either moment minus the send timeout. Meanwhile a normal
request is tried every 100 ms, on a thread of its own (its answer takes seconds, which would
hold up the sampling and make the cuts meanwhile look late): how long it was refused (429) after
the last client was admitted, and its time to the whole answer once admitted. The table goes to
stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import ROOT, start  # noqa: E402

TEXT = " ".join(f"Sentence {i} of a story that never ends." for i in range(60))


def server_ends(port: int) -> dict[int, tuple[int, int]]:
    """{client port: (bytes the kernel holds for it, bytes it acknowledged)} for the server end
    of each established connection to `port`."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    ends = {}
    for head, info in re.findall(r"^\s*(\d+\s+\d+\s+\S+\s+\S+)\s*\n(.*?)(?=^\s*\d+\s+\d+\s|\Z)",
                                 out, re.M | re.S):
        _, send_q, _, peer = head.split()
        acked = re.search(r"bytes_acked:(\d+)", info)
        ends[int(peer.rsplit(":", 1)[1])] = (int(send_q), int(acked[1]) if acked else 0)
    return ends


def stalled_reader(url: str, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    if body.startswith(b'{"type"'):  # a Wyoming event
        sock.sendall(body + b"\n")
    else:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: b\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def start_wyoming(model: str, voices: Path, *extra) -> tuple[subprocess.Popen, str]:
    """`omnicore wyoming` on a free port, once it answers describe: (process, its address as
    http://HOST:PORT, for the helpers above)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "omnicore", "wyoming", "--model", model,
                             "--uri", f"tcp://127.0.0.1:{port}", "--voices-dir", str(voices),
                             "--voice", "", "-q", *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
                c.sendall(b'{"type": "describe"}\n')
                if b'"info"' in c.recv(256):
                    return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("server did not start")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("OMNICORE_BENCH_MODEL",
                                                     str(ROOT / "weights" / "tiny-random")))
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--send-timeout", type=float, default=10.0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--door", choices=("http", "wyoming"), default="http")
    args = p.parse_args()
    wyoming = args.door == "wyoming"
    if shutil.which("ss") is None:
        raise SystemExit("needs Linux's ss (iproute2)")
    voices = Path(tempfile.mkdtemp(prefix="bench-clocks-"))
    flags = ("--max-queue", str(args.clients), "--send-timeout", str(args.send_timeout),
             "--idle-timeout", str(10 * args.timeout))
    if wyoming:
        proc, url = start_wyoming(args.model, voices, *flags, "--steps", str(args.steps))
        body = json.dumps({"type": "synthesize", "data": {"text": TEXT}}).encode()
    else:
        proc, url = start(args.model, voices, *flags)
        body = json.dumps({"input": TEXT, "response_format": "pcm", "stream_format": "audio",
                           "num_step": args.steps, "position_temperature": 0.0}).encode()
    port = int(url.rsplit(":", 1)[1])
    normal = {"input": "Hello there.", "response_format": "wav", "num_step": args.steps}
    readers = []
    try:
        t0 = time.monotonic()
        readers = [stalled_reader(url, body) for _ in range(args.clients)]
        ports = [r.getsockname()[1] for r in readers]
        while (not set(ports) <= set(server_ends(port)) if wyoming  # no /health: connected
               else httpx.get(url + "/health").json()["in_flight"] < args.clients):
            time.sleep(0.02)
        admitted_all = time.monotonic() - t0
        last = {p: (0, 0.0) for p in ports}  # (queue, when it last grew)
        acked = {p: (-1, 0.0) for p in ports}  # (bytes acknowledged, when that last changed)
        peak, cut = dict.fromkeys(ports, 0), {}
        normal_result = {}

        def try_normal():
            while time.monotonic() - t0 < args.timeout:
                t = time.monotonic()
                r = httpx.post(url + "/v1/audio/speech", json=normal, timeout=args.timeout)
                if r.status_code == 200:
                    normal_result.update(refused=t - t0 - admitted_all,
                                         answered=time.monotonic() - t)
                    return
                time.sleep(0.1)
        if wyoming:
            normal_result["answered"] = None  # the normal request is HTTP's
        else:
            threading.Thread(target=try_normal, daemon=True).start()
        while len(cut) < len(ports) or not normal_result:
            now = time.monotonic() - t0
            if now > args.timeout:
                break
            ends = server_ends(port)
            for p in ports:
                if p in cut:
                    continue
                if p not in ends:
                    cut[p] = now
                    continue
                q, a = ends[p]
                peak[p] = max(peak[p], q)
                if q > last[p][0]:
                    last[p] = (q, now)
                if a != acked[p][0]:
                    acked[p] = (a, now)
            time.sleep(0.05)
    finally:
        for r in readers:
            r.close()
        proc.terminate()
        proc.wait(30)
    late = {what: sorted(cut[p] - when[p][1] - args.send_timeout for p in cut)
            for what, when in (("the client's last acknowledgement", acked),
                               ("the buffers filled", last))}
    load = os.getloadavg()
    print(f"{args.door}: {args.clients} stalled clients, --send-timeout {args.send_timeout:g} s, "
          f"{args.steps} steps, model {Path(args.model).name}; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end\n")
    print("| measure | value |\n|---|---|")
    print(f"| clients cut | {len(cut)} of {args.clients} |")
    for what, xs in late.items():
        if xs:
            print(f"| cut after {what}, beyond the timeout: min / median / max | "
                  f"{xs[0]:+.2f} / {xs[len(xs) // 2]:+.2f} / {xs[-1]:+.2f} s |")
    print(f"| most bytes the kernel held for one client | {max(peak.values()):,} |")
    print(f"| all clients admitted after | {admitted_all:.2f} s |")
    if normal_result.get("answered") is not None:
        print(f"| a normal request refused (429) after that for | "
              f"{normal_result['refused']:.2f} s |")
        print(f"| then answered (whole wav) in | {normal_result['answered']:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
