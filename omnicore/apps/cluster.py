"""`omnicore batch --ray`: the batch's jobs on Ray actors, resumable and fault-tolerant.

    driver (this process)                                 Ray actors (`Worker`, one model each)
      cli.batch.parse_jobs: good lines -> items, bad     load the model once, keep it
        lines -> failed records                            synthesize(item), up to IN_FLIGHT at
      resume: skip ids with an ok manifest line and          once (threads), so their passes pack
        their complete output file                           in the actor's engine
      _Queue: items grouped by voice prompt; a worker      a voice prompt (ref_audio + ref_text) is
        keeps taking from its voice group                    encoded once per actor, then reused
      keep IN_FLIGHT calls per live actor; each result     write OUT_DIR/<id>.wav atomically
        -> one manifest line (the driver is its only         (writers.write_audio_atomic), return
        writer), progress on stderr                          the record
      actor death -> its in-flight items go back to the
        queue (at most MAX_ATTEMPTS tries each), a new
        actor replaces it (at most MAX_RESTARTS per slot)

Ray is imported only here, and only when a batch runs with --ray (the `ray` extra).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import errors
from ..errors import ConfigError, InputError, OmniCoreError

MANIFEST = "manifest.jsonl"
IN_FLIGHT = 4       # items one actor runs at once (as the local batch's BATCH_IN_FLIGHT)
MAX_ATTEMPTS = 3    # tries of one item on workers that die under it, then it is reported failed
MAX_RESTARTS = 5    # replacements of one worker slot before it is given up
PROMPT_CACHE = 64   # voice prompts an actor keeps (least recently used dropped first)
INSTALL = "pip install 'omnicore[ray]'"


def import_ray():
    """The `ray` module, or ConfigError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"--ray needs Ray, which is not installed ({exc}); install the extra: "
                          f"{INSTALL}") from None
    return ray


def _peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux and macOS report it in different units)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# ---------------------------------------------------------------------------------------------
# The actor
# ---------------------------------------------------------------------------------------------


class Worker:
    """One model on one Ray actor (run as `ray.remote(Worker)`, with max_concurrency IN_FLIGHT:
    its calls run on threads and share the model's engine, which packs their passes).

    A model that cannot be loaded (a typed error) is kept as `error` and reported by `ready`,
    so that the driver can raise it as it is rather than as a dead actor."""

    def __init__(self, model: str, threads: int, name: str):
        from ..machinery import settings

        settings.configure(threads=threads)  # the pools' sizes also come from the actor's env
        self.name = f"{name}@{socket.gethostname()}:{os.getpid()}"
        self.model = None
        self.error: tuple[str, str] | None = None
        self._prompts: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        t0 = time.perf_counter()
        try:
            from ..pipeline import OmniVoice

            self.model = OmniVoice.from_pretrained(model)
        except OmniCoreError as exc:
            self.error = (type(exc).__name__, str(exc))
        self.load_s = time.perf_counter() - t0

    def ready(self) -> dict:
        import numba

        return {"worker": self.name, "error": self.error, "load_s": self.load_s,
                "threads": numba.get_num_threads(), "peak_rss": _peak_rss_bytes()}

    def stats(self) -> dict:
        return {"worker": self.name, "peak_rss": _peak_rss_bytes()}

    def _voice(self, kw: dict) -> dict:
        """`kw` with its ref_audio + ref_text replaced by their voice prompt, encoded once per
        actor (what generate would do for every item, giving the same prompt)."""
        if kw.get("ref_audio") is None:
            return kw
        kw = dict(kw)
        ref, ref_text = kw.pop("ref_audio"), kw.pop("ref_text")
        key = (ref, ref_text, kw.get("preprocess_prompt", True))
        with self._lock:  # one encode per voice, also when two of its items arrive at once
            prompt = self._prompts.get(key)
            if prompt is None:
                prompt = self.model.create_voice_clone_prompt(ref, ref_text=ref_text,
                                                              preprocess_prompt=key[2])
                self._prompts[key] = prompt
                while len(self._prompts) > PROMPT_CACHE:
                    self._prompts.popitem(last=False)
            self._prompts.move_to_end(key)
        kw["voice_clone_prompt"] = prompt
        return kw

    def synthesize(self, item: dict) -> dict:
        """Make and write one item; its manifest record. A failing item is a failed record
        (its error message), never an exception: it fails alone."""
        from ..audio import writers

        t0 = time.perf_counter()
        rec = {"id": item["id"], "line": item["line"], "path": item["path"]}
        try:
            wav = self.model.generate(item["text"], **self._voice(item["kwargs"]))[0]
            writers.write_audio_atomic(item["path"], wav, self.model.sampling_rate)
            rec.update(status="ok", seconds=len(wav) / self.model.sampling_rate,
                       samples=len(wav), error=None)
        except (OmniCoreError, MemoryError) as exc:
            rec.update(status="failed", error=str(exc) if isinstance(exc, OmniCoreError)
                       else "out of memory")
        except Exception as exc:  # a bug shows in the manifest, and the other items go on
            rec.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        rec.update(compute_seconds=round(time.perf_counter() - t0, 3), worker=self.name)
        return rec


