#!/usr/bin/env python3
"""`omnicore serve --ray` on one machine: first audio against the single server, autoscaling
under a burst, and replicas SIGKILLed mid-stream.

    python3 benchmarks/bench_ray_serve.py [--model DIR] [--parts P,...] [--runs 5] [--rounds 1]
        [--replicas 1] [--cpus-per-replica K] [--steps 8] [--paired N] [--kills 10]
        [--markdown FILE] [--json FILE]

--model defaults to weights/tiny-random (the tiny checkpoint: Ray's own costs show, the model's
hardly). Needs the `server` and `ray` extras (and `openai`). Each part starts its own server as a
child process on a fresh voices folder, and stops it (and the local Ray it started) after: one
model in memory at a time (the bench itself loads none), so a full-size run holds one 2.4 GiB
process at a time.

  first byte   `omnicore serve` with K threads (--cpus-per-replica; default all cores) against
               `omnicore serve --ray --replicas R --cpus-per-replica K` (default 1 replica),
               one after the other, --rounds times (the order alternating); each takes one
               warm-up request, then --runs times the same streamed OpenAI request: the SDK's
               `audio.speech.with_streaming_response.create` (pcm, a designed library voice,
               --steps steps, seeded), timed to its first audio byte. Reported: the medians,
               and Serve's over the single server's (the goal: within 10 %). With --paired N,
               both servers up at once and N pairs of that request, one to each in
               alternating order, the side not timed stopped (SIGSTOP, with every process it
               started): pairs seconds apart see the same machine; reported also pair by pair
  autoscale    `--autoscale 1:2`: 8 concurrent streams, then quiet; the replicas Serve runs,
               sampled each second from /metrics (omnicore_cluster_replica), and Serve's own
               controller log lines of the scaling decisions
  affinity     `--replicas 2`: 20 requests alternating two cloned voices; the replica each
               went to, and the cluster's voice lines of /metrics after
  faults       `--replicas 2`: --kills rounds of: a stream started, the replica serving it
               SIGKILLed at its first byte while a voice is cloned through the proxy; then,
               once the replacement replica is up, one more request. Per round: what the
               streaming client saw (whole audio, or an error it can tell), the clone's status,
               the request after the replacement's status. At the end every voice that got a
               2xx is listed through the proxy and loads.

The first byte at full size, Serve on one replica of both cores against the single server:

    python3 benchmarks/bench_ray_serve.py --model checkpoints/full --parts first_byte \
        --replicas 1 --cpus-per-replica 2 --rounds 2 --markdown fb.md --json fb.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LONG = " ".join(["This sentence is here to make the stream long."] * 8)


def start(model: str, voices: Path, port: int, *flags, log: Path, threads: int | None = None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if threads:  # as a replica of --cpus-per-replica K sets them (omnicore.apps.cluster)
        from omnicore.apps.cluster import actor_env

        env.update(actor_env(threads))
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "omnicore", "serve", "--model", model,
                                 "--profile", "exact", "--port", str(port), "--voices-dir",
                                 str(voices), *flags], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server is not up:\n{log.read_text()[-3000:]}")


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def house(model: str, folder: Path) -> None:
    """A designed library voice, "house", as the tests make it, in a child process (the model
    leaves memory with it)."""
    code = ("import sys\nfrom omnicore import OmniVoice\n"
            "m = OmniVoice.from_pretrained(sys.argv[1])\n"
            "m.synthesize('This is how the house sounds.', instruct='female, low pitch', seed=3,"
            " num_step=4)[0].as_voice().save(sys.argv[2])\n")
    subprocess.run([sys.executable, "-c", code, model, str(folder / "house.npz")], check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=1200)


def stream(url: str, text: str, seed: int, on_first=None) -> dict:
    """One pcm stream: ttfb, bytes, the replica (header) and how it ended."""
    import httpx

    t0 = time.perf_counter()
    got, ttfb, replica = 0, None, None
    try:
        with httpx.stream("POST", url + "/v1/audio/speech", timeout=300, json={
                "model": "tts-1", "voice": "house", "input": text, "response_format": "pcm",
                "num_step": 8, "seed": seed}) as r:
            replica = r.headers.get("x-omnicore-replica")
            if r.status_code != 200:
                return {"status": r.status_code, "ended": "refused", "bytes": 0}
            for piece in r.iter_bytes():
                if ttfb is None:
                    ttfb = time.perf_counter() - t0
                    if on_first is not None:
                        on_first(replica)
                got += len(piece)
        ended = "whole"
    except httpx.HTTPError as exc:
        ended = f"error ({type(exc).__name__})"
    return {"status": 200, "ended": ended, "bytes": got, "ttfb": ttfb, "replica": replica,
            "total": time.perf_counter() - t0}


def metric_replicas(url: str) -> dict:
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("omnicore_cluster_replica{"):
            labels = line[line.index("{") + 1:line.index("}")]
            fields = dict(kv.split("=") for kv in labels.split(","))
            out[fields["replica"].strip('"')] = int(fields["pid"].strip('"'))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def live_replicas(url: str) -> dict:
    return {r: p for r, p in metric_replicas(url).items() if alive(p)}


def sdk_first_byte(url: str, text: str, seed: int, steps: int) -> float:
    """One streamed OpenAI speech request through the SDK, as a client makes it: seconds to
    its first audio byte (the rest read, so the server is idle after)."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    t0 = time.perf_counter()
    first = None
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="house", input=text, response_format="pcm",
            extra_body={"num_step": steps, "seed": seed}) as r:
        for piece in r.iter_bytes():
            if piece and first is None:
                first = time.perf_counter() - t0
    client.close()
    if first is None:
        raise SystemExit(f"no audio from {url}")
    return first


