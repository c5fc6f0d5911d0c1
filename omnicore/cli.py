"""The `omnicore` command line.

    omnicore say "Hello there." -o hello.wav                    # auto voice
    omnicore say "Hello." --instruct "female, low pitch" -o a.wav   # voice design
    omnicore say "Hello." --ref-audio me.wav --ref-text "..." -o b.wav  # voice cloning
    omnicore clone-prompt me.wav --ref-text "..." -o me.npz     # save a voice, reuse with --voice
    llm ... | omnicore say --stream --raw | aplay -r 24000 -f S16_LE -c 1   # speak as text arrives
    omnicore batch jobs.jsonl --out-dir out/                    # many utterances
    omnicore codec encode in.wav -o codes.npy | decode codes.npy -o out.wav | roundtrip in.wav -o rt.wav

Errors from omnicore (bad text, missing weights, unreadable audio, ...) are printed as one
message without a traceback, and the exit status is non-zero. Outputs are written atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from .errors import InputError, OmniCoreError

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
    from .pipeline import OmniVoice

    t0 = time.perf_counter()
    model = OmniVoice.from_pretrained(args.model)
    _log(args, f"loaded {args.model} in {time.perf_counter() - t0:.1f} s")
    return model


def _log(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr)


def _gen_kwargs(args) -> dict:
    kw = dict(language=args.language, instruct=args.instruct, duration=args.duration,
              speed=args.speed, num_step=args.steps, guidance_scale=args.guidance, seed=args.seed,
              denoise=not args.no_denoise, postprocess_output=not args.no_postprocess)
    if args.greedy:
        kw.update(position_temperature=0.0, class_temperature=0.0)
    return kw


def cmd_say(args) -> int:
    from . import audio
    from .pipeline import VoiceClonePrompt

    from .text import validate_text

    if args.raw or args.stream:
        return _say_stream(args)
    if args.output is None:
        raise InputError("say needs -o/--output FILE (or --stream --raw for PCM on stdout)")
    text = validate_text(_read_text(args))  # fail before the (slow) model load
    model = _load_model(args)
    kw = _gen_kwargs(args)
    _voice_kwargs(args, kw, VoiceClonePrompt)
    t0 = time.perf_counter()
    result = model.synthesize(text, on_step=_progress(not args.quiet), **kw)[0]
    elapsed = time.perf_counter() - t0
    audio.write_audio_atomic(args.output, result.audio, model.sampling_rate)
    secs = len(result.audio) / model.sampling_rate
    _log(args, f"wrote {args.output}: {secs:.2f} s of audio in {elapsed:.1f} s "
               f"(RTF {elapsed / max(secs, 1e-9):.2f}, {result.codes.shape[1]} frames, "
               f"{len(result.text_chunks)} chunk(s))")
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
    from . import streaming
    from .pipeline import VoiceClonePrompt
    from .text import validate_text

    if args.text_file or (args.text is not None and args.text != "-"):
        source = validate_text(_read_text(args))  # fail before the (slow) model load
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
        writer = streaming.RawPcmWriter(sys.stdout.buffer)
    else:
        writer = streaming.AudioFileWriter(args.output, 24000, raw=args.raw)  # checks the path first
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
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except BaseException:
        writer.abort()
        raise
    elapsed = time.perf_counter() - t0
    secs = writer.samples / model.sampling_rate
    _log(args, f"wrote {'stdout' if to_stdout else args.output}: {secs:.2f} s of audio in "
               f"{elapsed:.1f} s (RTF {elapsed / max(secs, 1e-9):.2f}, {len(st.text_chunks)} "
               f"chunk(s), first audio after {st.first_audio_s or 0:.2f} s)")
    return 0


def cmd_clone_prompt(args) -> int:
    model = _load_model(args)
    prompt = model.create_voice_clone_prompt(args.ref_audio, ref_text=args.ref_text,
                                             preprocess_prompt=not args.no_preprocess)
    prompt.save(args.output)
    _log(args, f"wrote {args.output}: {prompt.ref_audio_tokens.shape[1]} frames, "
               f"text {prompt.ref_text!r}")
    return 0


_BATCH_FIELDS = {"id", "text", "ref_audio", "ref_text", "instruct", "language_id", "duration", "speed"}


def cmd_batch(args) -> int:
    from . import audio

    jobs = []
    try:
        lines = Path(args.jsonl).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {args.jsonl}: {exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            job = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{args.jsonl}:{n}: invalid JSON ({exc.msg})") from None
        if not isinstance(job, dict) or not isinstance(job.get("id"), str) or not isinstance(job.get("text"), str):
            raise InputError(f"{args.jsonl}:{n}: each line needs string fields \"id\" and \"text\"")
        if not job["id"] or "/" in job["id"] or "\\" in job["id"] or job["id"].startswith("."):
            raise InputError(f"{args.jsonl}:{n}: id {job['id']!r} is not a plain file name")
        extra = set(job) - _BATCH_FIELDS
        if extra:
            raise InputError(f"{args.jsonl}:{n}: unknown field(s) {sorted(extra)}; "
                             f"known: {sorted(_BATCH_FIELDS)}")
        jobs.append(job)
    if not jobs:
        raise InputError(f"{args.jsonl}: no jobs")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = _load_model(args)
    base = _gen_kwargs(args)
    failed = 0
    for k, job in enumerate(jobs, 1):
        kw = dict(base)
        kw.update(language=job.get("language_id", args.language),
                  instruct=job.get("instruct", args.instruct),
                  duration=job.get("duration", args.duration), speed=job.get("speed", args.speed))
        if job.get("ref_audio"):
            kw.update(ref_audio=job["ref_audio"], ref_text=job.get("ref_text"))
        target = out_dir / f"{job['id']}.wav"
        try:
            wav = model.generate(job["text"], **kw)[0]
            audio.write_audio_atomic(target, wav, model.sampling_rate)
            _log(args, f"[{k}/{len(jobs)}] {target}")
        except OmniCoreError as exc:
            failed += 1
            print(f"[{k}/{len(jobs)}] {job['id']}: error: {exc}", file=sys.stderr)
    return 1 if failed else 0


def _codec(args):
    from .pipeline import Codec
    from .weights import resolve_codec_dir, resolve_model_dir

    path = resolve_model_dir(args.model)
    return Codec(path if (path / "model.safetensors").is_file() and not (path / "audio_tokenizer").is_dir()
                 else resolve_codec_dir(path))


def cmd_codec_encode(args) -> int:
    from . import audio

    codec = _codec(args)
    wav = audio.load_audio(args.input, codec.sampling_rate)
    codes = codec.encode(wav, codec.sampling_rate)
    _save_npy(args.output, codes)
    _log(args, f"wrote {args.output}: codes {list(codes.shape)} ({codes.shape[1] / codec.frame_rate:.2f} s)")
    return 0


def _save_npy(path, arr) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, arr)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


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
    from . import audio

    codec = _codec(args)
    codes = _load_codes(args.input, codec.cfg.num_quantizers, codec.cfg.codebook_size)
    wav = codec.decode(codes)
    audio.write_audio_atomic(args.output, wav, codec.sampling_rate)
    _log(args, f"wrote {args.output}: {len(wav) / codec.sampling_rate:.2f} s")
    return 0


def cmd_codec_roundtrip(args) -> int:
    from . import audio

    codec = _codec(args)
    wav = audio.load_audio(args.input, codec.sampling_rate)
    codes = codec.encode(wav, codec.sampling_rate)
    out = codec.decode(codes)
    audio.write_audio_atomic(args.output, out, codec.sampling_rate)
    _log(args, f"wrote {args.output}: {codes.shape[1]} frames -> {len(out) / codec.sampling_rate:.2f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
        g.add_argument("--seed", type=int, help="random seed: same seed, same audio")
        g.add_argument("--greedy", action="store_true",
                       help="deterministic decoding (position and class temperature 0)")
        g.add_argument("--no-denoise", action="store_true", help="omit the <|denoise|> token when cloning")
        g.add_argument("--no-postprocess", action="store_true",
                       help="keep silences; only loudness, fades and padding are applied")

    s = sub.add_parser("say", help="synthesise speech to an audio file",
                       description="Synthesise TEXT (or --text-file, or stdin) to an audio file. "
                                   "Voice: automatic, designed with --instruct, or cloned with "
                                   "--ref-audio/--ref-text or --voice.")
    s.add_argument("text", nargs="?", help="text to speak ('-' or omitted: read stdin)")
    s.add_argument("-o", "--output", help="output file (.wav, .flac, .ogg); required unless --raw")
    s.add_argument("--text-file", help="read the text from this UTF-8 file")
    s.add_argument("--ref-audio", help="reference clip to clone (3-10 s of clean speech)")
    s.add_argument("--ref-text", help="transcript of --ref-audio (required with it)")
    s.add_argument("--voice", help="voice prompt file from `omnicore clone-prompt`")
    s.add_argument("--stream", action="store_true",
                   help="write audio as it is made: a short first chunk, then sentence by "
                        "sentence; text from stdin is read as it arrives")
    s.add_argument("--raw", action="store_true",
                   help="raw 16-bit mono PCM at 24 kHz (implies --stream) to -o FILE or stdout, "
                        "e.g. | aplay -r 24000 -f S16_LE -c 1")
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
                                   "\"speed\" (the reference's batch format). Writes OUT_DIR/<id>.wav.")
    b.add_argument("jsonl")
    b.add_argument("--out-dir", required=True)
    model_opts(b)
    gen_opts(b)
    b.set_defaults(func=cmd_batch)

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
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except OmniCoreError as exc:
        print(f"omnicore: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("omnicore: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
