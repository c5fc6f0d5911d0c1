"""The `omnicore` command line.

    omnicore say "Hello there." -o hello.wav                    # auto voice
    omnicore say "Hello." --instruct "female, low pitch" -o a.wav   # voice design
    omnicore say "Hello." --ref-audio me.wav --ref-text "..." -o b.wav  # voice cloning
    omnicore say "Wait. [pause:1.5s] Now." --instruct male -o c.wav --save-voice m.npz  # a pause; keep the voice
    omnicore clone-prompt me.wav --ref-text "..." -o me.npz     # save a voice, reuse with --voice
    llm ... | omnicore say --stream --raw | aplay -r 24000 -f S16_LE -c 1   # speak as text arrives
    omnicore batch jobs.jsonl --out-dir out/                    # many utterances
    omnicore batch jobs.jsonl --out-dir out/ --ray              # the same on Ray actors, resumable
    omnicore codec encode in.wav -o codes.npy | decode codes.npy -o out.wav | roundtrip in.wav -o rt.wav

Every failure is one `omnicore: error: ...` line on stderr, without a traceback. Exit status:
0 done; 2 refused before or while working (bad arguments, text, audio, voice or model files, an
output path that cannot be written or that is one of the inputs); 1 an operating-system failure
(e.g. no space on stdout) or some `batch` jobs failed; 130 Ctrl-C; 143 SIGTERM; 129 SIGHUP. Outputs are
written atomically: a failed, interrupted or terminated command leaves no partial or temporary
file, and an existing output is replaced only by a complete new one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import unicodedata
from pathlib import Path

import numpy as np

from ..errors import AudioError, InputError, OmniCoreError, VoicePromptError
from ..model.config import SAMPLE_RATE

DEFAULT_MODEL = os.environ.get("OMNICORE_MODEL", "k2-fsa/OmniVoice")


def _progress(enabled: bool):
    """A one-line step counter on stderr; only on a terminal, so logs don't fill with \r lines."""
    if not enabled or not sys.stderr.isatty():
        return None

    def on_step(step: int, total: int) -> None:  # step counts from 1
        sys.stderr.write(f"\r  unmasking step {step}/{total}")
        if step == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return on_step