# ---------------------------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------------------------


def read_manifest(path) -> dict[str, dict]:
    """The last record of each id in a manifest (a later line replaces an earlier one). A line
    that is not a complete JSON object (a driver killed mid-write) is skipped."""
    last: dict[str, dict] = {}
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return last
    except OSError as exc:
        raise InputError(f"cannot read {path} ({exc.strerror or exc})") from None
    with fh:
        for raw in fh:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("id"), str):
                last[rec["id"]] = rec
    return last


def is_done(rec: dict | None, target: Path) -> bool:
    """Whether a job is finished: an ok record, and its output holds the samples it recorded
    (outputs are written atomically, so a file there is whole; the count also catches a file
    replaced since)."""
    import soundfile as sf

    if not rec or rec.get("status") != "ok" or not isinstance(rec.get("samples"), int):
        return False
    try:
        return sf.info(str(target)).frames == rec["samples"]
    except (OSError, RuntimeError, ValueError):  # missing, unreadable, not audio
        return False


class Manifest:
    """OUT_DIR/manifest.jsonl, appended one complete line per record by its only writer, the
    driver, which holds an exclusive lock on it for the run (a second driver on the same
    folder is refused). Each line is synced before the next job is counted done."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise InputError(f"cannot write {self.path} ({exc.strerror or exc})") from None
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no advisory locks (Windows): one driver per folder is on the user
            pass
        except OSError:
            os.close(self.fd)
            raise InputError(f"{self.path} is in use by another `omnicore batch --ray`; run one "
                             "batch per --out-dir at a time") from None
        size = os.fstat(self.fd).st_size
        if size and os.pread(self.fd, 1, size - 1) != b"\n":
            os.write(self.fd, b"\n")  # end a torn last line, so the next record starts clean

    def append(self, rec: dict) -> None:
        os.write(self.fd, (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


# ---------------------------------------------------------------------------------------------
# Scheduling
# ---------------------------------------------------------------------------------------------


@dataclass
class _Item:
    id: str
    line: int
    text: str
    path: str
    kwargs: dict
    voice: tuple | None  # (ref_audio, ref_text): items sharing it share one encode
    attempts: int = 0

    def payload(self) -> dict:
        return {"id": self.id, "line": self.line, "text": self.text, "path": self.path,
                "kwargs": self.kwargs}


class _Queue:
    """Items waiting to run, grouped by voice prompt. A worker keeps taking from the voice
    group it started, so each voice is encoded by as few actors as possible; otherwise it takes
    the earliest unstarted group or voice-less item (file order). When none is left, it helps
    with the largest started group (one more encode, no idle worker)."""

    def __init__(self, items: list[_Item]):
        self.plain: deque[_Item] = deque()  # no voice prompt: any worker
        self.groups: dict[tuple, deque[_Item]] = {}
        self.fresh: deque[tuple] = deque()  # voice groups no worker has started, file order
        self.started: set[tuple] = set()
        for it in items:
            if it.voice is None:
                self.plain.append(it)
            else:
                if it.voice not in self.groups:
                    self.groups[it.voice] = deque()
                    self.fresh.append(it.voice)
                self.groups[it.voice].append(it)

    def __len__(self) -> int:
        return len(self.plain) + sum(len(self.groups[k]) for k in self.fresh) + sum(
            len(self.groups[k]) for k in self.started)

    def take(self, current: tuple | None) -> _Item | None:
        if current is not None and self.groups.get(current):
            return self._pop(current)
        plain_first = self.plain and (not self.fresh or
                                      self.plain[0].line < self.groups[self.fresh[0]][0].line)
        if self.fresh and not plain_first:
            key = self.fresh.popleft()
            self.started.add(key)
            return self._pop(key)
        if self.plain:
            return self.plain.popleft()
        if self.started:
            return self._pop(max(self.started, key=lambda k: len(self.groups[k])))
        return None

    def _pop(self, key: tuple) -> _Item:
        q = self.groups[key]
        it = q.popleft()
        if not q:
            self.started.discard(key)
        return it

    def put_back(self, it: _Item) -> None:
        """A retry goes first in its group."""
        if it.voice is None:
            self.plain.appendleft(it)
            return
        self.groups[it.voice].appendleft(it)
        if it.voice not in self.fresh:
            self.started.add(it.voice)

    def drain(self) -> list[_Item]:
        out = list(self.plain) + [it for k in list(self.fresh) + list(self.started)
                                  for it in self.groups[k]]
        self.plain.clear()
        self.fresh.clear()
        self.started.clear()
        return out


@dataclass
class _Slot:
    """One worker position: its current actor, replaced when the actor dies."""

    index: int
    handle: object = None
    restarts: int = 0
    state: str = "starting"  # starting (ready() pending) | live | gone
    name: str = ""
    voice: tuple | None = None
    in_flight: dict = field(default_factory=dict)  # ObjectRef -> _Item
    ready_ref: object = None
    info: dict = field(default_factory=dict)


def format_eta(seconds: float) -> str:
    """h:mm:ss (also the CLI's progress lines)."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def job_line(done: int, total: int, what: str, outcome: str, audio_s: float, eta: str) -> str:
    """A batch's line for one finished job (local or on Ray): which one, its own outcome (its
    audio's length, or that it failed), then the batch's audio so far and the ETA."""
    return f"[{done}/{total}] {what}: {outcome} | {audio_s:.1f} s of audio in all | ETA {eta}"


# Ray starts its worker processes at nice 15 (its worker_niceness), below every ordinary
# process: an engine there loses its cores to any other work, and its two BLAS threads, which
# meet at every GEMM, stall whenever one is put aside. A worker with this variable in its
# environment keeps the priority it was started with, as `omnicore serve` runs (Ray's own job
# supervisor sets it so for the same reason).
RAY_NICENESS = {"RAY_worker_niceness": "0"}


def actor_env(threads: int) -> dict:
    """Environment of a worker process: every thread pool sized to its CPUs, set before numpy
    and Numba load (only there: the driver's own process is left as it is), and the process's
    priority an ordinary one's (RAY_NICENESS)."""
    n = str(threads)
    return {"OMNICORE_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n,
            "MKL_NUM_THREADS": n, "NUMBA_NUM_THREADS": n, **RAY_NICENESS}


def check_sizes(workers: int | None, threads: int | None) -> None:
    for flag, value in (("--workers", workers), ("--threads-per-worker", threads)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")


class _Driver:
    """The run's state on the driver: the queue, the worker slots, the manifest and counts."""

    def __init__(self, ray, manifest: Manifest, total: int, problems: list, log, report):
        self.ray, self.manifest, self.total = ray, manifest, total
        self.log, self.report = log, report
        self.problems = list(problems)  # recorded when the run is sure to go ahead
        self.bad_lines = len(problems)
        self.counts = {"ok": 0, "failed": 0, "retried": 0}
        self.audio_s = 0.0
        self.t0 = time.perf_counter()
        self.slots: list[_Slot] = []
        self.queue: _Queue | None = None
        self.first_death: BaseException | None = None

    def record(self, rec: dict) -> None:
        """One finished job: its manifest line, counts and progress line."""
        rec = {"id": rec.get("id"), "line": rec.get("line"), "path": rec.get("path"),
               "seconds": round(rec.get("seconds") or 0.0, 3), "samples": rec.get("samples"),
               "compute_seconds": rec.get("compute_seconds"), "worker": rec.get("worker"),
               "status": rec["status"], "error": rec.get("error")}
        self.manifest.append(rec)
        self.counts[rec["status"]] += 1
        self.audio_s += rec["seconds"]
        done = self.counts["ok"] + self.counts["failed"]
        if rec["status"] == "failed":
            self.report(f"{rec['line']}: " + (f"id {rec['id']!r}: " if rec["id"] else "")
                        + rec["error"])
        ran = done - self.bad_lines  # jobs that ran: what the ETA is made from
        eta = (format_eta((time.perf_counter() - self.t0) / ran * (self.total - done))
               if ran > 0 else "?")
        outcome = f"{rec['seconds']:.1f} s" if rec["status"] == "ok" else rec["status"]
        self.log(job_line(done, self.total, rec["id"] or f"(line {rec['line']})", outcome,
                          self.audio_s, eta))

    def record_problems(self) -> None:
        """Bad lines fail alone: recorded once the run goes ahead (no items, or a worker is
        ready), so that a refused run leaves the manifest as it was."""
        while self.problems:
            n, job_id, why = self.problems.pop(0)
            self.record({"id": job_id, "line": n, "status": "failed", "error": why})

    # -- workers --------------------------------------------------------------------------------

    def start(self, slot: _Slot) -> None:
        slot.name = f"w{slot.index}" + (f".{slot.restarts}" if slot.restarts else "")
        slot.handle = self.remote.options(name=f"omnicore-{self.run_id}-{slot.name}",
                                          **self.options).remote(self.model, self.threads,
                                                                 slot.name)
        slot.ready_ref = slot.handle.ready.remote()
        slot.state = "starting"

    def replace(self, slot: _Slot, why: str) -> None:
        """The slot's actor is gone: kill what is left of it, start another."""
        try:
            self.ray.kill(slot.handle, no_restart=True)
        except Exception:  # already dead
            pass
        slot.restarts += 1
        slot.voice = None
        if slot.restarts > MAX_RESTARTS:
            slot.state = "gone"
            self.log(f"worker {slot.name} given up after {MAX_RESTARTS} restarts ({why})")
            return
        self.log(f"worker {slot.name} died ({why}); starting a new one")
        self.start(slot)

    def retry(self, it: _Item, exc: BaseException, worker: str) -> None:
        """An item whose actor died under it: queued again, or failed after MAX_ATTEMPTS (an
        item that kills every worker, e.g. out of memory)."""
        it.attempts += 1
        if it.attempts < MAX_ATTEMPTS:
            self.queue.put_back(it)
            self.counts["retried"] += 1
            return
        self.record({**it.payload(), "status": "failed", "worker": worker,
                     "error": f"its worker died {it.attempts} times while running it "
                              f"({type(exc).__name__}); it may need more memory than a worker has"})

    def on_ready(self, slot: _Slot) -> None:
        try:
            info = self.ray.get(slot.ready_ref)
        except self.ray.exceptions.RayError as exc:
            self.first_death = self.first_death or exc
            self.replace(slot, f"it did not start: {type(exc).__name__}")
            return
        if info["error"]:  # a model that does not load is the whole run's error
            kind, message = info["error"]
            raise getattr(errors, kind, OmniCoreError)(message)
        slot.info, slot.state, slot.name = info, "live", info["worker"]
        self.record_problems()

    def on_death(self, slot: _Slot, it: _Item, exc: BaseException) -> None:
        """`it`'s actor died: of its other calls, those that finished before are kept, the
        rest go back to the queue; then a new actor takes its place."""
        self.first_death = self.first_death or exc
        others = list(slot.in_flight)
        finished = (set(self.ray.wait(others, num_returns=len(others), timeout=0)[0])
                    if others else set())
        for ref in others:
            lost = slot.in_flight.pop(ref)
            rec = None
            if ref in finished:
                try:
                    rec = self.ray.get(ref, timeout=0)
                except self.ray.exceptions.RayError:
                    pass
            if rec is None:
                self.retry(lost, exc, slot.name)
            else:
                self.record(rec)
        self.retry(it, exc, slot.name)
        self.replace(slot, type(exc).__name__)

    def loop(self, on_record) -> None:
        """Until every item is recorded: keep IN_FLIGHT calls on every live actor, take each
        result as it comes."""
        ray = self.ray
        while True:
            for slot in self.slots:
                while slot.state == "live" and len(slot.in_flight) < IN_FLIGHT:
                    it = self.queue.take(slot.voice)
                    if it is None:
                        break
                    slot.voice = it.voice or slot.voice
                    slot.in_flight[slot.handle.synthesize.remote(it.payload())] = it
            starting = {s.ready_ref: s for s in self.slots if s.state == "starting"}
            calls = {ref: s for s in self.slots for ref in s.in_flight}
            if not starting and not calls:
                break
            # a timed wait: Ctrl-C gets through at once
            done, _ = ray.wait(list(starting) + list(calls), num_returns=1, timeout=0.5)
            for ref in done:
                if ref in starting:
                    self.on_ready(starting[ref])
                    continue
                slot = calls[ref]
                it = slot.in_flight.pop(ref)
                try:
                    rec = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # Worker.synthesize never raises
                    rec = {**it.payload(), "status": "failed", "worker": slot.name,
                           "error": f"{type(exc).__name__}: {exc}"}
                except ray.exceptions.RayError as exc:  # the actor died with it in flight
                    self.on_death(slot, it, exc)
                    continue
                self.record(rec)
                if on_record is not None:
                    on_record(rec, slot.handle)
            if all(s.state == "gone" for s in self.slots):
                if not any(s.info for s in self.slots):  # none ever started: say why, once
                    raise ConfigError(f"no Ray worker could start ({self.first_death}); is "
                                      "omnicore (with the `ray` extra) installed, and --model "
                                      "there, on every node?")
                break
        why = type(self.first_death).__name__ if self.first_death else "see above"
        for it in self.queue.drain():  # left only when every worker is gone
            self.record({**it.payload(), "status": "failed", "error": "no Ray worker left to run "
                         f"it: every worker died {MAX_RESTARTS + 1} times ({why})"})


def run(jobs: list[tuple[int, dict]], problems: list, out_dir: Path, *, model: str,
        job_kwargs: Callable[[dict], dict], target: Callable[[Path, str], Path],
        workers: int | None = None, threads: int = 1,
        address: str | None = None, log: Callable[[str], None] = lambda msg: None,
        report: Callable[[str], None] = lambda msg: None,
        on_record: Callable[[dict, object], None] | None = None) -> dict:
    """Run checked batch `jobs` ((line, job) pairs, cli.batch.parse_jobs) on Ray actors, writing
    OUT_DIR/<id>.wav and one manifest line per job; `problems` ((line, id or None, why) of the
    bad lines) are recorded failed.

    Uses the Ray instance already initialised in this process, else starts one (`address`
    None or "") or joins `address` ("auto", "ray://host:port"), shutting down what it started.
    `job_kwargs(job)` gives a job's generate() arguments, `target(out_dir, id)` its output
    file (cli.batch.job_kwargs, batch_target); `log` gets progress lines, `report`
    each failure; `on_record(record, actor)` is called after each result of an actor (tests
    kill actors from it). Returns a summary: counts, audio seconds, wall time, each worker's
    name, load time, threads and peak memory."""
    ray = import_ray()
    check_sizes(workers, threads)
    out_dir = Path(out_dir).resolve()
    manifest = Manifest(out_dir / MANIFEST)
    started_ray = False
    d = None
    try:
        from ..audio import writers

        paths = [target(out_dir, job["id"]) for _, job in jobs]
        names = [p.name for p in paths]
        # Holding the manifest's lock, no other run writes here: what a killed worker of an
        # earlier run left half-written goes.
        writers.remove_stale_temporaries(out_dir, names)
        previous = read_manifest(manifest.path)
        items, skipped = [], 0
        for (n, job), path in zip(jobs, paths):
            if is_done(previous.get(job["id"]), path):
                skipped += 1
                continue
            kw = job_kwargs(job)
            voice = None
            if kw.get("ref_audio") is not None:  # actors run elsewhere: absolute paths
                kw["ref_audio"] = os.path.abspath(kw["ref_audio"])
                voice = (kw["ref_audio"], kw["ref_text"])
            items.append(_Item(job["id"], n, job["text"], str(path), kw, voice))
        d = _Driver(ray, manifest, len(items) + len(problems), problems, log, report)
        if skipped:
            log(f"resuming: {skipped} job(s) already done in {manifest.path}")
        if not items:
            d.record_problems()
        else:
            if not ray.is_initialized():
                local = {} if address else {"include_dashboard": False}
                ray.init(address=address or None, logging_level="ERROR", log_to_driver=False,
                         **local)
                started_ray = True
            cpus = ray.cluster_resources().get("CPU", 0)
            if cpus < threads:
                raise ConfigError(f"each worker reserves {threads} CPU(s) (--threads-per-worker) "
                                  f"but the Ray cluster has {cpus:g}; lower it or add nodes")
            workers = min(workers or max(1, int(cpus // threads)), len(items))
            if workers * threads > cpus:
                log(f"note: {workers} workers x {threads} CPUs > the cluster's {cpus:g} CPUs; "
                    "some workers wait for CPUs (or for the autoscaler)")
            d.remote, d.run_id = ray.remote(Worker), os.urandom(4).hex()
            d.options = dict(num_cpus=threads, max_concurrency=IN_FLIGHT, max_restarts=0,
                             runtime_env={"env_vars": actor_env(threads)})
            d.model = os.path.abspath(model) if os.path.exists(model) else model
            d.threads = threads
            d.queue = _Queue(items)
            d.slots = [_Slot(i) for i in range(workers)]
            for slot in d.slots:
                d.start(slot)
            log(f"{len(items)} job(s) on {workers} Ray worker(s) x {threads} CPU(s)"
                + (f", {len(problems)} bad line(s)" if problems else ""))
            d.loop(on_record)
            # every call is back: what is left half-written is a dead actor's
            writers.remove_stale_temporaries(out_dir, names)
            for slot in d.slots:
                if slot.state == "live":
                    try:
                        slot.info.update(ray.get(slot.handle.stats.remote(), timeout=30))
                    except ray.exceptions.RayError:
                        pass
        return {"total": len(jobs) + len(problems), **d.counts, "skipped": skipped,
                "audio_seconds": d.audio_s, "wall_seconds": time.perf_counter() - d.t0,
                "workers": [s.info for s in d.slots if s.info]}
    finally:
        for slot in d.slots if d else ():
            if slot.handle is not None:
                try:
                    ray.kill(slot.handle, no_restart=True)
                except Exception:  # already dead
                    pass
        manifest.close()
        if started_ray:
            ray.shutdown()
