"""`omnicore say` (one text to one audio file, or streamed as it is made) and
`omnicore clone-prompt` (a reference clip kept as a reusable voice file)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ...errors import AudioError, InputError, VoicePromptError
from ...model.config import SAMPLE_RATE
from . import common
from .options import add_field_option, add_generation_options, gen_kwargs
from .progress import StatusLine, SynthesisProgress


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


def _say_inputs(args) -> dict:
    return {"--ref-audio": args.ref_audio, "--voice": args.voice, "--text-file": args.text_file}


def _say_text(args) -> str:
    """The text to speak, checked (length, pause marks) before the (slow) model load."""
    from ...text.planner import split_pauses
    from ...text.limits import validate_text

    text = validate_text(_read_text(args))
    split_pauses(text)
    return text


def cmd_say(args) -> int:
    from ...audio import writers
    from ...pipeline import VoiceClonePrompt

    save_voice = getattr(args, "save_voice", None)
    if save_voice and (args.raw or args.stream):
        raise InputError("--save-voice keeps the voice of a whole result; it does not go with "
                         "--stream or --raw (run without them to keep the voice)")
    if args.raw or args.stream:
        return _say_stream(args)
    if args.output is None:
        raise InputError("say needs -o/--output FILE (or --stream --raw for PCM on stdout)")
    common.check_output(args.output, _say_inputs(args), AudioError, audio_file=True)
    if save_voice:
        common.check_output(save_voice, {**_say_inputs(args), "--output": args.output},
                            VoicePromptError)
    text = _say_text(args)  # fail before the (slow) model load
    model = common.load_model(args)
    kw = gen_kwargs(args)
    _voice_kwargs(args, kw, VoiceClonePrompt)
    status = StatusLine(args)
    progress = SynthesisProgress(status, getattr(args, "compile_seconds", None))
    t0 = time.perf_counter()
    try:
        result = model.synthesize(text, on_step=progress.on_step if status.live else None,
                                  _on_passes=progress.plan, **kw)[0]
    finally:
        status.close()
    elapsed = time.perf_counter() - t0
    voice = result.as_voice() if save_voice else None  # refused (too long) before any write
    writers.write_audio_atomic(args.output, result.audio, model.sampling_rate)
    secs = len(result.audio) / model.sampling_rate
    common.log(args, f"wrote {args.output}: {secs:.2f} s of audio in {elapsed:.1f} s "
                     f"(RTF {elapsed / max(secs, 1e-9):.2f}, {result.codes.shape[1]} frames, "
                     f"{len(result.text_chunks)} chunk(s))")
    if voice is not None:
        voice.save(save_voice)
        common.log(args, f"wrote {save_voice}: this voice ({voice.ref_audio_tokens.shape[1]} frames), "
                         f"reuse it with --voice {save_voice}")
    return 0


def _voice_kwargs(args, kw: dict, prompt_cls) -> None:
    if args.voice:
        prompt = prompt_cls.load(args.voice)
        problem = prompt.pace_problem()  # e.g. a reference .pt, made without this check
        if problem:
            common.warn(f"{args.voice}: {problem}")
        kw["voice_clone_prompt"] = prompt
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
    from ...audio import writers
    from ...pipeline import VoiceClonePrompt

    if args.text_file or (args.text is not None and args.text != "-"):
        source = _say_text(args)  # fail before the (slow) model load
    elif sys.stdin.isatty():
        raise InputError("no text given: pass TEXT, --text-file FILE, or pipe text on stdin")
    else:
        source = _stdin_fragments()  # each sentence is spoken as soon as it is complete
    to_stdout = args.output in (None, "-")
    if to_stdout and not args.raw:
        raise InputError("--stream to stdout needs --raw (16-bit PCM); or give -o FILE")
    kw = gen_kwargs(args)
    _voice_kwargs(args, kw, VoiceClonePrompt)
    if to_stdout:
        writer = writers.RawPcmWriter(sys.stdout.buffer)
    else:
        common.check_output(args.output, _say_inputs(args), AudioError)
        writer = writers.AudioFileWriter(args.output, SAMPLE_RATE, raw=args.raw)  # checks the path first
    try:
        model = common.load_model(args)
        t0 = time.perf_counter()
        st = model.stream(source, **kw)
        try:
            for piece in st:
                writer.write(piece)
                if writer.samples == len(piece):
                    common.log(args, f"first audio after {time.perf_counter() - t0:.2f} s")
        finally:
            st.close()
        writer.commit()
    except BrokenPipeError:  # the player went away: main() ends quietly
        raise
    except OSError as exc:
        if not to_stdout:
            writer.abort()
            raise
        common.drop_stdout()
        raise AudioError(f"cannot write PCM to stdout ({exc.strerror or exc})") from None
    except BaseException:
        writer.abort()
        raise
    elapsed = time.perf_counter() - t0
    secs = writer.samples / model.sampling_rate
    common.log(args, f"wrote {'stdout' if to_stdout else args.output}: {secs:.2f} s of audio in "
                     f"{elapsed:.1f} s (RTF {elapsed / max(secs, 1e-9):.2f}, {len(st.text_chunks)} "
                     f"chunk(s), first audio after {st.first_audio_s or 0:.2f} s)")
    return 0


def cmd_clone_prompt(args) -> int:
    common.check_output(args.output, {"the reference clip": args.ref_audio}, VoicePromptError)
    model = common.load_model(args)
    prompt = model.create_voice_clone_prompt(args.ref_audio, ref_text=args.ref_text,
                                             preprocess_prompt=args.preprocess_prompt)
    prompt.save(args.output)
    common.log(args, f"wrote {args.output}: {prompt.ref_audio_tokens.shape[1]} frames, "
                     f"text {prompt.ref_text!r}")
    return 0


def add_parsers(sub) -> None:
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
    common.add_model_options(s)
    add_generation_options(s)
    s.set_defaults(func=cmd_say)

    c = sub.add_parser("clone-prompt", help="encode a reference clip into a reusable voice file")
    c.add_argument("ref_audio", help="reference clip (any format soundfile reads)")
    c.add_argument("--ref-text", required=True, help="transcript of the clip")
    c.add_argument("-o", "--output", required=True, help="output .npz voice prompt")
    add_field_option(c, "preprocess_prompt", "--no-preprocess")
    common.add_model_options(c)
    c.set_defaults(func=cmd_clone_prompt)
