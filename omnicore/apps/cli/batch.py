"""`omnicore batch`: every line of a JSONL file (the reference's batch format) to OUT_DIR/<id>.wav,
a few jobs at once on the model's engine, or on Ray actors with --ray (omnicore.apps.cluster).

`parse_jobs`, `check_batch_outputs`, `job_kwargs` and `batch_target` are what the Ray driver
shares with the local run: the same lines, outputs and options either way.
"""

from __future__ import annotations

import json
import os
import threading
import time
import unicodedata
from pathlib import Path

from ...errors import InputError, OmniCoreError
from . import common
from .options import add_generation_options, gen_kwargs
from .progress import BatchProgress, StatusLine

# The reference's batch format (omnivoice-infer-batch): "id" and "text" required, the rest
# optional, null meaning absent; "language_name" is read only by its evaluation scripts.
_BATCH_FIELDS = ("id", "text", "ref_audio", "ref_text", "instruct", "language_id", "language_name",
                 "duration", "speed")
_BATCH_STRINGS = ("ref_audio", "ref_text", "instruct", "language_id", "language_name")
_MAX_NAME_BYTES = 255  # the longest file name ext4, APFS and NTFS take


def _id_problem(job_id) -> str | None:
    """Why `job_id` cannot name an output file `<id>.wav`, or None."""
    if not isinstance(job_id, str) or not job_id:
        return "needs a non-empty string \"id\" (it names the output file <id>.wav)"
    if "/" in job_id or "\\" in job_id or job_id.startswith("."):
        return f"id {job_id!r} is not a plain file name (no '/', '\\', or leading '.')"
    if any(ord(c) < 32 or ord(c) == 127 for c in job_id):
        return f"id {job_id!r} contains a control character"
    try:
        name = (job_id + ".wav").encode("utf-8")
    except UnicodeEncodeError:
        return f"id {job_id!r} is not valid UTF-8 (an unpaired surrogate)"
    if len(name) > _MAX_NAME_BYTES:
        return f"id is {len(name) - 4} bytes long; file names allow {_MAX_NAME_BYTES - 4} plus '.wav'"
    return None


def _job_problem(job) -> str | None:
    """What is wrong with one parsed batch line (fields, types, values), or None."""
    from ...text.frontend import resolve_instruct
    from ...text.planner import split_pauses
    from ...text.limits import validate_duration, validate_speed, validate_text

    if not isinstance(job, dict):
        return f"must be a JSON object, got {type(job).__name__}"
    extra = sorted(set(job) - set(_BATCH_FIELDS))
    if extra:
        return f"unknown field(s) {extra}; known: {list(_BATCH_FIELDS)}"
    problem = _id_problem(job.get("id"))
    if problem:
        return problem
    if not isinstance(job.get("text"), str):
        return "needs a string \"text\" (the words to speak)"
    bad = [k for k in _BATCH_STRINGS if job.get(k) is not None and not isinstance(job[k], str)]
    if bad:
        got = ", ".join(type(job[k]).__name__ for k in bad)
        return f"field(s) {bad} must be strings (or null), got {got}"
    for k in _BATCH_STRINGS:  # JSON escapes can make lone surrogates, which no path or text has
        try:
            (job.get(k) or "").encode("utf-8")
        except UnicodeEncodeError:
            return f"field {k!r} contains an unpaired surrogate (\\ud800-\\udfff); it is not valid text"
    if job.get("ref_audio") and not (job.get("ref_text") or "").strip():
        return ("\"ref_audio\" needs \"ref_text\", the transcript of the clip (the reference can "
                "transcribe it with Whisper; omnicore has no ASR built in)")
    try:
        split_pauses(validate_text(job.get("text")))
        validate_duration(job.get("duration"))
        validate_speed(job.get("speed"))
        resolve_instruct(job.get("instruct"), job["text"])
    except InputError as exc:
        return str(exc)
    return None


