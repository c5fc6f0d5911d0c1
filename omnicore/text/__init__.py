"""Text in: input limits, the front-end (languages, instructs, duration), normalisation, and the
planner that cuts a text into generation passes (and the stream's chunker)."""