def _read_text(args) -> str:
    if args.text_file:
        try:
            return Path(args.text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read --text-file {args.text_file}: {exc}") from None
    if args.text is None or args.text == "-":
        if sys.stdin.isatty():
            raise InputError("no text given: pass TEXT, --text-file FILE, or pipe text on stdin")
        return sys.stdin.read()
    return args.text


def _load_model(args):
    from ..pipeline import OmniVoice

    t0 = time.perf_counter()
    model = OmniVoice.from_pretrained(args.model)
    _log(args, f"loaded {args.model} in {time.perf_counter() - t0:.1f} s")
    return model


def _log(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr)


def _same_file(a, b) -> bool:
    """Whether paths `a` and `b` name one file: after symbolic links, and hard links too."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one of them does not exist (yet)
        return False


def _check_output(path, inputs: dict, error=InputError, *, audio_file: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written (missing folder, a folder or
    device, an unknown audio extension) or that would replace one of the command's own inputs
    (`inputs`: what it is -> path or None)."""
    from ..audio import writers

    for what, src in inputs.items():
        if src and _same_file(path, src):
            raise InputError(f"output {os.fspath(path)!r} is the same file as {what} {os.fspath(src)!r}; "
                             "writing it would destroy the input: choose another output name")
    writers.check_output_path(path, error)
    if audio_file:
        writers.audio_format(path)
    writers.AtomicOutput(path, error).abort()  # a folder that takes no new file (read-only, /proc)


def _say_inputs(args) -> dict:
    return {"--ref-audio": args.ref_audio, "--voice": args.voice, "--text-file": args.text_file}


def _gen_kwargs(args) -> dict:
    kw = dict(language=args.language, instruct=args.instruct, duration=args.duration,
              speed=args.speed, num_step=args.steps, guidance_scale=args.guidance, seed=args.seed,
              denoise=not args.no_denoise, postprocess_output=not args.no_postprocess)
    if args.greedy:
        kw.update(position_temperature=0.0, class_temperature=0.0)
    if getattr(args, "normalize_text", False):
        kw["normalize_text"] = True
    # Knobs only the reference's flags (infer, infer-batch) set; absent from say/batch.
    for key in _REFERENCE_GEN_KEYS:
        if getattr(args, key, None) is not None:
            kw[key] = getattr(args, key)
    return kw


_REFERENCE_GEN_KEYS = ("t_shift", "layer_penalty_factor", "position_temperature",
                       "class_temperature", "audio_chunk_duration", "audio_chunk_threshold",
                       "preprocess_prompt")


def _say_text(args) -> str:
    """The text to speak, checked (length, pause marks) before the (slow) model load."""
    from ..text.planner import split_pauses
    from ..text.limits import validate_text

    text = validate_text(_read_text(args))
    split_pauses(text)
    return text


def cmd_say(args) -> int:
    from ..audio import writers
    from ..pipeline import VoiceClonePrompt

    save_voice = getattr(args, "save_voice", None)
    if save_voice and (args.raw or args.stream):
        raise InputError("--save-voice keeps the voice of a whole result; it does not go with "
                         "--stream or --raw (run without them to keep the voice)")
    if args.raw or args.stream:
        return _say_stream(args)
    if args.output is None:
        raise InputError("say needs -o/--output FILE (or --stream --raw for PCM on stdout)")
    _check_output(args.output, _say_inputs(args), AudioError, audio_file=True)
    if save_voice:
        _check_output(save_voice, {**_say_inputs(args), "--output": args.output},
                      VoicePromptError)
    text = _say_text(args)  # fail before the (slow) model load
    model = _load_model(args)
    kw = _gen_kwargs(args)
    _voice_kwargs(args, kw, VoiceClonePrompt)
    t0 = time.perf_counter()
    result = model.synthesize(text, on_step=_progress(not args.quiet), **kw)[0]
    elapsed = time.perf_counter() - t0
    voice = result.as_voice() if save_voice else None  # refused (too long) before any write
    writers.write_audio_atomic(args.output, result.audio, model.sampling_rate)
    secs = len(result.audio) / model.sampling_rate
    _log(args, f"wrote {args.output}: {secs:.2f} s of audio in {elapsed:.1f} s "
               f"(RTF {elapsed / max(secs, 1e-9):.2f}, {result.codes.shape[1]} frames, "
               f"{len(result.text_chunks)} chunk(s))")
    if voice is not None:
        voice.save(save_voice)
        _log(args, f"wrote {save_voice}: this voice ({voice.ref_audio_tokens.shape[1]} frames), "
                   f"reuse it with --voice {save_voice}")
    return 0


def _voice_kwargs(args, kw: dict, prompt_cls) -> None:
    if args.voice:
        kw["voice_clone_prompt"] = prompt_cls.load(args.voice)
    elif args.ref_audio:
        kw.update(ref_audio=args.ref_audio, ref_text=args.ref_text)
    elif args.ref_text:
        raise InputError("--ref-text needs --ref-audio (or use --voice with a saved prompt)")


def _stdin_fragments():
    """Text from stdin as it arrives (whatever one read returns, not whole lines), UTF-8."""
    import codecs

    buf = getattr(sys.stdin, "buffer", None)
    if buf is not None and hasattr(buf, "read1"):
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            data = buf.read1(4096)
            if not data:
                break
            yield dec.decode(data)
        yield dec.decode(b"", final=True)
    else:  # a text stream without a byte buffer (e.g. io.StringIO in tests)
        while True:
            data = sys.stdin.read(4096)
            if not data:
                break
            yield data


def _say_stream(args) -> int:
    """`say --stream`: audio is written as each chunk is made (see omnicore.streaming)."""
    from ..audio import writers
    from ..pipeline import VoiceClonePrompt

    if args.text_file or (args.text is not None and args.text != "-"):
        source = _say_text(args)  # fail before the (slow) model load
    elif sys.stdin.isatty():
        raise InputError("no text given: pass TEXT, --text-file FILE, or pipe text on stdin")
    else:
        source = _stdin_fragments()  # each sentence is spoken as soon as it is complete
    to_stdout = args.output in (None, "-")
    if to_stdout and not args.raw:
        raise InputError("--stream to stdout needs --raw (16-bit PCM); or give -o FILE")
    kw = _gen_kwargs(args)
    _voice_kwargs(args, kw, VoiceClonePrompt)
    if to_stdout:
        writer = writers.RawPcmWriter(sys.stdout.buffer)
    else:
        _check_output(args.output, _say_inputs(args), AudioError)
        writer = writers.AudioFileWriter(args.output, SAMPLE_RATE, raw=args.raw)  # checks the path first
    try:
        model = _load_model(args)
        t0 = time.perf_counter()
        st = model.stream(source, **kw)
        try:
            for piece in st:
                writer.write(piece)
                if writer.samples == len(piece):
                    _log(args, f"first audio after {time.perf_counter() - t0:.2f} s")
        finally:
            st.close()
        writer.commit()
    except BrokenPipeError:  # the player went away: stop quietly, as `cmd | head` does
        _drop_stdout()
        return 0
    except OSError as exc:
        if not to_stdout:
            writer.abort()
            raise
        _drop_stdout()
        raise AudioError(f"cannot write PCM to stdout ({exc.strerror or exc})") from None
    except BaseException:
        writer.abort()
        raise
    elapsed = time.perf_counter() - t0
    secs = writer.samples / model.sampling_rate
    _log(args, f"wrote {'stdout' if to_stdout else args.output}: {secs:.2f} s of audio in "
               f"{elapsed:.1f} s (RTF {elapsed / max(secs, 1e-9):.2f}, {len(st.text_chunks)} "
               f"chunk(s), first audio after {st.first_audio_s or 0:.2f} s)")
    return 0


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the flush at exit of what is still buffered cannot fail a
    second time (Python would print an 'Exception ignored' report)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def cmd_clone_prompt(args) -> int:
    _check_output(args.output, {"the reference clip": args.ref_audio}, VoicePromptError)
    model = _load_model(args)
    prompt = model.create_voice_clone_prompt(args.ref_audio, ref_text=args.ref_text,
                                             preprocess_prompt=not args.no_preprocess)
    prompt.save(args.output)
    _log(args, f"wrote {args.output}: {prompt.ref_audio_tokens.shape[1]} frames, "
               f"text {prompt.ref_text!r}")
    return 0


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
    from ..text.frontend import resolve_instruct
    from ..text.planner import split_pauses
    from ..text.limits import validate_duration, validate_speed, validate_text

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
    from ..audio import writers

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
    """The generate() arguments of one batch job: `base` (the command's options, _gen_kwargs)
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
    the jobs run, a few at once on the model's engine; a job that fails (e.g. unreadable ref_audio) is reported with its
    line number and the rest go on; the exit status is then 1. With --ray, omnicore.cluster
    runs them on Ray actors instead."""
    from ..audio import writers

    if getattr(args, "ray", None) is not None:
        return _batch_ray(args)
    for flag, key in (("--workers", "workers"), ("--threads-per-worker", "threads_per_worker")):
        if getattr(args, key, None) is not None:
            raise InputError(f"{flag} sets the Ray workers; it needs --ray (pip install 'omnicore[ray]')")
    jobs = _read_jobs(args.jsonl)
    out_dir = check_batch_outputs(args, jobs)
    model = _load_model(args)
    base = _gen_kwargs(args)

    def run(slot: dict, job) -> None:
        try:
            slot["wav"] = model.generate(job["text"], **job_kwargs(args, base, job))[0]
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
        threading.Thread(target=run, args=(slot, jobs[i][1]), name="omnicore-batch-job",
                         daemon=True).start()

    for i in range(min(BATCH_IN_FLIGHT, len(jobs))):
        start(i)
    failed = 0
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
            writers.write_audio_atomic(target, slot.pop("wav"), model.sampling_rate)
            _log(args, f"[{k}/{len(jobs)}] {target}")
        except (OmniCoreError, MemoryError) as exc:
            failed += 1
            reason = exc if isinstance(exc, OmniCoreError) else "out of memory"
            _error(f"{args.jsonl}:{n}: id {job['id']!r}: {reason}")
    if failed:
        _log(args, f"{len(jobs) - failed} of {len(jobs)} jobs written to {out_dir}, {failed} failed")
    return 1 if failed else 0


def run_ray_batch(args, on_record=None) -> dict:
    """`batch --ray` as parsed by `build_parser`, run on Ray (omnicore.cluster.run); returns its
    summary. `on_record(rec)` sees every manifest record as it is written."""
    from .. import cluster
    from ..model.config import GenerationConfig, resolve_generation_config

    cluster.import_ray()  # before any work: say how to install it
    cluster.check_sizes(args.workers, args.threads_per_worker)
    jobs, problems = parse_jobs(args.jsonl)
    if not jobs and not problems:
        raise InputError(f"{args.jsonl}: no jobs")
    out_dir = check_batch_outputs(args, jobs)
    base = _gen_kwargs(args)
    names = GenerationConfig.__dataclass_fields__  # bad options fail here, not on every job
    resolve_generation_config(None, {k: v for k, v in base.items() if k in names})
    return cluster.run(
        jobs, problems, out_dir, model=args.model,
        job_kwargs=lambda job: job_kwargs(args, base, job), target=batch_target,
        workers=args.workers, threads=args.threads_per_worker or 1,
        address=args.ray or None, log=lambda msg: _log(args, msg),
        report=lambda msg: _error(f"{args.jsonl}:{msg}"), on_record=on_record)


def _batch_ray(args) -> int:
    """`batch --ray` (omnicore.cluster): the same lines, outputs and options as the local batch,
    but a bad line fails alone and is recorded in OUT_DIR/manifest.jsonl, and a rerun skips
    the jobs done."""
    from ..cluster import MANIFEST

    summary = run_ray_batch(args)
    rss = ", ".join(f"{w['worker']} {w['peak_rss'] / 2**30:.2f} GiB" for w in summary["workers"])
    _log(args, f"{summary['ok']} written, {summary['failed']} failed, {summary['skipped']} "
               f"already done; {summary['audio_seconds']:.1f} s of audio in "
               f"{summary['wall_seconds']:.1f} s; manifest {Path(args.out_dir) / MANIFEST}"
               + (f"; peak memory per worker: {rss}" if rss else ""))
    return 1 if summary["failed"] else 0


def _named(values, flag: str) -> list[tuple[str, str]]:
    """NAME=VALUE arguments of a repeated option, split at the first '='."""
    pairs = []
    for v in values or ():
        name, sep, value = v.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InputError(f"{flag} takes NAME=VALUE (e.g. {flag} alice=...), got {v!r}")
        pairs.append((name.strip(), value))
    return pairs


def cmd_script(args) -> int:
    from .. import script

    if args.duration is not None:
        raise InputError("script: --duration would give every turn the same length; use --speed "
                         "(or a per-speaker \"speed\" in --voices)")
    voices: dict = {} if not args.voices else dict(script.load_voices_file(args.voices))
    cli = ([(n, {"voice": v}) for n, v in _named(args.voice, "--voice")]
           + [(n, {"instruct": v}) for n, v in _named(args.instruct, "--instruct")]
           + [(n.strip(), {}) for n in args.auto or ()])
    for name, spec in cli:  # the command line wins over the file for the same speaker
        voices = {k: v for k, v in voices.items() if k.casefold() != name.casefold()}
        voices[name] = spec
    timings = args.timings or script.timings_path_for(args.output)
    inputs = {"the script": None if args.script == "-" else args.script, "--voices": args.voices,
              **{f"--voice {n}": v for n, v in _named(args.voice, "--voice")}}
    _check_output(args.output, inputs, AudioError, audio_file=True)
    _check_output(timings, {**inputs, "--output": args.output}, InputError)
    if args.script == "-":
        if sys.stdin.isatty():
            raise InputError("no script given: pass a file, or pipe one on stdin with '-'")
        text = sys.stdin.read(script.MAX_SCRIPT_CHARS + 1)
    else:
        try:
            with open(args.script, encoding="utf-8") as fh:
                text = fh.read(script.MAX_SCRIPT_CHARS + 1)  # parse_script refuses a longer one
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read the script {args.script}: {exc}") from None
    # Every line, voice file and instruct is checked before the (slow) model load.
    lines, speakers = script.check_script(text, voices)
    script.check_gap(args.gap, len(lines))
    model = _load_model(args)
    kw = _gen_kwargs(args)
    for key in ("instruct", "duration"):
        kw.pop(key, None)

    def on_turn(k: int, n: int, line) -> None:
        _log(args, f"turn {k + 1}/{n} (line {line.line}, {line.speaker})")

    t0 = time.perf_counter()
    result = script.synthesize_script(model, text, speakers, gap=args.gap, on_turn=on_turn, **kw)
    elapsed = time.perf_counter() - t0
    script.write_script_outputs(result, args.output, timings)
    secs = len(result.audio) / result.sample_rate
    _log(args, f"wrote {args.output} ({secs:.2f} s, {len(result.turns)} turns in {elapsed:.1f} s) "
               f"and {timings}")
    return 0


def _codec(args):
    from ..pipeline import Codec
    from ..model.weights import resolve_codec_dir, resolve_model_dir

    path = resolve_model_dir(args.model)
    return Codec(path if (path / "model.safetensors").is_file() and not (path / "audio_tokenizer").is_dir()
                 else resolve_codec_dir(path))


def cmd_codec_encode(args) -> int:
    from ..audio import loading

    _check_output(args.output, {"the input": args.input})
    codec = _codec(args)
    wav = loading.load_audio(args.input, codec.sampling_rate)
    codes = codec.encode(wav, codec.sampling_rate)
    _save_npy(args.output, codes)
    _log(args, f"wrote {args.output}: codes {list(codes.shape)} ({codes.shape[1] / codec.frame_rate:.2f} s)")
    return 0


def _save_npy(path, arr) -> None:
    from ..audio import writers

    writers.write_atomic(path, lambda fh: np.save(fh, arr), InputError)


def _load_codes(path, num_codebooks: int, codebook_size: int) -> np.ndarray:
    try:
        codes = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{path}: not a .npy array of codes ({exc})") from None
    if codes.ndim != 2 or codes.dtype.kind not in "iu" or not 1 <= codes.shape[0] <= num_codebooks:
        raise InputError(f"{path}: expected integer codes of shape [codebooks<={num_codebooks}, T], "
                         f"got {codes.dtype} {list(codes.shape)}")
    if codes.size == 0 or codes.min() < 0 or codes.max() >= codebook_size:
        raise InputError(f"{path}: codes must lie in [0, {codebook_size}) and T must be >= 1")
    return codes.astype(np.int64)


def cmd_codec_decode(args) -> int:
    from ..audio import writers

    _check_output(args.output, {"the input": args.input}, AudioError, audio_file=True)
    codec = _codec(args)
    codes = _load_codes(args.input, codec.cfg.num_quantizers, codec.cfg.codebook_size)
    wav = codec.decode(codes)
    writers.write_audio_atomic(args.output, wav, codec.sampling_rate)
    _log(args, f"wrote {args.output}: {len(wav) / codec.sampling_rate:.2f} s")
    return 0


def cmd_codec_roundtrip(args) -> int:
    from ..audio import loading, writers

    _check_output(args.output, {"the input": args.input}, AudioError, audio_file=True)
    codec = _codec(args)
    wav = loading.load_audio(args.input, codec.sampling_rate)
    codes = codec.encode(wav, codec.sampling_rate)
    out = codec.decode(codes)
    writers.write_audio_atomic(args.output, out, codec.sampling_rate)
    _log(args, f"wrote {args.output}: {codes.shape[1]} frames -> {len(out) / codec.sampling_rate:.2f} s")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one `omnicore: error:` line like every other failure
    (argparse prints the whole usage first); sub-command parsers are of this class too."""

    def error(self, message):
        self.exit(2, f"omnicore: error: {message} (see `{self.prog} --help`)\n")


def cmd_serve(args) -> int:
    from .. import server

    if args.max_queue < 1:
        raise InputError(f"--max-queue must be at least 1, got {args.max_queue}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise InputError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    server.serve(args.model, args.host, args.port, args.voices_dir, args.api_key, args.max_queue,
                 log_level="warning" if args.quiet else "info",
                 max_concurrency=args.max_concurrency, ui=args.ui)
    return 0


def _seed(value: str) -> int:
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {value!r}") from None
    if seed < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {seed}")
    return seed


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="omnicore",
        description="OmniVoice text-to-speech (600+ languages, voice cloning and voice design) "
                    "running on numpy: no torch needed.",
        epilog="The first run downloads k2-fsa/OmniVoice (~3.3 GB) into the Hugging Face cache. "
               "Offline smoke test: --model weights/tiny-random (random weights: noise).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_opts(sp):
        sp.add_argument("--model", default=DEFAULT_MODEL,
                        help="checkpoint directory or hub repo id (default: %(default)s; env OMNICORE_MODEL)")
        sp.add_argument("-q", "--quiet", action="store_true", help="no progress or summary on stderr")

    def gen_opts(sp):
        g = sp.add_argument_group("voice and generation")
        g.add_argument("--language", help="language name or code, e.g. English / en (default: agnostic)")
        g.add_argument("--instruct", help="voice design, e.g. 'female, low pitch, british accent'")
        g.add_argument("--duration", type=float, help="fixed output length in seconds (overrides --speed)")
        g.add_argument("--speed", type=float, help="speaking rate factor, >1 faster (default 1.0)")
        g.add_argument("--steps", type=int, default=32, help="unmasking steps (default 32; 16 is faster)")
        g.add_argument("--guidance", type=float, default=2.0, help="classifier-free guidance scale (default 2.0)")
        g.add_argument("--seed", type=_seed, help="random seed (>= 0): same seed, same audio")
        g.add_argument("--greedy", action="store_true",
                       help="deterministic decoding (position and class temperature 0)")
        g.add_argument("--no-denoise", action="store_true", help="omit the <|denoise|> token when cloning")
        g.add_argument("--no-postprocess", action="store_true",
                       help="keep silences; only loudness, fades and padding are applied")
        g.add_argument("--normalize-text", action="store_true",
                       help="read numbers, dates, currency as words first, as the reference's "
                            "normalize_text (needs pip install 'omnicore[tn]')")

    s = sub.add_parser("say", help="synthesise speech to an audio file",
                       description="Synthesise TEXT (or --text-file, or stdin) to an audio file. "
                                   "Voice: automatic, designed with --instruct, or cloned with "
                                   "--ref-audio/--ref-text or --voice. Pauses in the text: "
                                   "[pause:1.5s], [pause:500ms] or <break time=\"2s\"/> (exact "
                                   "silence, at most 60 s each).")
    s.add_argument("text", nargs="?", help="text to speak ('-' or omitted: read stdin)")
    s.add_argument("-o", "--output", help="output file (.wav, .flac, .ogg); required unless --raw")
    s.add_argument("--text-file", help="read the text from this UTF-8 file")
    s.add_argument("--ref-audio", help="reference clip to clone (3-10 s of clean speech)")
    s.add_argument("--ref-text", help="transcript of --ref-audio (required with it)")
    s.add_argument("--voice", help="voice prompt file from `omnicore clone-prompt` (or a .pt "
                                    "saved by omnivoice's VoiceClonePrompt.save)")
    s.add_argument("--stream", action="store_true",
                   help="write audio as it is made: a short first chunk, then sentence by "
                        "sentence; text from stdin is read as it arrives")
    s.add_argument("--raw", action="store_true",
                   help="raw 16-bit mono PCM at 24 kHz (implies --stream) to -o FILE or stdout, "
                        "e.g. | aplay -r 24000 -f S16_LE -c 1")
    s.add_argument("--save-voice", metavar="FILE",
                   help="also keep the voice of the result (auto or designed) as a voice prompt "
                        ".npz: --voice FILE speaks with the same speaker later")
    model_opts(s)
    gen_opts(s)
    s.set_defaults(func=cmd_say)

    c = sub.add_parser("clone-prompt", help="encode a reference clip into a reusable voice file")
    c.add_argument("ref_audio", help="reference clip (any format soundfile reads)")
    c.add_argument("--ref-text", required=True, help="transcript of the clip")
    c.add_argument("-o", "--output", required=True, help="output .npz voice prompt")
    c.add_argument("--no-preprocess", action="store_true", help="skip silence removal and punctuation")
    model_opts(c)
    c.set_defaults(func=cmd_clone_prompt)

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
    model_opts(b)
    gen_opts(b)
    b.set_defaults(func=cmd_batch)

    sc = sub.add_parser(
        "script", help="speak a multi-speaker script ('alice: Hello.' per line) to one file",
        conflict_handler="resolve",  # --instruct takes NAME=INSTRUCT here
        description="Speak SCRIPT, one turn per line as 'speaker: text' (blank lines and lines "
                    "starting with # are skipped), to one audio file, the turns joined by --gap "
                    "seconds of silence; the start/end of every turn go to a JSON file beside "
                    "it (or --timings). Every speaker needs a voice: --voice NAME=FILE, "
                    "--instruct NAME=INSTRUCT, --auto NAME, or a --voices JSON file {\"alice\": "
                    "{\"voice\": \"alice.npz\"}, \"bob\": {\"instruct\": \"male, low pitch\", "
                    "\"seed\": 7}, \"carol\": {\"ref_audio\": \"c.wav\", \"ref_text\": \"...\"}, "
                    "\"dan\": {}} (optional \"seed\", \"language\", \"speed\" per speaker; paths "
                    "relative to the file). A designed or auto speaker is spoken by its first "
                    "turn, which is then kept as its voice for every later turn. With --seed S, "
                    "turn k uses seed S+k unless its speaker has a seed.")
    sc.add_argument("script", help="the script, a UTF-8 text file ('-': stdin)")
    sc.add_argument("-o", "--output", required=True, help="output audio file (.wav, .flac, .ogg)")
    sc.add_argument("--timings", help="per-turn start/end JSON (default: OUTPUT with .json)")
    sc.add_argument("--gap", type=float, default=0.4, help="seconds of silence between turns "
                    "(default 0.4; 0 to 10)")
    sc.add_argument("--voices", help="JSON file: speaker name -> voice (see above)")
    sc.add_argument("--voice", action="append", metavar="NAME=FILE",
                    help="speaker NAME speaks with this voice prompt file (repeatable)")
    model_opts(sc)
    gen_opts(sc)
    sc.add_argument("--instruct", action="append", metavar="NAME=INSTRUCT",
                    help="speaker NAME gets a designed voice, e.g. bob='male, low pitch' "
                         "(repeatable)")
    sc.add_argument("--auto", action="append", metavar="NAME",
                    help="speaker NAME gets an auto voice (repeatable)")
    sc.add_argument("--duration", type=float, help=argparse.SUPPRESS)  # refused: one per turn
    sc.set_defaults(func=cmd_script)

    sv = sub.add_parser("serve", help="an OpenAI-compatible speech server (pip install 'omnicore[server]')",
                        description="Serve POST /v1/audio/speech (OpenAI's API), a voice library, "
                                    "/v1/models, /health and /metrics (and with --ui the demo at "
                                    "/ui) from one model.")
    model_opts(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    sv.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    sv.add_argument("--voices-dir", help="folder of saved voices (.npz), loaded at start")
    sv.add_argument("--api-key", default=os.environ.get("OMNICORE_API_KEY"),
                    help="require 'Authorization: Bearer KEY' (env OMNICORE_API_KEY)")
    sv.add_argument("--max-queue", type=int, default=16,
                    help="speech requests in flight before 429 (default: %(default)s)")
    sv.add_argument("--max-concurrency", type=int,
                    help="requests synthesising at once, the others wait (default: all admitted; "
                         "the engine batches them)")
    sv.add_argument("--ui", action="store_true",
                    help="also serve the Gradio demo at /ui, on the same model (needs a source "
                         "checkout and the demo extra)")
    sv.set_defaults(func=cmd_serve)

    k = sub.add_parser("codec", help="the Higgs audio codec alone: encode, decode, round-trip")
    ksub = k.add_subparsers(dest="codec_command", required=True, metavar="ACTION")
    for name, func, helptext, in_help, out_help in (
            ("encode", cmd_codec_encode, "audio file -> codes .npy [8, T]", "input audio (any rate/channels)", "output .npy"),
            ("decode", cmd_codec_decode, "codes .npy -> 24 kHz audio file", "codes .npy", "output audio file"),
            ("roundtrip", cmd_codec_roundtrip, "audio -> codes -> audio", "input audio", "output audio file")):
        sp = ksub.add_parser(name, help=helptext)
        sp.add_argument("input", help=in_help)
        sp.add_argument("-o", "--output", required=True, help=out_help)
        model_opts(sp)
        sp.set_defaults(func=func)
    _add_reference_commands(sub, model_opts)
    return p


# ------------------------------------------------------------------------------------------------
# The reference's commands: `omnivoice-infer` / `omnivoice-infer-batch` flags, verbatim, run by
# `say` / `batch` (a script ports by changing the command name)
# ------------------------------------------------------------------------------------------------


def _str2bool(value: str) -> bool:
    """The reference's boolean flags: `--denoise False`, `--postprocess_output no`, ..."""
    v = value.lower()
    if v in ("yes", "true", "t", "y", "1"):
        return True
    if v in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"Boolean value expected (true/false, yes/no, 1/0), got {value!r}")


