"""The page's fixed words and style: the intro and its "How it works" fold, the captions, the
CSS and the head script, and the tables of timings a run reports (from a `Synthesis` or a
`SpeechStream`: every number comes from the library's own measurements)."""

from __future__ import annotations

from omnicore import GenerationConfig

GEN = GenerationConfig()


_STAGE_NAMES = {
    "encode": "encode (reference clip to codes)",
    "prepare": "prepare (text, language, prompt)",
    "unmask": "unmask (iterative decoding)",
    "decode": "decode (codes to waveform)",
    "postprocess": "post-process (trim, loudness, fades)",
}

INTRO = ("# omnicore · OmniVoice text-to-speech\n"
         "Type, press **Generate**, hear it: 600+ languages, a cloned or a described voice, on "
         "plain numpy (no torch).")

HOW_IT_WORKS = """\
OmniVoice writes speech as a grid of codec tokens: **8 codebooks × 25 frames per second**. It
starts from a fully masked grid and, step by step, fills in the cells it is most sure of, looking
at the whole utterance at once (a bidirectional transformer, not left-to-right). A codec then
turns the grid into a 24 kHz waveform. The **Unmasking view** at the bottom of the page shows the
order in which the grid was written (for a run made in one piece: untick *Stream* in the
settings). Write `[pause:1.5s]` or `<break time="500ms"/>` in the text for exactly that much
silence, and press **Keep this voice** to speak on with a voice you designed (it goes to the
*Voice clone* tab). *Voice design* takes the picked attributes or a short description ("a calm
elderly man with a deep voice") and says what it understood.
"""

UNMASKING_CAPTION = f"""\
**How to read it.** Each cell is one code (row = codebook, column = 40 ms frame); its colour is
the step that filled it, **dark = early, yellow = late**.
* **Schedule**: every step may fill a budget of cells taken from a shifted time grid (the
  *schedule shift*, {GEN.t_shift:g} by default): very few cells at first, most of them in the
  last steps (left chart). Fewer steps mean bigger jumps.
* **Layer penalty**: a cell's confidence is lowered by `layer penalty × codebook index`, so the
  coarse codebook 0 settles first and the fine-detail codebooks 5-7 last (right chart). Set the
  penalty to 0 in *Unmasking knobs* and the rows mix.
* **Confidence ordering**: within a step's budget the model takes the cells whose predicted
  token has the highest (classifier-free-guided) log-probability; the *position temperature*
  adds random noise to that ranking so the order is spread over time. Set it to 0 to see the
  pure confidence order.
"""

PAUSE_HELP = ('Pauses: [pause:1.5s], [pause:500ms] or <break time="2s"/> give exactly that '
              "much silence (at most 60 s each).")

# Pictures at their own size (never scaled up; scaled down smoothly on a narrow screen); table
# headers break between words only; picker values end before the arrow (which gradio draws over
# the input), with a little more room on a phone (app.picker_width sizes the voice pickers).
CSS = """
#unmasking-view img, #waveform-view img { width: auto; max-width: 100%; height: auto;
  object-fit: contain; }
#instruct-status { min-height: 1.5em; }
#timings th, #timings td { white-space: nowrap; word-break: normal; }
.omni-picker input { padding-right: 24px; text-overflow: ellipsis; }
@media (max-width: 480px) { #settings, .omni-picker { padding-left: 4px;
  padding-right: 4px; } }
.omni-footer, .omni-note { font-size: 0.85em; opacity: 0.8; }
"""

# Alt text for the pictures (gradio's Image has no alt of its own), and, on a narrow screen, a
# scroll to the output when Generate is pressed (it sits below the inputs there).
HEAD = """<script>
(() => {
  const alts = {
    "waveform-view": "Waveform and spectrogram of the generated speech",
    "unmasking-view": "Unmasking view: each code cell coloured by the step that filled it"};
  new MutationObserver(() => {
    for (const [id, alt] of Object.entries(alts))
      document.querySelectorAll(`#${id} img`).forEach(img => {
        if (img.alt !== alt) img.alt = alt; });
  }).observe(document.documentElement, {subtree: true, childList: true});
})();
</script>"""
SCROLL_TO_OUTPUT = """() => { if (window.innerWidth < 768)
  document.querySelector('#result')?.scrollIntoView({behavior: 'smooth', block: 'start'}); }"""


def timings_table(result, sample_rate: int, seed: int, wall_s: float,
                      estimated_s: float | None = None) -> str:
    audio_s = len(result.audio) / float(sample_rate)
    order = list(_STAGE_NAMES) + [k for k in result.timings if k not in _STAGE_NAMES]
    lines = ["| stage | seconds |", "|---|---:|"]
    for stage in order:
        if stage in result.timings:
            lines.append(f"| {_STAGE_NAMES.get(stage, stage)} | {result.timings[stage]:.3f} |")
    lines.append(f"| **total** (wall clock of the request) | **{wall_s:.3f}** |")
    rtf = wall_s / audio_s if audio_s > 0 else float("inf")
    C, T = result.codes.shape
    chunks = len(result.text_chunks)
    lines += ["", f"**{audio_s:.2f} s** of audio from {C} × {T} codes in {wall_s:.2f} s: "
              f"**RTF {rtf:.2f}** ({'faster' if rtf < 1 else 'slower'} than real time; "
              f"RTF = compute time / audio time) · {result.num_steps} steps"
              f"{f' per chunk × {chunks} text chunks' if chunks > 1 else ''} · seed **{seed}**"]
    if estimated_s is not None:
        lines += ["", f"Estimated before the run: {estimated_s:.2f} s; it took {wall_s:.2f} s."]
    return "\n".join(lines)


STREAMED_NOT_KEPT = ("A streamed result cannot be kept as a voice (a stream does not hand back "
                     "its codes): untick streaming, generate, then keep the voice.")


def stream_timings(stream, audio_s: float, seed: int, wall_s: float,
                             estimated: tuple[float, float] | None = None) -> str:
    """What a SpeechStream measured: time to first audio, then unmask / decode per text chunk."""
    lines = ["| chunk | text | frames | unmask s | decode s |", "|---:|---|---:|---:|---:|"]
    for k, st in enumerate(stream.chunk_stats):
        text = st["text"] if len(st["text"]) <= 40 else st["text"][:37] + "..."
        lines.append(f"| {k} | {text.replace('|', '/')} | {st.get('frames', '')} | "
                     f"{st.get('unmask_s', 0.0):.3f} | {st.get('decode_s', 0.0):.3f} |")
    rtf = wall_s / audio_s if audio_s > 0 else float("inf")
    first, n = stream.first_audio_s, len(stream.chunk_stats)
    lines += ["", f"**Streamed**: first audio after **{first:.2f} s**" if first is not None
              else "**Streamed**: no audio", "",
              f"**{audio_s:.2f} s** of audio in {wall_s:.2f} s: **RTF {rtf:.2f}** "
              f"· {n} text chunk{'s' if n != 1 else ''} · seed **{seed}**", ""]
    if estimated is not None:
        lines += [f"Estimated before the run: first audio after {estimated[0]:.2f} s, all of it "
                  f"after {estimated[1]:.2f} s.", ""]
    lines += ["No unmasking view for a streamed run (a stream does not report the fill steps): "
              "untick Stream in the settings and generate again to see it."]
    return "\n".join(lines)