def first_byte(model: str, tmp: Path, runs: int, rounds: int, replicas: int, cpus: int,
               steps: int, paired: int = 0) -> dict:
    """The single server with `cpus` threads against Serve with `replicas` of `cpus` each,
    one after the other, `rounds` times (the order alternating against drift); or, with
    `paired`, both up at once and `paired` pairs of requests, one to each in alternating
    order, the other side's every process stopped (SIGSTOP) while one is timed."""
    single = f"omnicore serve ({cpus} thread{'s' * (cpus > 1)})"
    ray = f"omnicore serve --ray --replicas {replicas} --cpus-per-replica {cpus}"
    layouts = {single: ((), cpus), ray: (("--ray", "--replicas", str(replicas),
                                          "--cpus-per-replica", str(cpus)), None)}
    times = (paired_first_byte(model, tmp, layouts, paired, steps) if paired
             else {name: [] for name in layouts})
    for k in range(0 if paired else rounds):
        for name in (list(layouts) if k % 2 == 0 else list(layouts)[::-1]):
            flags, threads = layouts[name]
            proc, url = start(model, tmp, free_port(), *flags, log=tmp / f"fb{k}-{len(flags)}.log",
                              threads=threads)
            try:
                sdk_first_byte(url, "Warm up.", 0, steps)
                got = [sdk_first_byte(url, "Hello, how can I help you today?", 1, steps)
                       for _ in range(runs)]
            finally:
                stop(proc)
            times[name] += got
            print(f"round {k + 1}, {name}: first byte {[round(t, 3) for t in got]}", flush=True)
    out = {name: {"median_s": statistics.median(t), "runs": t} for name, t in times.items()}
    ratio = out[ray]["median_s"] / out[single]["median_s"]
    out["serve_over_single"] = ratio
    if paired:
        pairs = [r / s for s, r in zip(times[single], times[ray])]
        out["pair_ratios"] = pairs
        print(f"pairs, Serve / single: median {statistics.median(pairs):.3f} "
              f"{[round(x, 3) for x in pairs]}", flush=True)
    print(f"first byte median: single {out[single]['median_s']:.3f} s, Serve "
          f"{out[ray]['median_s']:.3f} s: Serve / single = {ratio:.3f} "
          f"({'within' if ratio <= 1.10 else 'NOT within'} 10 %)", flush=True)
    return out


