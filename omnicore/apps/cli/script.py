"""`omnicore script`: a multi-speaker script ('alice: Hello.' per line) spoken to one audio file,
with the start and end of every turn beside it (omnicore.apps.script does the work)."""

from __future__ import annotations

import argparse
import sys
import time

from ...errors import AudioError, InputError
from . import common
from .options import add_generation_options, gen_kwargs


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
    common.check_output(args.output, inputs, AudioError, audio_file=True)
    common.check_output(timings, {**inputs, "--output": args.output}, InputError)
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
    model = common.load_model(args)
    kw = gen_kwargs(args)
    for key in ("instruct", "duration"):
        kw.pop(key, None)

    def on_turn(k: int, n: int, line) -> None:
        common.log(args, f"turn {k + 1}/{n} (line {line.line}, {line.speaker})")

    t0 = time.perf_counter()
    result = script.synthesize_script(model, text, speakers, gap=args.gap, on_turn=on_turn, **kw)
    elapsed = time.perf_counter() - t0
    script.write_script_outputs(result, args.output, timings)
    secs = len(result.audio) / result.sample_rate
    common.log(args, f"wrote {args.output} ({secs:.2f} s, {len(result.turns)} turns in {elapsed:.1f} s) "
                     f"and {timings}")
    return 0


def add_parser(sub) -> None:
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
    common.add_model_options(sc)
    add_generation_options(sc)
    sc.add_argument("--instruct", action="append", metavar="NAME=INSTRUCT",
                    help="speaker NAME gets a designed voice, e.g. bob='male, low pitch' "
                         "(repeatable)")
    sc.add_argument("--auto", action="append", metavar="NAME",
                    help="speaker NAME gets an auto voice (repeatable)")
    sc.add_argument("--duration", type=float, help=argparse.SUPPRESS)  # refused: one per turn
    sc.set_defaults(func=cmd_script)