def _select_device(device: str | None) -> None:
    """--device (torch's names) -> omnicore's array backend: cpu -> numpy, cuda[:N] -> CuPy on
    GPU N. The backend is fixed when omnicore.model.backend is first imported, so this runs first."""
    if device is None:  # the reference auto-detects; omnicore keeps OMNICORE_BACKEND (numpy)
        return
    kind, _, index = device.strip().lower().partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise InputError(f"--device {device!r}: omnicore runs on cpu (numpy) or cuda / cuda:N "
                         "(an NVIDIA GPU through CuPy); mps and xpu are not supported")
    backend = "numpy" if kind == "cpu" else "cupy"
    if backend == "cupy":
        import importlib.util

        if importlib.util.find_spec("cupy") is None:
            raise InputError(f"--device {device} runs omnicore on CuPy, which is not installed: "
                             "pip install 'omnicore[gpu]' (needs CUDA 12), or use --device cpu")
    loaded = sys.modules.get("omnicore.model.backend")
    if loaded is None:
        os.environ["OMNICORE_BACKEND"] = backend
    elif loaded.BACKEND != backend:
        raise InputError(f"--device {device}: this process already runs omnicore on "
                         f"{loaded.BACKEND}; set OMNICORE_BACKEND={backend} before starting it")
    if backend == "cupy" and index:
        from ..model.backend import xp

        xp.cuda.Device(int(index)).use()


