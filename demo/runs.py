"""What a press on Generate does: the page's values as the API's arguments, a run in one piece
or streamed ("Piece k of n", the final outputs from the same pieces), Stop, and a failure as one
line in the page's words (visitor.py). Every number shown comes from a `Synthesis` result or a
`SpeechStream`'s own measurements; the estimate before the run is presets.py's."""

from __future__ import annotations

import secrets
import shutil
import sys
import time
import traceback

import gradio as gr
import numpy as np

from omnicore.audio.writers import to_pcm16
from omnicore.errors import InputError, OmniCoreError
from omnicore.text import limits
from omnicore.text.planner import ChunkRule, split_text

import presets
import visitor
from stopping import Board, Stopped
from visuals import render_unmasking, render_waveform
from wording import GEN, STREAMED_NOT_KEPT, stream_timings, timings_table  # GEN: the API's defaults

AUTO_LANGUAGE = "auto"  # the language picker's "Auto (from the text)"
WAVE_WIDTH = 640  # the waveform picture's width: about what the output column shows
# How the page's streams cut text: the library's rule (benchmarks/README.md, "Space", has the
# measurements that chose it).
STREAM_RULE = ChunkRule()


def fail(exc: Exception, text_cap: int = limits.MAX_TEXT_CHARS) -> gr.Error:
    """A run's failure as one visitor-worded line (visitor.py: no parameter, command or path);
    the library's own message goes to the server log, where a developer can read it."""
    if not isinstance(exc, OmniCoreError):
        traceback.print_exc()  # unexpected: keep the details in the server log for a bug report
    else:
        print(f"input refused: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    field, line = visitor.visitor_line(exc, text_cap)
    return gr.Error(line, title=f"Check the {field}", duration=20, print_exception=False)


def pick_seed(seed) -> int:
    """-1 (or empty) = a random seed; other values go to the API, which checks them."""
    if seed is None or seed < 0:
        return secrets.randbelow(2**31)
    return seed


def as_number(value, name: str, default=None, integer: bool = False):
    """A panel value as a float (or int); an API client may send anything, so anything else
    is an InputError naming the field rather than a crash."""
    if value is None or value == "":
        return default
    try:
        number = float(value)
        if integer:
            if number != int(number):
                raise ValueError
            return int(number)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be a {'whole ' if integer else ''}number, got "
                         f"{value!r}") from None
    return number


def api_kwargs(language, num_step, guidance_scale, speed, duration, seed, denoise,
              postprocess_output, t_shift, layer_penalty_factor, position_temperature,
              class_temperature, profile="exact") -> dict:
    """Shared-panel values -> keyword arguments of OmniVoice.synthesize; the API applies the
    limits (omnicore.text) and says what is wrong."""
    duration = as_number(duration, "duration", 0.0)
    speed = as_number(speed, "speed", 1.0)
    return dict(
        language=None if language in (None, "", AUTO_LANGUAGE) else language,
        num_step=as_number(num_step, "steps", GEN.num_step, integer=True),
        guidance_scale=as_number(guidance_scale, "guidance scale", GEN.guidance_scale),
        duration=duration if duration > 0 else None,  # a fixed duration overrides speed
        speed=speed if duration <= 0 and speed != 1.0 else None,
        seed=pick_seed(as_number(seed, "seed", None, integer=True)), denoise=bool(denoise),
        postprocess_output=bool(postprocess_output),
        t_shift=as_number(t_shift, "t_shift", GEN.t_shift),
        layer_penalty_factor=as_number(layer_penalty_factor, "layer penalty",
                                       GEN.layer_penalty_factor),
        position_temperature=as_number(position_temperature, "position temperature",
                                       GEN.position_temperature),
        class_temperature=as_number(class_temperature, "class temperature",
                                    GEN.class_temperature),
        profile=profile or "exact",  # "fast": approximate (the API refuses another name)
    )


def checked_api_kwargs(*values) -> dict:
    try:
        return api_kwargs(*values)
    except OmniCoreError as exc:
        raise fail(exc) from None


def shown_outputs(model, result, seed: int, wall_s: float, estimated_s: float | None = None):
    sr = model.sampling_rate
    return ((sr, to_pcm16(result.audio)), render_waveform(result.audio, sr, width=WAVE_WIDTH),
            render_unmasking(result.fill_steps, result.num_steps),
            timings_table(result, sr, seed, wall_s, estimated_s))


def keepable(result):
    """What "Keep this voice" saves for a result: its voice prompt, or why there is none."""
    try:
        return result.as_voice()
    except OmniCoreError as exc:  # e.g. longer than a voice prompt may be
        return f"This result cannot be kept as a voice: {exc}"


def progress_hook(progress):
    def on_step(step: int, num_steps: int) -> None:
        progress((step, num_steps), desc="Unmasking", unit="steps")
    return on_step


