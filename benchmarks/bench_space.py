"""The Space a visitor waits for: the demo started as a Space starts it, timed through its API.

    python3 benchmarks/bench_space.py --model checkpoints/full               # the demo, per preset
    python3 benchmarks/bench_space.py --model weights/tiny-random --quick     # a smoke run
    python3 benchmarks/bench_space.py first-chunk --model weights/tiny-random # chunk 0's length

`demo` (the default): builds the Space with tools/build_space.py into a temporary folder and starts
`python app.py --model MODEL` there (the app times the model, picks its preset, makes its
examples; the run waits until that is done), then calls `/auto` with gradio_client as a visitor
would: once with every setting at its default, then once per speed preset (its steps, the rest
at the defaults). For each call: the time to the first audio (the first streamed piece's
playlist reaching the client; for a run in one piece, the result) and to the whole result, next
to the estimate the page showed before the run (read from the call's timings). Prints a
Markdown table; `--markdown FILE` writes it too, with the machine's load average before and
after.

`first-chunk`: how short chunk 0 of a stream can be before the later chunks get worse in a way
measurable on random weights. For each ChunkRule.first_seconds it streams a few paragraphs (auto
voice, greedy, fixed seed) and compares every later chunk's codes with the same paragraph made
in one pass by `generate_codes` (the chunk's span in proportion to its frames); "null" is the
same comparison against another paragraph's pass: agreement above it is what the voice carried
over from chunk 0 buys. Figures: benchmarks/README.md, "bench_space.py".
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "demo"))

import presets  # noqa: E402  (demo/presets.py)

TEXT = "Hello! This is OmniVoice running on numpy. It speaks more than six hundred languages."
PARAGRAPHS = [
    "Well, the kettle clicked off, just as the rain started drumming on the window. Please leave "
    "the parcel with the neighbour at number twelve. Our train was delayed by forty minutes, so "
    "we bought coffee.",
    "Oh, she laughed, put down her pencil, and said the answer had been obvious. Is it going to "
    "snow tomorrow, or will the roads stay clear? The quick brown fox doesn't jump over the lazy "
    "dog any more.",
    "Hello! This is OmniVoice running on numpy. It speaks more than six hundred languages. Nice "
    "to meet you, how are you today?",
    "Right. So, the meeting moved to Thursday, because half the team is away. Bring the slides, "
    "the budget, and your questions. We will start at nine sharp.",
    "Good evening. Here is tonight's forecast: clouds in the north, sun in the south. Tomorrow "
    "the wind turns west and brings some rain by noon.",
    "Yes, of course, I remember that summer by the lake. We swam every morning and read every "
    "afternoon. Those were the quietest weeks of my life.",
    "First, preheat the oven to two hundred degrees. Then mix the flour, the butter and the "
    "sugar. Bake it for twenty minutes, until golden.",
    "Listen, I know it's late, but this matters. The bridge is closed, so take the long road "
    "through the valley. Call me when you get there.",
]


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------------------
# demo: the Space, called through its API
# ------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_space(model: str, folder: Path, log_path: Path, timeout_s: float):
    """Build the Space into `folder` and start its app as a Space does; returns (process, URL,
    seconds until it served with its examples made, the app's start-up lines)."""
    subprocess.run([sys.executable, str(ROOT / "tools" / "build_space.py"), str(folder)],
                   check=True, capture_output=True)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMNICORE_MODEL")}
    env.update(GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "app.py", "--model", str(Path(model).resolve()),
                             "--host", "127.0.0.1", "--port", str(port)],
                            cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:  # served, and the examples made (gradio prints this line after them)
        text = log_path.read_text(errors="replace")
        if proc.poll() is not None:
            raise SystemExit(f"the Space exited with {proc.returncode}:\n{text[-3000:]}")
        if "To create a public link" in text:
            try:
                urllib.request.urlopen(url + "/gradio_api/info", timeout=5).close()
                break
            except OSError:
                pass
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            raise SystemExit(f"the Space did not start in {timeout_s:.0f} s:\n{text[-3000:]}")
        time.sleep(0.5)
    lines = [ln for ln in text.splitlines() if ln.startswith(("measured", "timing", "loading"))]
    return proc, url, time.monotonic() - t0, lines


def _peak_rss(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "n/a"
    kb = _number(r"VmHWM:\s+(\d+) kB", status)
    return "n/a" if kb is None else f"{kb / 2**20:.2f} GiB"


def _number(pattern: str, text: str) -> float | None:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else None


def call(client, **kwargs) -> dict:
    """One /auto call: client-side seconds to the first audio and to the result, and the
    estimate and server-side times from its timings."""
    t0 = time.monotonic()
    job = client.submit(text=TEXT, api_name="/auto", **kwargs)
    first = None
    for update in job:  # one update per streamed piece, then the result
        if first is None and isinstance(update[4], str):  # the stream's playlist: audio to play
            first = time.monotonic() - t0
    out = job.result()
    total = time.monotonic() - t0
    timings = out[3]
    streamed = "**Streamed**" in timings
    return {
        "streamed": streamed,
        "first_s": first if streamed else total,
        "total_s": total,
        "est_first_s": _number(r"Estimated before the run: first audio after ([\d.]+) s", timings)
        if streamed else _number(r"Estimated before the run: ([\d.]+) s", timings),
        "est_total_s": _number(r"all of it after ([\d.]+) s", timings) if streamed
        else _number(r"Estimated before the run: ([\d.]+) s", timings),
        "server_first_s": _number(r"first audio after \*\*([\d.]+) s", timings) if streamed
        else _number(r"it took ([\d.]+) s", timings),
        "server_total_s": _number(r"of audio in ([\d.]+) s", timings) if streamed
        else _number(r"it took ([\d.]+) s", timings),
    }


def bench_demo(args) -> str:
    from gradio_client import Client

    load_before = _load()
    work = Path(tempfile.mkdtemp(prefix="bench-space-"))
    try:
        proc, url, started_s, lines = start_space(args.model, work / "space", work / "space.log",
                                                  args.timeout)
        try:
            client = Client(url, verbose=False)
            defaults = {p["parameter_name"]: p["parameter_default"] for p in client.view_api(
                return_format="dict", print_info=False)["named_endpoints"]["/auto"]["parameters"]}
            steps = defaults["num_step"]
            rows = [("defaults", steps, call(client, seed=args.seed))]
            names = ["Fast"] if args.quick else list(presets.PRESETS)
            for name in names:
                n = presets.PRESETS[name]
                rows.append((name, n, call(client, seed=args.seed, num_step=n)))
            if not args.quick:
                rows.append((f"{presets.preset_of(steps)}, one piece", steps,
                             call(client, seed=args.seed, stream=False)))
            peak = _peak_rss(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def s(x):
        return "n/a" if x is None else f"{x:.1f}"

    out = [f"Model `{args.model}`; text: \"{TEXT}\"; load average (1/5/15 min) before "
           f"{load_before}, after {_load()}. Start-up (load, timing, examples) "
           f"{started_s:.0f} s: {'; '.join(lines)}. Defaults: {defaults['num_step']} steps, "
           f"stream={defaults['stream']}. Peak RSS of the app: {peak}.", "",
           "| call | steps | first audio (client) | estimate | all of it (client) | estimate | "
           "server: first / all |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, steps, r in rows:
        out.append(f"| {name} | {steps} | **{s(r['first_s'])} s** | {s(r['est_first_s'])} s "
                   f"| {s(r['total_s'])} s | {s(r['est_total_s'])} s | "
                   f"{s(r['server_first_s'])} / {s(r['server_total_s'])} s |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# first-chunk: chunk 0's length against the later chunks' agreement with one pass
# ------------------------------------------------------------------------------------------------


def _spans(stats, frames: int):
    """(k, codes [C, T_k], the one-pass frame under each of its frames) per chunk: chunk k's
    share of the pass in proportion to its frames."""
    total, offset = sum(x["frames"] for x in stats), 0
    for k, x in enumerate(stats):
        n = x["frames"]
        a, b = round(offset * frames / total), round((offset + n) * frames / total)
        yield k, x["codes"], np.clip(a + (np.arange(n) * max(b - a, 1)) // n, 0, frames - 1)
        offset += n


def bench_first_chunk(args) -> str:
    from omnicore import OmniVoice
    from omnicore.text.planner import ChunkRule

    model = OmniVoice.from_pretrained(args.model)
    greedy = dict(num_step=args.steps, position_temperature=0.0, seed=args.seed)
    texts = PARAGRAPHS[:2] if args.quick else PARAGRAPHS
    one_pass = [model.generate_codes(t, **greedy)[0] for t in texts]  # [C, T] each
    out = [f"Model `{args.model}`, {len(texts)} paragraphs, {args.steps} steps, greedy, seed "
           f"{args.seed}; agreement = share of equal codes, ± one standard error.", "",
           "| first_seconds | chunk 0 (mean / min) | later chunks | agreement with one pass | "
           "null (another paragraph) | above null |", "|---:|---|---:|---:|---:|---:|"]
    for first_s in args.first_seconds:
        rule = ChunkRule(first_seconds=first_s, first_max_seconds=max(6.0, first_s))
        agree, null, chunk0 = [], [], []
        for i, text in enumerate(texts):
            with model.stream(text, rule=rule, **greedy) as stream:
                for _ in stream:
                    pass
                stats = stream.chunk_stats
            chunk0.append(stats[0]["frames"] / model.frame_rate)
            other = one_pass[(i + 1) % len(texts)]
            for k, codes, idx in _spans(stats, one_pass[i].shape[1]):
                if k:
                    agree.append((codes == one_pass[i][:, idx]).mean())
                    far = np.clip(idx * other.shape[1] // one_pass[i].shape[1], 0,
                                  other.shape[1] - 1)
                    null.append((codes == other[:, far]).mean())
        a, n = np.array(agree), np.array(null)

        def se(x):
            return x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else float("nan")

        out.append(f"| {first_s:g} | {np.mean(chunk0):.2f} / {min(chunk0):.2f} s | {len(a)} | "
                   f"{100 * a.mean():.2f} ± {100 * se(a):.2f} % | {100 * n.mean():.2f} ± "
                   f"{100 * se(n):.2f} % | {100 * (a.mean() - n.mean()):.2f} pts |")
        print(out[-1], flush=True)
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", choices=("demo", "first-chunk"), default="demo")
    p.add_argument("--model", default=str(ROOT / "checkpoints" / "full"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=16, help="first-chunk: unmasking steps")
    p.add_argument("--first-seconds", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0, 3.0],
                   help="first-chunk: the ChunkRule.first_seconds values to compare")
    p.add_argument("--quick", action="store_true", help="fewer calls / paragraphs")
    p.add_argument("--timeout", type=float, default=1800, help="demo: start-up limit, seconds")
    p.add_argument("--markdown", help="also write the table to this file")
    args = p.parse_args(argv)
    table = bench_demo(args) if args.what == "demo" else bench_first_chunk(args)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