def cmd_infer(args) -> int:
    """`omnivoice-infer` -> `say` with the same values."""
    _select_device(args.device)
    say = argparse.Namespace(
        text=args.text, output=args.output, text_file=None, ref_audio=args.ref_audio,
        ref_text=args.ref_text, voice=None, stream=False, raw=False, model=args.model,
        quiet=args.quiet, language=args.language, instruct=args.instruct,
        duration=args.duration, speed=args.speed, steps=args.num_step,
        guidance=args.guidance_scale, seed=None, greedy=False, no_denoise=not args.denoise,
        no_postprocess=not args.postprocess_output, t_shift=args.t_shift,
        layer_penalty_factor=args.layer_penalty_factor,
        position_temperature=args.position_temperature,
        class_temperature=args.class_temperature)
    return cmd_say(say)


# omnivoice-infer-batch's multi-GPU scheduling: accepted, without effect here.
_GPU_ONLY = {"nj_per_gpu": 1, "batch_duration": 1000.0, "batch_size": 0, "warmup": 0}


def cmd_infer_batch(args) -> int:
    """`omnivoice-infer-batch` -> `batch` with the same values; --lang_id, when given, replaces
    every line's language_id (as the reference does), null or not."""
    ignored = [f"--{k} {getattr(args, k)}" for k, default in _GPU_ONLY.items()
               if getattr(args, k) != default]
    if ignored:
        _log(args, f"note: {', '.join(ignored)} ignored: they schedule GPU worker processes; "
                   "omnicore runs the jobs one after another in this process")
    batch = argparse.Namespace(
        jsonl=args.test_list, out_dir=args.res_dir, model=args.model, quiet=args.quiet,
        language=args.lang_id, instruct=None, duration=None, speed=None, steps=args.num_step,
        guidance=args.guidance_scale, seed=None, greedy=False, no_denoise=not args.denoise,
        no_postprocess=not args.postprocess_output, t_shift=args.t_shift,
        layer_penalty_factor=args.layer_penalty_factor,
        position_temperature=args.position_temperature,
        class_temperature=args.class_temperature,
        audio_chunk_duration=args.audio_chunk_duration,
        audio_chunk_threshold=args.audio_chunk_threshold,
        preprocess_prompt=args.preprocess_prompt,
        job_overrides={} if args.lang_id is None else {"language": args.lang_id})
    return cmd_batch(batch)