class Runs:
    """The runs of one page: its model, its estimate (a presets.Tracker, or None when the page
    was not measured), its text cap, whether numbers can be read as words here, and each
    session's running synthesis (for its Stop button)."""

    def __init__(self, model, tracker, text_cap: int, can_normalize: bool):
        self.model, self.tracker, self.text_cap = model, tracker, text_cap
        self.can_normalize = can_normalize
        self.board = Board()

    def planned(self, streamed: bool, text, kwargs):
        """(the request's planned work, its (first audio, all of it) estimate), or Nones (not
        measured, or bad input: the run itself says what is wrong)."""
        if self.tracker is None:
            return None, None
        try:
            work = presets.planned_work(self.model, text, streamed=streamed, rule=STREAM_RULE,
                                        **kwargs)
            return work, presets.estimate(self.tracker.rate, work)
        except Exception:  # noqa: BLE001 - an estimate never stops a run
            return None, None

    def run(self, progress, run_state=None, **kwargs):
        """One piece: `synthesize`, its progress per unmasking step; a Stop ends it at the
        next step (the outputs say so and nothing else changes)."""
        seed = kwargs["seed"]
        work, estimated = self.planned(False, kwargs["text"],
                                       {k: v for k, v in kwargs.items() if k != "text"})
        report = progress_hook(progress) if progress is not None else None

        def on_step(step, total):
            if run_state is not None:
                run_state.on_step(step, total)
            if report is not None:
                report(step, total)
        t0 = time.perf_counter()
        try:
            result = self.model.synthesize(on_step=on_step, **kwargs)[0]
        except Stopped:
            return (gr.skip(), gr.skip(), gr.skip(), run_state.report()), gr.skip()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, never a trace
            raise fail(exc, self.text_cap) from None
        wall_s = time.perf_counter() - t0
        if work is not None:
            self.tracker.observe(work, result.timings["unmask"], result.timings["decode"])
        estimated_s = estimated[1] if estimated else None
        return shown_outputs(self.model, result, seed, wall_s, estimated_s), keepable(result)

    def run_streamed(self, progress, run_state, text, **kwargs):
        """Yield every piece of `model.stream` to the streaming player ("Piece k of n" on the
        progress bar), then the final outputs (audio and waveform from the concatenated pieces;
        no unmasking view: see the notes). A Stop closes the stream: what was made is kept."""
        seed, sr = kwargs["seed"], self.model.sampling_rate
        work, estimated = self.planned(True, text, kwargs)
        n = sum(isinstance(c, str) for c in split_text(text, STREAM_RULE)) or 1
        t0 = time.perf_counter()
        pieces = []
        try:
            progress((0, n), desc=f"Piece 1 of {n}", unit="pieces")
            with self.model.stream(text, rule=STREAM_RULE, on_step=run_state.on_step,
                                   **kwargs) as stream:
                run_state.on_close(stream.close)
                for piece in stream:
                    pieces.append(piece)
                    k = max(len(stream.chunk_stats), 1)
                    progress((k, n), desc=f"Piece {min(k + 1, n)} of {n}", unit="pieces")
                    yield (gr.skip(), gr.skip(), gr.skip(), gr.skip(), (sr, to_pcm16(piece)),
                           gr.skip())
        except Stopped:
            pass  # the stream's worker met the stop at a step: what was made is kept
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message, never a trace
            raise fail(exc, self.text_cap) from None
        wall_s = time.perf_counter() - t0
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        if run_state.asked:
            yield (((sr, to_pcm16(audio)) if len(audio) else gr.skip()),
                   render_waveform(audio, sr, width=WAVE_WIDTH) if len(audio) else gr.skip(),
                   gr.skip(), run_state.report(), gr.skip(), STREAMED_NOT_KEPT)
            return
        if work is not None:
            stats = stream.chunk_stats
            self.tracker.observe(work, sum(st["unmask_s"] for st in stats),
                                 sum(st["decode_s"] for st in stats))
        yield ((sr, to_pcm16(audio)), render_waveform(audio, sr, width=WAVE_WIDTH), None,
               stream_timings(stream, len(audio) / float(sr), seed, wall_s, estimated),
               gr.skip(), STREAMED_NOT_KEPT)

    def dispatch(self, streamed: bool, progress, request, text, **kwargs):
        """The endpoints are generators: one final yield without streaming (the same outputs
        `run` returns, and nothing for the streaming player), one yield per piece with it. The
        last output is the session's kept-voice state (what "Keep this voice" saves). The run
        is on the board under the visitor's session while it goes, for their Stop button."""
        problem = self.text_problem(text)
        if problem:
            raise gr.Error(problem, title="Check the text", print_exception=False)
        session = getattr(request, "session_hash", None)
        run_state = self.board.start(session)
        try:
            if streamed:
                if shutil.which("ffmpeg") is None:  # gradio encodes the streamed pieces with it
                    raise gr.Error("Streaming is not available on this server: untick Stream "
                                   "in the settings.", title="Check the settings",
                                   print_exception=False)
                yield from self.run_streamed(progress, run_state, text, **kwargs)
            else:  # the streaming player is left alone (given None it shows a paused stream)
                outputs, kept = self.run(progress, run_state, text=text, **kwargs)
                yield (*outputs, gr.skip(), kept)
        finally:
            self.board.end(session, run_state)

    def stop(self, request: gr.Request):
        """Stop this session's running synthesis at the engine's next step; say where."""
        stopped = self.board.stop(getattr(request, "session_hash", None))
        return stopped.report() if stopped is not None else "Nothing of yours is running."

    def text_problem(self, text) -> str | None:
        """The text's problem in the page's words (empty, or over this page's cap), or None."""
        if not isinstance(text, str) or not text.strip():
            return "Type some text to speak."
        if len(text) > self.text_cap:
            return f"The text is too long: at most {self.text_cap:,} characters here."
        return None

    def normalize_flag(self, value) -> bool:
        """Refuse "Read numbers as words", in the page's words, where it cannot work here."""
        if value and not self.can_normalize:
            raise gr.Error("Reading numbers as words is not available on this server.",
                           title="Check the settings", print_exception=False)
        return bool(value)