def hold(pid: int, stopped: bool) -> None:
    """Stop (or continue) a server and every process it started: for `--ray`, its local Ray
    (GCS, raylet, agents, the Serve actors and replicas), so none of it runs beside the other."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return
    for p in procs if stopped else procs[::-1]:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGSTOP if stopped else signal.SIGCONT)


def paired_first_byte(model: str, tmp: Path, layouts: dict, pairs: int, steps: int) -> dict:
    """Both servers loaded and warm, then `pairs` pairs of the same request, the order
    alternating; while one side is timed the other is stopped, and a side just continued
    gets 2 s to catch up on its timers (Ray's loops, health checks) before its request.
    Pairs taken seconds apart see the same machine, where rounds minutes apart did not."""
    servers = {}
    try:
        for name, (flags, threads) in layouts.items():
            servers[name] = start(model, tmp, free_port(), *flags,
                                  log=tmp / f"paired-{len(flags)}.log", threads=threads)
            sdk_first_byte(servers[name][1], "Warm up.", 0, steps)
        times = {name: [] for name in layouts}
        for k in range(pairs):
            for name in (list(layouts) if k % 2 == 0 else list(layouts)[::-1]):
                for other, (proc, _) in servers.items():
                    hold(proc.pid, other != name)
                time.sleep(2)
                times[name].append(sdk_first_byte(servers[name][1],
                                                  "Hello, how can I help you today?", 1, steps))
            print(f"pair {k + 1}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items()),
                  flush=True)
        return times
    finally:
        for proc, _ in servers.values():
            hold(proc.pid, False)
            stop(proc)


def autoscale(model: str, tmp: Path) -> dict:
    proc, url = start(model, tmp, free_port(), "--ray", "--autoscale", "1:2",
                      log=tmp / "autoscale.log")
    samples, t0 = [], time.monotonic()
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                samples.append((round(time.monotonic() - t0, 1), len(live_replicas(url))))
            except Exception:  # noqa: BLE001 - a sample missed
                pass
            time.sleep(1)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        time.sleep(3)
        burst = [None] * 8

        def one(i):
            burst[i] = stream(url, LONG, i)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        burst_end = round(time.monotonic() - t0, 1)
        while time.monotonic() - t0 < burst_end + 120:
            if samples and samples[-1][1] == 1 and samples[-1][0] > burst_end + 5:
                break
            time.sleep(2)
        time.sleep(2)
    finally:
        done.set()
        sampler.join()
        session = Path("/tmp/ray/session_latest/logs/serve")
        decisions = []
        for log in sorted(session.glob("controller_*.log")):
            decisions += [line.strip() for line in log.read_text(errors="replace").splitlines()
                          if "scaling" in line.lower() and "Speaker" in line]
        stop(proc)
    peak = max(n for _, n in samples)
    print(f"autoscale: peak {peak} replicas, samples {samples}", flush=True)
    print("\n".join(decisions), flush=True)
    return {"samples": samples, "burst_end_s": burst_end, "peak": peak,
            "final": samples[-1][1], "burst": burst, "serve_log": decisions}


def clip(pitch: float) -> bytes:
    import soundfile as sf

    t = np.arange(24000 * 2) / 24000
    rng = np.random.default_rng(int(pitch))
    wav = 0.2 * np.sin(2 * np.pi * pitch * t) * (1 + 0.5 * rng.standard_normal(t.size))
    buf = io.BytesIO()
    sf.write(buf, wav.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def faults(model: str, tmp: Path, kills: int) -> dict:
    import httpx

    proc, url = start(model, tmp, free_port(), "--ray", "--replicas", "2",
                      log=tmp / "faults.log")
    rows, made = [], []
    try:
        for k in range(kills):
            pids = live_replicas(url)
            clone = {}

            def kill(replica):
                def post():
                    try:
                        r = httpx.post(url + "/v1/voices", timeout=120, data={
                            "name": f"v{k}", "ref_text": "A short test clip."},
                            files={"audio": ("c.wav", clip(150 + 10 * k), "audio/wav")})
                        clone["status"] = r.status_code
                    except httpx.HTTPError as exc:
                        clone["status"] = type(exc).__name__
                poster = threading.Thread(target=post)
                poster.start()
                time.sleep(0.2)  # the clone in flight when the replica dies (if it landed there)
                os.kill(pids[replica], signal.SIGKILL)
                clone["thread"] = poster
            t_kill = time.monotonic()
            got = stream(url, LONG, k, on_first=kill)
            clone["thread"].join()
            if clone["status"] in (200, 201):
                made.append(f"v{k}")
            while len(live_replicas(url)) < 2 and time.monotonic() - t_kill < 180:
                time.sleep(1)
            back = round(time.monotonic() - t_kill, 1)
            after = httpx.post(url + "/v1/audio/speech", timeout=300, json={
                "model": "tts-1", "voice": "house", "input": "Still here.",
                "response_format": "pcm", "num_step": 4, "seed": 1}).status_code
            rows.append({"round": k + 1, "stream": got["ended"], "stream_bytes": got["bytes"],
                         "clone": clone["status"], "replacement_up_s": back, "after": after})
            print(rows[-1], flush=True)
        listed = {v["id"] for v in httpx.get(url + "/v1/voices", timeout=60).json()["data"]}
        loads = {v: httpx.get(f"{url}/v1/voices/{v}", timeout=60).status_code for v in made}
    finally:
        stop(proc)
    return {"rows": rows, "made": made, "listed": sorted(listed & set(made)), "loads": loads}


def affinity(model: str, tmp: Path) -> dict:
    """20 requests alternating two cloned voices on 2 replicas: where each went, and the
    cluster's voice lines of /metrics after."""
    import httpx

    proc, url = start(model, tmp, free_port(), "--ray", "--replicas", "2",
                      log=tmp / "affinity.log")
    try:
        for name, pitch in (("ann", 150.0), ("bob", 220.0)):
            r = httpx.post(url + "/v1/voices", timeout=120, data={
                "name": name, "ref_text": "A short test clip."},
                files={"audio": ("c.wav", clip(pitch), "audio/wav")})
            assert r.status_code in (200, 201), r.text
        served = []
        for i in range(20):
            voice = ("ann", "bob")[i % 2]
            r = httpx.post(url + "/v1/audio/speech", timeout=300, json={
                "model": "tts-1", "voice": voice, "input": f"Number {i}.",
                "response_format": "pcm", "num_step": 2, "seed": i})
            served.append((voice, r.headers.get("x-omnicore-replica"), r.status_code))
        lines = [line for line in httpx.get(url + "/metrics", timeout=30).text.splitlines()
                 if line.startswith(("omnicore_cluster_voice", "omnicore_voice_prompts"))]
    finally:
        stop(proc)
    print("\n".join(map(str, served)), "\n".join(lines), sep="\n", flush=True)
    return {"served": served, "metrics": lines}


def markdown(res: dict) -> str:
    """The parts that ran, as the benchmarks README shows them."""
    out = [f"Model {res['model']}; load average at the start {res['load']}, at the end "
           f"{res['load_end']}", ""]
    if "first_byte" in res:
        fb = dict(res["first_byte"])
        ratio = fb.pop("serve_over_single")
        pairs = fb.pop("pair_ratios", None)
        out += ["| server | first byte, median (s) | runs (s) |", "|---|---:|---|"]
        out += [f"| {k} | {v['median_s']:.3f} | {', '.join(f'{x:.3f}' for x in v['runs'])} |"
                for k, v in fb.items()]
        out += ["", f"Serve / single server, medians: {ratio:.3f}"]
        if pairs:
            out += [f"Serve / single server, pair by pair: median {statistics.median(pairs):.3f} "
                    f"({', '.join(f'{x:.3f}' for x in pairs)})"]
    if "autoscale" in res:
        a = res["autoscale"]
        out += ["", f"Autoscale 1:2: peak {a['peak']} replicas, {a['final']} at the end; burst "
                    f"ended at {a['burst_end_s']} s; samples (s, replicas): {a['samples']}", ""]
        out += ["    " + line for line in a["serve_log"]]
    if "affinity" in res:
        out += ["", *map(str, res["affinity"]["served"]), ""]
        out += ["    " + line for line in res["affinity"]["metrics"]]
    if "faults" in res:
        f = res["faults"]
        out += ["", "| round | stream | bytes | clone | replacement up (s) | request after |",
                "|---:|---|---:|---|---:|---:|"]
        out += [f"| {r['round']} | {r['stream']} | {r['stream_bytes']} | {r['clone']} | "
                f"{r['replacement_up_s']} | {r['after']} |" for r in f["rows"]]
        out += ["", f"Voices cloned with a 2xx: {len(f['made'])}; listed afterwards: "
                    f"{len(f['listed'])}; each loads: {sorted(set(f['loads'].values()))}"]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "weights" / "tiny-random"))
    ap.add_argument("--runs", type=int, default=5, help="first byte: requests per server")
    ap.add_argument("--rounds", type=int, default=1,
                    help="first byte: each server started this many times, in turn")
    ap.add_argument("--replicas", type=int, default=1, help="first byte: Serve's replicas")
    ap.add_argument("--cpus-per-replica", type=int, default=os.cpu_count(),
                    help="first byte: a replica's CPUs and the single server's threads")
    ap.add_argument("--steps", type=int, default=8, help="first byte: the request's num_step")
    ap.add_argument("--paired", type=int, default=0,
                    help="first byte: both servers up, this many pairs of requests, the side "
                         "not timed stopped (instead of --rounds)")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--parts", default="first_byte,autoscale,affinity,faults")
    ap.add_argument("--work", help="keep the servers' logs and voices in this folder "
                                   "(default: a temporary one)")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {"load": os.getloadavg(), "model": args.model}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.work or d)
        tmp.mkdir(parents=True, exist_ok=True)
        house(args.model, tmp)
        parts = args.parts.split(",")
        if "first_byte" in parts:
            res["first_byte"] = first_byte(args.model, tmp, args.runs, args.rounds,
                                           args.replicas, args.cpus_per_replica, args.steps,
                                           args.paired)
        if "autoscale" in parts:
            res["autoscale"] = autoscale(args.model, tmp)
        if "affinity" in parts:
            res["affinity"] = affinity(args.model, tmp)
        if "faults" in parts:
            res["faults"] = faults(args.model, tmp, args.kills)
    res["load_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    if args.markdown:
        Path(args.markdown).write_text(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