def parse_jobs(path: str) -> tuple[list[tuple[int, dict]], list[tuple[int, str | None, str]]]:
    """Every line of a batch file checked: (line number, job) pairs of the good lines, and
    (line number, id or None, what is wrong) of the bad ones (malformed JSON, missing or
    mistyped fields, bad values, unsafe ids, an id naming the same output file as an earlier
    line). InputError if the file cannot be read."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    jobs, problems, names = [], [], {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            job = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            problems.append((n, None, f"invalid JSON ({getattr(exc, 'msg', 'nested too deeply')})"))
            continue
        problem = _job_problem(job)
        if problem:
            job_id = job.get("id") if isinstance(job, dict) else None
            problems.append((n, job_id if _id_problem(job_id) is None else None, problem))
            continue
        # One file per id, also where the file system ignores case or Unicode normalisation
        # (macOS, Windows): the later job would silently overwrite the earlier one.
        key = unicodedata.normalize("NFC", job["id"]).casefold()
        if key in names:
            m, other = names[key]
            if other == job["id"]:
                problem = f"id {job['id']!r} is also on line {m}; ids must be unique"
            else:
                problem = (f"id {job['id']!r} names the same file as {other!r} on line {m} on some "
                           "file systems (they differ only in case or Unicode normalisation); ids "
                           "must be unique")
            problems.append((n, job["id"], problem))
            continue
        names[key] = (n, job["id"])
        jobs.append((n, job))
    return jobs, problems


def _read_jobs(path: str) -> list[tuple[int, dict]]:
    """`parse_jobs`, all or nothing: the jobs, or one InputError naming each bad line."""
    jobs, problems = parse_jobs(path)
    if problems:
        more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise InputError(f"{path}: {len(problems)} bad line(s), nothing was run: "
                         + "; ".join(f"line {n}: {why}" for n, _, why in problems[:10]) + more)
    if not jobs:
        raise InputError(f"{path}: no jobs")
    return jobs


def batch_target(out_dir, job_id: str) -> Path:
    """The output file of job `job_id`."""
    return Path(out_dir) / f"{job_id}.wav"


BATCH_IN_FLIGHT = 4  # jobs generating at once: enough to fill the packed GEMMs, bounded memory


def check_batch_outputs(args, jobs: list[tuple[int, dict]]) -> Path:
    """Before any work: --out-dir is a folder (created if missing) that takes new files, no
    job's output would replace an input of the batch (the job file, a ref_audio) or a folder.
    Returns the folder; InputError naming the line otherwise."""
    from ...audio import writers

    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out-dir {args.out_dir!r} is a file, not a folder; give a folder "
                         "(it is created if missing)")
    # No output may replace an input (the job file, any job's ref_audio): by real path, and by
    # inode for hard links. Sets, so that a batch of n lines costs O(n) stats, not n^2.
    by_path, by_inode = {}, {}
    sources = [("the job file", args.jsonl)]
    sources += [(f"the ref_audio of line {n}", job["ref_audio"]) for n, job in jobs if job.get("ref_audio")]
    for what, src in sources:
        by_path.setdefault(os.path.realpath(src), (what, src))
        try:
            st = os.stat(src)
            by_inode.setdefault((st.st_dev, st.st_ino), (what, src))
        except (OSError, ValueError):
            pass
    for n, job in jobs:
        target = batch_target(out_dir, job["id"])
        hit = by_path.get(os.path.realpath(target))
        try:
            st = os.stat(target)
            hit = hit or by_inode.get((st.st_dev, st.st_ino))
        except (OSError, ValueError):
            pass
        if hit:
            raise InputError(f"{args.jsonl}:{n}: output {str(target)!r} is {hit[0]} ({hit[1]!r}); "
                             "it would be overwritten: change the id or --out-dir; nothing was run")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create --out-dir {args.out_dir!r} ({exc.strerror or exc})") from None
    for n, job in jobs:  # e.g. a folder named <id>.wav in the way
        try:
            writers.check_output_path(batch_target(out_dir, job["id"]), InputError)
        except InputError as exc:
            raise InputError(f"{args.jsonl}:{n}: {exc}; nothing was run") from None
    from ..cluster import MANIFEST

    probe = batch_target(out_dir, jobs[0][1]["id"]) if jobs else out_dir / MANIFEST
    writers.AtomicOutput(probe, InputError).abort()  # takes new files?
    return out_dir


def job_kwargs(args, base: dict, job: dict) -> dict:
    """The generate() arguments of one batch job: `base` (the command's options, gen_kwargs)
    with the job's own fields."""
    kw = dict(base)
    # null is "absent", as in the reference; the options are the defaults for absent fields
    for field, key, default in (("language_id", "language", args.language),
                                ("instruct", "instruct", args.instruct),
                                ("duration", "duration", args.duration),
                                ("speed", "speed", args.speed)):
        kw[key] = default if job.get(field) is None else job[field]
    kw.update(getattr(args, "job_overrides", None) or {})  # infer-batch's --lang_id
    if job.get("ref_audio"):
        kw.update(ref_audio=job["ref_audio"], ref_text=job["ref_text"])
    return kw


def cmd_batch(args) -> int:
    """Lines are all checked first: any bad line refuses the whole batch before any work. Then
    the jobs run, a few at once on the model's engine; a job that fails (e.g. unreadable
    ref_audio) is reported with its line number and the rest go on; the exit status is then 1.
    With --ray, omnicore.apps.cluster runs them on Ray actors instead."""
    from ...audio import writers

    if getattr(args, "ray", None) is not None:
        return _batch_ray(args)
    for flag, key in (("--workers", "workers"), ("--threads-per-worker", "threads_per_worker")):
        if getattr(args, key, None) is not None:
            raise InputError(f"{flag} sets the Ray workers; it needs --ray (pip install 'omnicore[ray]')")
    jobs = _read_jobs(args.jsonl)
    out_dir = check_batch_outputs(args, jobs)
    model = common.load_model(args)
    base = gen_kwargs(args)
    status = StatusLine(args)
    progress = BatchProgress(status, len(jobs), getattr(args, "compile_seconds", None))

    def run(slot: dict, k: int, n: int, job) -> None:
        try:
            with common.working_on(f"{args.jsonl}:{n}: id {job['id']!r}"):  # names its warnings
                slot["wav"] = model.generate(job["text"], **job_kwargs(args, base, job),
                                             on_step=progress.on_step(k) if status.live else None)[0]
        except BaseException as exc:  # handed to the main thread, in job order
            slot["error"] = exc
        finally:
            slot["done"].set()

    # Up to BATCH_IN_FLIGHT jobs generate at once, so the engine packs their passes into shared
    # forwards; outputs are written and reported in job order by this thread. Daemon threads:
    # Ctrl-C ends the command without waiting for them.
    slots: list[dict] = []

    def start(i: int) -> None:
        slot = {"done": threading.Event()}
        slots.append(slot)
        n, job = jobs[i]
        threading.Thread(target=run, args=(slot, i + 1, n, job), name="omnicore-batch-job",
                         daemon=True).start()

    for i in range(min(BATCH_IN_FLIGHT, len(jobs))):
        start(i)
    failed = 0
    try:
        for k, (n, job) in enumerate(jobs, 1):
            slot = slots[k - 1]
            while not slot["done"].wait(0.5):  # a timed wait lets Ctrl-C through at once
                pass
            if len(slots) < len(jobs):
                start(len(slots))
            target = batch_target(out_dir, job["id"])
            try:
                if "error" in slot:
                    raise slot.pop("error")
                wav = slot.pop("wav")
                writers.write_audio_atomic(target, wav, model.sampling_rate)
                progress.finished(k, str(target), len(wav) / model.sampling_rate)
            except (OmniCoreError, MemoryError) as exc:
                failed += 1
                reason = exc if isinstance(exc, OmniCoreError) else "out of memory"
                status.error(f"{args.jsonl}:{n}: id {job['id']!r}: {reason}")
                progress.finished(k, f"id {job['id']!r}", None)
    finally:
        status.close()
    common.log(args, f"{len(jobs) - failed} of {len(jobs)} jobs written to {out_dir}"
                     + (f", {failed} failed" if failed else "")
                     + f"; {progress.audio_s:.1f} s of audio in "
                       f"{time.perf_counter() - progress.started:.1f} s")
    return 1 if failed else 0


def run_ray_batch(args, on_record=None) -> dict:
    """`batch --ray` as parsed by `build_parser`, run on Ray (omnicore.apps.cluster.run); returns its
    summary. `on_record(rec)` sees every manifest record as it is written."""
    from .. import cluster
    from ...model.config import GenerationConfig, resolve_generation_config

    cluster.import_ray()  # before any work: say how to install it
    cluster.check_sizes(args.workers, args.threads_per_worker)
    jobs, problems = parse_jobs(args.jsonl)
    if not jobs and not problems:
        raise InputError(f"{args.jsonl}: no jobs")
    out_dir = check_batch_outputs(args, jobs)
    base = gen_kwargs(args)
    names = GenerationConfig.__dataclass_fields__  # bad options fail here, not on every job
    resolve_generation_config(None, {k: v for k, v in base.items() if k in names})
    return cluster.run(
        jobs, problems, out_dir, model=args.model,
        job_kwargs=lambda job: job_kwargs(args, base, job), target=batch_target,
        workers=args.workers, threads=args.threads_per_worker or 1,
        address=args.ray or None, log=lambda msg: common.log(args, msg),
        report=lambda msg: common.error(f"{args.jsonl}:{msg}"), on_record=on_record)


def _batch_ray(args) -> int:
    """`batch --ray` (omnicore.apps.cluster): the same lines, outputs and options as the local batch,
    but a bad line fails alone and is recorded in OUT_DIR/manifest.jsonl, and a rerun skips
    the jobs done."""
    from ..cluster import MANIFEST

    summary = run_ray_batch(args)
    rss = ", ".join(f"{w['worker']} {w['peak_rss'] / 2**30:.2f} GiB" for w in summary["workers"])
    common.log(args, f"{summary['ok']} written, {summary['failed']} failed, {summary['skipped']} "
                     f"already done; {summary['audio_seconds']:.1f} s of audio in "
                     f"{summary['wall_seconds']:.1f} s; manifest {Path(args.out_dir) / MANIFEST}"
                     + (f"; peak memory per worker: {rss}" if rss else ""))
    return 1 if summary["failed"] else 0


def add_parser(sub) -> None:
    b = sub.add_parser("batch", help="synthesise every line of a JSONL file",
                       description="Each line: {\"id\", \"text\"} plus optional \"ref_audio\", "
                                   "\"ref_text\", \"instruct\", \"language_id\", \"duration\", "
                                   "\"speed\" (the reference's batch format; null means absent, "
                                   "\"language_name\" is ignored; the options are the defaults for "
                                   "absent fields). Writes OUT_DIR/<id>.wav. All lines are checked "
                                   "first: a malformed line, a bad field, an unsafe id or two ids "
                                   "naming one file refuses the whole batch (exit 2, each bad line "
                                   "named) before any work. A job that fails while running (e.g. "
                                   "unreadable ref_audio) is reported with its line number, the "
                                   "others still run, and the exit status is 1.")
    b.add_argument("jsonl")
    b.add_argument("--out-dir", required=True)
    b.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run the jobs on Ray actors (pip install 'omnicore[ray]'): no ADDRESS "
                        "starts a local Ray, 'auto' or ray://HOST:PORT joins a cluster. A bad line "
                        "then fails alone; OUT_DIR/manifest.jsonl records every job, and a rerun "
                        "skips the ones done")
    b.add_argument("--workers", type=int, metavar="N",
                   help="Ray actors, each with its own model (default: the cluster's CPUs / K)")
    b.add_argument("--threads-per-worker", type=int, metavar="K",
                   help="CPUs each Ray actor reserves and BLAS/Numba threads it uses (default 1)")
    common.add_model_options(b)
    add_generation_options(b)
    b.set_defaults(func=cmd_batch)