def _add_reference_commands(sub, model_opts) -> None:
    """`infer` and `infer-batch`: the reference's flag names, types and defaults."""
    def knobs(sp):
        sp.add_argument("--num_step", type=int, default=32)
        sp.add_argument("--guidance_scale", type=float, default=2.0)
        sp.add_argument("--t_shift", type=float, default=0.1)
        sp.add_argument("--denoise", type=_str2bool, default=True, metavar="BOOL")
        sp.add_argument("--postprocess_output", type=_str2bool, default=True, metavar="BOOL")
        sp.add_argument("--layer_penalty_factor", type=float, default=5.0)
        sp.add_argument("--position_temperature", type=float, default=5.0)
        sp.add_argument("--class_temperature", type=float, default=0.0)

    fmt = argparse.ArgumentDefaultsHelpFormatter
    i = sub.add_parser("infer", help="omnivoice-infer's flags, verbatim (runs `say`)",
                       formatter_class=fmt,
                       description="A drop-in for the reference's `omnivoice-infer`: the same "
                                   "flags, types and defaults; booleans as --denoise False. "
                                   "Runs `omnicore say`. --ref_audio needs --ref_text (omnicore "
                                   "has no ASR to transcribe the clip).")
    i.add_argument("--text", required=True, help="Text to synthesize.")
    i.add_argument("--output", required=True, help="Output audio file (.wav, .flac, .ogg).")
    i.add_argument("--ref_audio", help="Reference audio file path for voice cloning.")
    i.add_argument("--ref_text", help="Transcript of the reference audio.")
    i.add_argument("--instruct", help="Style instruction for voice design mode.")
    i.add_argument("--language", help="Language name (e.g. 'English') or code (e.g. 'en').")
    i.add_argument("--speed", type=float, default=1.0)
    i.add_argument("--duration", type=float, default=None,
                   help="Fixed output duration in seconds (overrides --speed).")
    knobs(i)
    i.add_argument("--device", default=None,
                   help="cpu (numpy) or cuda / cuda:N (CuPy, the gpu extra); default: "
                        "OMNICORE_BACKEND, else numpy")
    model_opts(i)
    i.set_defaults(func=cmd_infer)

    b = sub.add_parser("infer-batch", help="omnivoice-infer-batch's flags, verbatim (runs `batch`)",
                       formatter_class=fmt,
                       description="A drop-in for the reference's `omnivoice-infer-batch`: the "
                                   "same flags and JSONL test list; writes RES_DIR/<id>.wav. "
                                   "Runs `omnicore batch` (every line is checked before any "
                                   "work; a line with ref_audio needs ref_text).")
    b.add_argument("--test_list", required=True, help="JSONL test list (id, text, ref_audio, "
                   "ref_text, instruct, language_id, duration, speed).")
    b.add_argument("--res_dir", required=True, help="Directory to save the generated audio files.")
    knobs(b)
    b.add_argument("--audio_chunk_duration", type=float, default=15.0)
    b.add_argument("--audio_chunk_threshold", type=float, default=30.0)
    b.add_argument("--preprocess_prompt", type=_str2bool, default=True, metavar="BOOL")
    b.add_argument("--lang_id", default=None,
                   help="Language id for every line (replaces the lines' language_id).")
    for name, default in _GPU_ONLY.items():
        b.add_argument(f"--{name}", type=type(default), default=default,
                       help="accepted for compatibility; no effect (GPU worker scheduling)")
    model_opts(b)
    b.set_defaults(func=cmd_infer_batch)


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP as an exception, raised in the main thread: every writer removes its
    temporary file on the way out, as for Ctrl-C (the default action kills the process on the
    spot, leaving it behind)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_CLEAN_EXIT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _on_signal(signum, frame):
    for sig in _CLEAN_EXIT_SIGNALS:  # a second signal must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise _Terminated(signum)


def _error(msg) -> None:
    print(f"omnicore: error: {msg}", file=sys.stderr)


def main(argv=None) -> int:
    # The handlers belong to the command, not to whoever imports omnicore (or calls main() in a
    # test): installed here, put back on return. Python only allows it in the main thread; a
    # signal the caller ignores (nohup) stays ignored.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _CLEAN_EXIT_SIGNALS:
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                previous[sig] = signal.signal(sig, _on_signal)
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except OmniCoreError as exc:
        _error(exc)
        return 2
    except _Terminated as exc:
        _error(f"terminated ({signal.Signals(exc.signum).name}); no partial output was kept")
        return 128 + exc.signum
    except KeyboardInterrupt:
        _error("interrupted; no partial output was kept")
        return 130
    except MemoryError:
        _error("out of memory; use shorter text or a shorter reference clip")
        return 1
    except OSError as exc:  # omnicore wraps its own file errors; this is e.g. stdin or stderr
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        _error(f"{exc.strerror or exc}{where}")
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
