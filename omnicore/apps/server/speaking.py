"""The one speaking path of every door (the HTTP speech route, the WebSocket, Wyoming, MCP): a
text (whole, or fragments as an LLM writes them) and its voice and settings -> audio, whole or
in pieces as it is made, or a typed refusal (an HTTPError, or omnicore's own errors).

    check_text       the length and has-words checks (protocol.py's: one "nothing to say")
    check_voice      the voice named exists (before admission, off the event loop)
    voice_prompt     the voice resolved inside the admitted slot
    synthesize       the whole utterance, encoded (in a worker thread, admitted)
    open_stream      model.stream over a text or an Utterance's fragments
    pieces           a stream's float32 pieces, read in a worker thread, ending on a cancel or
                     a stopping server
    close_stream     a stream closed in a worker; one cut short is counted as cancelled
    Utterance        text fragments on their way to model.stream, and their cancellation

Each door translates its protocol to and from these; admission is `ServerState.slot`.

Dimensions: N samples of mono float32 audio at SAMPLE_RATE.
"""

from __future__ import annotations

import asyncio
import queue
import time

from ...text import limits
from .formats import encode_audio
from .protocol import check_input_length, check_text, shutting_down
from .state import ServerState, Slot

__all__ = ["MAX_UTTERANCES", "Utterance", "add_fragment", "check_text", "check_voice", "close_stream",
           "new_utterance", "open_stream", "pieces", "synthesize", "voice_prompt", "with_voice"]

_END = object()  # the end of an utterance's input
# Texts started, not cancelled and not yet spoken, per connection (WebSocket, Wyoming): a flood
# of flushes is refused.
MAX_UTTERANCES = 8


async def check_voice(server: ServerState, voice) -> None:
    """Refuse an unknown voice now, before admission (the library is read off the loop)."""
    if voice is not None:
        await server.in_thread(server.check_voice, voice)


async def voice_prompt(server: ServerState, slot: Slot, voice):
    """The voice's prompt (None: the model's auto voice), resolved in the admitted slot (a
    preset is designed on first use, step by step)."""
    if voice is None:
        return None
    return await slot.run(server.voice, voice, slot.on_step)


def with_voice(kw: dict, prompt) -> dict:
    return kw if prompt is None else {**kw, "voice_clone_prompt": prompt}


def synthesize(server: ServerState, text: str, kw: dict, fmt: str, on_step, then=None):
    """The whole utterance and its bytes in `fmt`: (result, data); `then(data)` runs in the
    same worker (a file written). Blocking: run it in an admitted slot."""
    result = server.model.synthesize(text, on_step=on_step, **kw)[0]
    data = encode_audio(result.audio, fmt)
    if then is not None:
        then(data)
    return result, data


async def open_stream(server: ServerState, text, kw: dict):
    """model.stream over `text` (a string, or an Utterance's fragments), started in a worker
    (argument errors raise here, before any audio)."""
    source = text.fragments() if isinstance(text, Utterance) else text
    return await server.in_thread(lambda: server.model.stream(source, **kw))


async def pieces(server: ServerState, stream, slot: Slot, cancelled=None, cut: bool = False):
    """float32 pieces [N] of `stream`, read in a worker thread, until its end or `cancelled()`
    (audio made before a cancel reached the stream is dropped). A stream the server stops ends
    with its 503, or quietly when `cut` (its connection is already dropped)."""
    while True:
        x = await server.in_thread(next, stream, None)
        if slot.stopping:
            if cut:
                return
            raise shutting_down()
        if x is None or (cancelled is not None and cancelled()):
            return
        yield x


def close_stream(server: ServerState, stream):
    """Close `stream` in a worker thread (the future of it); a stream it cuts short (a client
    gone, a cancel, an error, a stopping server) counts once in omnicore_streams_cancelled,
    whichever door and however many closes."""
    def close():
        if stream.close():
            server.m_cancelled.inc()
    return server.pool.submit(close)


class Utterance:
    """One utterance's text on its way to the model's stream, and how it ended."""

    def __init__(self, index: int, gone: asyncio.Future):
        self.index = index
        self.t0 = time.perf_counter()  # its first fragment's arrival: the timings count from it
        self.gone = gone  # resolved when it is cancelled or the client leaves: its slot's `gone`
        self.chars = 0
        self.input_done = False
        self.cancelled = False
        self.done = False  # its audio.done or error has been sent
        self.audio_s = 0.0
        self.stream = None
        self._texts: queue.Queue = queue.Queue()  # fragments, then _END

    def feed(self, text: str) -> None:
        self.chars += len(text)
        self._texts.put(text)

    def end_input(self) -> None:
        if not self.input_done:
            self.input_done = True
            self._texts.put(_END)

    def fragments(self):
        """The fragments as they come (read by the stream's reader thread)."""
        while (item := self._texts.get()) is not _END:
            yield item

    def cancel(self, server: ServerState) -> None:
        """Stop it: no more input, its slot's wait or work ends, its stream closes (the pass on
        the engine leaves before its next step)."""
        self.cancelled = True
        self.end_input()
        if not self.gone.done():
            self.gone.set_result(None)
        if self.stream is not None:
            close_stream(server, self.stream)

    def close(self, server: ServerState) -> None:
        """Spoken or failed: a reader thread waiting for text ends, the stream closes (a no-op
        once it ended)."""
        self.done = True
        self.end_input()
        if self.stream is not None:
            close_stream(server, self.stream)


def new_utterance(index: int, text: str) -> Utterance:
    u = Utterance(index, asyncio.get_running_loop().create_future())
    u.feed(text)
    return u


def add_fragment(u: Utterance | None, pending: str, text: str, server: ServerState):
    """A fragment of a streamed text: (the utterance it extends, or None, and the text still
    waiting for words). An utterance's text over the limit cancels it (refused whole); text
    with nothing to say yet waits. The caller starts an utterance when `pending` has words."""
    if u is not None:
        if u.chars + len(text) > limits.MAX_TEXT_CHARS:
            u.cancel(server)
            check_input_length(u.chars + len(text))
        u.feed(text)
        return u, ""
    pending += text
    check_input_length(len(pending))
    return None, pending
