"""The speech route's audio formats: whole files, and what a stream sends piece by piece (a WAV
header of unknown sizes, then 16-bit samples; Ogg Opus page by page; mp3 and aac frame by frame).

wav, flac and opus go through libsndfile; mp3 and aac through FFmpeg's encoders (PyAV, the
`server` extra), which write a stream that never goes back: an mp3 stream of frames (no Xing
header, whose counts are only known at the end) and aac in ADTS frames, as OpenAI sends them.

Dimensions: N samples of mono float32 audio in [-1, 1] at SAMPLE_RATE.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from ...audio import writers
from ...errors import AudioError
from ...model.config import SAMPLE_RATE

# response_format -> (container, codec, media type): libsndfile's container and subtype, or
# FFmpeg's muxer and encoder for those in FFMPEG; pcm is raw 16-bit samples.
FORMATS = {"wav": ("WAV", "PCM_16", "audio/wav"), "flac": ("FLAC", "PCM_16", "audio/flac"),
           "mp3": ("mp3", "libmp3lame", "audio/mpeg"), "opus": ("OGG", "OPUS", "audio/ogg"),
           "aac": ("adts", "aac", "audio/aac"), "pcm": (None, None, "audio/pcm")}
FFMPEG = ("mp3", "aac")
FFMPEG_BIT_RATE = 64_000  # mono speech at 24 kHz: transparent enough, and light on a slow link
# What a stream sends piece by piece, as each chunk is made; flac is encoded whole (its
# header's sizes and checksum are written at the end).
PIECEWISE = ("wav", "pcm", "opus", "mp3", "aac")


def encoder_missing(fmt: str) -> str | None:
    """Why `fmt` cannot be encoded here (its library is not installed), or None."""
    import importlib.util

    if fmt in FFMPEG and importlib.util.find_spec("av") is None:
        return f"response_format {fmt!r} needs PyAV (FFmpeg's encoders): pip install 'omnicore[server]'"
    return None


def wav_stream_header(sr: int = SAMPLE_RATE) -> bytes:
    """A 16-bit mono WAV header whose sizes are unknown (0xFFFFFFFF): what streaming players
    accept for audio whose length is not known when the first bytes leave."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sr, sr * 2, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


def encode_audio(wav: np.ndarray, fmt: str, sr: int = SAMPLE_RATE) -> bytes:
    """Whole audio [N] -> bytes of `fmt`; pcm is writers.to_pcm16's samples, mp3 and aac the
    stream encoder's bytes for one piece (the same bytes a stream of it sends), the rest via
    libsndfile."""
    if fmt == "pcm":
        return writers.to_pcm16(wav).tobytes()
    if fmt in FFMPEG:
        enc = FFmpegStream(fmt, sr)
        return enc.write(wav) + enc.close()
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
    """The bytes a stream of `fmt` sends for audio pieces [N] (an async iterator): wav, pcm,
    opus, mp3 and aac as each piece comes (wav after a header of unknown sizes), flac as one
    file at the end (see OpusStream). `in_thread(fn, *args)` runs the encoders off the event
    loop."""
    if fmt in ("opus", *FFMPEG):
        enc = OpusStream() if fmt == "opus" else FFmpegStream(fmt)
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
    back, so the bytes handed out so far are those of the whole file. (Its flac writer rewrites
    the header at the end, and a header left as first written makes libsndfile misjudge the
    length: flac is encoded whole.)"""

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


class _Pipe:
    """What FFmpeg writes into: bytes appended, no seek (so its muxers write a stream that never
    goes back), taken as they come."""

    def __init__(self):
        self.buf = bytearray()

    def write(self, data) -> int:
        self.buf += data
        return len(data)

    def take(self) -> bytes:
        data = bytes(self.buf)
        self.buf.clear()
        return data


class FFmpegStream:
    """mp3 or aac encoded piece by piece through PyAV: each piece's complete frames leave at
    once (the encoder keeps less than a frame, 1152 or 1024 samples, for the next piece)."""

    def __init__(self, fmt: str, sr: int = SAMPLE_RATE):
        import av

        muxer, codec, _ = FORMATS[fmt]
        self._av, self._sr, self._pts = av, sr, 0
        self._pipe = _Pipe()
        # flush_packets: every frame reaches the pipe at once, not when FFmpeg's buffer fills;
        # id3v2_version 0: an mp3 stream of frames alone.
        options = {"flush_packets": "1", **({"id3v2_version": "0"} if fmt == "mp3" else {})}
        self._container = av.open(self._pipe, "w", format=muxer, options=options)
        self._stream = self._container.add_stream(codec, rate=sr, layout="mono")
        self._stream.bit_rate = FFMPEG_BIT_RATE

    def _mux(self, frame) -> bytes:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._pipe.take()

    def write(self, wav: np.ndarray) -> bytes:
        """Encode a piece [N]; returns the bytes of the frames complete now (maybe none)."""
        x = np.clip(np.asarray(wav, np.float32), -1.0, 1.0)[None]  # [N] -> [1, N]
        if x.shape[1] == 0:
            return b""
        frame = self._av.AudioFrame.from_ndarray(x, format="flt", layout="mono")
        frame.sample_rate, frame.pts = self._sr, self._pts
        self._pts += x.shape[1]
        return self._mux(frame)

    def close(self) -> bytes:
        """The encoder's last frames and the stream's end."""
        data = self._mux(None)
        self._container.close()
        return data + self._pipe.take()
