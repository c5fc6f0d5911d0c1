"""The speech route's audio formats: whole files through libsndfile, and what a stream sends
piece by piece (a WAV header of unknown sizes, then 16-bit samples; Ogg Opus page by page).

Dimensions: N samples of mono float32 audio in [-1, 1] at SAMPLE_RATE.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from ..audio import writers
from ..errors import AudioError
from ..model.config import SAMPLE_RATE

# response_format -> (libsndfile container, subtype, media type); pcm is raw 16-bit samples.
FORMATS = {"wav": ("WAV", "PCM_16", "audio/wav"), "flac": ("FLAC", "PCM_16", "audio/flac"),
           "mp3": ("MP3", "MPEG_LAYER_III", "audio/mpeg"), "opus": ("OGG", "OPUS", "audio/ogg"),
           "pcm": (None, None, "audio/pcm")}
# What a stream sends piece by piece, as each chunk is made; the others are encoded whole.
PIECEWISE = ("wav", "pcm", "opus")


def wav_stream_header(sr: int = SAMPLE_RATE) -> bytes:
    """A 16-bit mono WAV header whose sizes are unknown (0xFFFFFFFF): what streaming players
    accept for audio whose length is not known when the first bytes leave."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sr, sr * 2, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


def encode_audio(wav: np.ndarray, fmt: str, sr: int = SAMPLE_RATE) -> bytes:
    """Whole audio [N] -> bytes of `fmt`; pcm is writers.to_pcm16's samples, the rest via
    libsndfile."""
    if fmt == "pcm":
        return writers.to_pcm16(wav).tobytes()
    import soundfile as sf

    container, subtype, _ = FORMATS[fmt]
    buf = io.BytesIO()
    data = np.clip(np.asarray(wav, np.float32), -1.0, 1.0)
    sf.write(buf, data, sr, format=container, subtype=subtype)
    return buf.getvalue()


class _Sink:
    """A seekable in-memory file for libsndfile that notes a write before `given`, the bytes
    already handed out (a stream cannot take those back)."""

    def __init__(self):
        self.buf, self.pos, self.given, self.rewrote = bytearray(), 0, 0, False

    def write(self, data) -> int:
        data = bytes(data)
        self.rewrote |= self.pos < self.given
        self.buf[self.pos:self.pos + len(data)] = data
        self.pos += len(data)
        return len(data)

    def read(self, n: int = -1) -> bytes:
        end = len(self.buf) if n is None or n < 0 else self.pos + n
        data = bytes(self.buf[self.pos:end])
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset + (0, self.pos, len(self.buf))[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos


async def encoded(fmt: str, pieces, in_thread):
    """The bytes a stream of `fmt` sends for audio pieces [N] (an async iterator): wav, pcm and
    opus as each piece comes (wav after a header of unknown sizes), mp3 and flac as one file at
    the end (see OpusStream). `in_thread(fn, *args)` runs the encoders off the event loop."""
    if fmt == "opus":
        enc = OpusStream()
        async for x in pieces:
            data = await in_thread(enc.write, x)
            if data:
                yield data
        yield await in_thread(enc.close)
        return
    if fmt not in PIECEWISE:
        parts = [x async for x in pieces]
        wav = np.concatenate(parts) if parts else np.zeros(0, np.float32)  # [N]
        yield await in_thread(encode_audio, wav, fmt)
        return
    if fmt == "wav":
        yield wav_stream_header()
    async for x in pieces:
        yield writers.to_pcm16(x).tobytes()


class OpusStream:
    """Ogg Opus encoded piece by piece: libsndfile writes its pages as they fill and never goes
    back, so the bytes handed out so far are those of the whole file. (Its mp3 and flac writers
    rewrite their header at the end, and a header left as first written makes libsndfile misjudge
    the length: those formats are encoded whole.)"""

    def __init__(self, sr: int = SAMPLE_RATE):
        import soundfile as sf

        container, subtype, _ = FORMATS["opus"]
        self._sink = _Sink()
        self._file = sf.SoundFile(self._sink, "w", sr, 1, format=container, subtype=subtype)

    def _take(self) -> bytes:
        if self._sink.rewrote:
            raise AudioError("the opus encoder rewrote bytes that were already sent")
        data = bytes(self._sink.buf[self._sink.given:])
        self._sink.given = len(self._sink.buf)
        return data

    def write(self, wav: np.ndarray) -> bytes:
        """Encode a piece [N]; returns the bytes that are final now (maybe none)."""
        self._file.write(np.clip(np.asarray(wav, np.float32), -1.0, 1.0))
        return self._take()

    def close(self) -> bytes:
        """The rest of the file."""
        self._file.close()
        return self._take()
