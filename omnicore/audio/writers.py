"""Every file omnicore writes: one atomic writer, audio formats, and writers for streams.

`AtomicOutput` is the one way a file is written (a unique temporary file in the target's
folder, fsync, rename), so an interrupted write never leaves a half-written target;
`write_audio_atomic` writes a waveform through it, and `AudioFileWriter` / `RawPcmWriter`
write audio as it comes. `to_pcm16` is the one float -> int16 conversion.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import BinaryIO, Callable

import numpy as np

from ..errors import AudioError, OmniCoreError
from ..model.config import SAMPLE_RATE
from ..model.resample import check_rate

# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

_INT_SUBTYPES = ("PCM_16", "PCM_24", "PCM_32", "PCM_S8", "PCM_U8")


def _read_umask() -> int:
    """The process umask, read once at import: the only portable way to ask for it,
    os.umask(0) then restoring it, leaves the umask at 0 for a moment, and a file another thread
    creates in that moment (the demo serves requests on threads) would be world-writable. Linux
    shows it in /proc/self/status, which changes nothing."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Mode of every file omnicore writes, what open() would give a new file. A umask changed
# after import is not seen; nothing in omnicore changes it.
_FILE_MODE = 0o666 & ~_read_umask()
_MAX_PREFIX = 64  # characters of the target's name kept in the temporary file's name


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def check_output_path(path: str | os.PathLike, error: type[OmniCoreError] = AudioError,
                      follow_links: bool = True) -> str:
    """The real path a new file for `path` goes to (symbolic links followed, so a link keeps
    pointing at the new file), or `error` if it cannot be written there: its folder is missing,
    or `path` names a folder, a device, a FIFO or a socket (replacing those by a regular file is
    never what was meant, and reading from a FIFO blocks). An existing regular file is fine: it
    is replaced. With `follow_links` False, a link as the file itself is refused instead of
    followed (the rename that commits a write replaces a link, never writes through one): a
    server writing only into its own folder."""
    import stat

    raw = os.fspath(path)
    if not isinstance(raw, str):
        raw = os.fsdecode(raw)
    if not raw:
        raise error("no output file name given (an empty path)")
    if raw.endswith(("/", os.sep)):
        raise error(f"cannot write {raw!r}: it is a folder name, not a file name; add a file name")
    if "\0" in raw:
        raise error(f"cannot write {raw!r}: a file name cannot contain a NUL character")
    if follow_links:
        target = os.path.realpath(raw)
    else:  # the folder's real path, the name as given
        target = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(raw))),
                              os.path.basename(raw))
        if os.path.islink(target):
            raise error(f"cannot write {raw!r}: it is a symbolic link; give another file name")
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise error(f"cannot write {raw!r}: folder {folder!r} {what}; create the folder first "
                    "or write somewhere else")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise error(f"cannot write {raw!r} ({_reason(exc)}); write somewhere else") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(f"cannot write {raw!r}: it is a folder; give a file name inside it")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device")
        raise error(f"cannot write {raw!r}: it is {kind}, not a regular file; give a file name")
    return target


class AtomicOutput:
    """A file that appears at `path` complete or not at all, for writers that produce it in
    pieces. The bytes go to `fh`, a new temporary file with a unique name in the target's folder
    (so two writers of one path never share it, and the rename stays on one file system);
    `commit()` flushes, syncs, sets the mode a new file would get and renames it over the target;
    `abort()` (or an exception leaving a `with` block) removes it. Failures raise `error` (the
    caller's typed error) saying what could not be written and why.
    """

    def __init__(self, path: str | os.PathLike, error: type[OmniCoreError] = AudioError,
                 follow_links: bool = True):
        self.error = error
        self.path = os.fspath(path)
        self.target = check_output_path(self.path, error, follow_links)
        self._tmp = None
        self.fh = None
        name = os.path.basename(self.target)[:_MAX_PREFIX]
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp",
                                             dir=os.path.dirname(self.target))
            self.fh = os.fdopen(fd, "wb")
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise error(f"cannot write {self.path!r}: no file can be created in folder "
                            f"{os.path.dirname(self.target)!r} ({_reason(exc)}); write somewhere "
                            "else") from None
            raise

    def failed(self, exc: BaseException) -> OmniCoreError:
        """The typed error for a failed write (to raise)."""
        return self.error(f"could not write {self.path!r} ({_reason(exc)}); check the folder is "
                          "writable and the disk has space")

    def commit(self) -> None:
        if self._tmp is None:
            raise self.error(f"{self.path!r} was already committed or aborted")
        try:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self.fh.close()
            os.chmod(self._tmp, _FILE_MODE)
            os.replace(self._tmp, self.target)
            self._tmp = None
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise self.failed(exc) from None
            raise
        _sync_folder(os.path.dirname(self.target))

    def abort(self) -> None:
        """Remove the temporary file (idempotent; never raises)."""
        fh, self.fh = self.fh, None
        if fh is not None:
            try:
                fh.close()
            except Exception:  # a failed flush of a file being thrown away
                pass
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def __enter__(self) -> "AtomicOutput":
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def remove_stale_temporaries(folder: str | os.PathLike, names, min_age_s: float = 0.0) -> int:
    """Remove the temporary files `AtomicOutput` left in `folder` for targets named `names` (a
    writer killed mid-write, e.g. a SIGKILLed worker, cannot remove its own). Only for a caller
    that knows no writer of those names is running, or, with `min_age_s`, that none has been
    writing one for that long (a file untouched that long is no live writer's). Returns how many
    were removed."""
    prefixes = {name[:_MAX_PREFIX] for name in names}
    removed = 0
    now = time.time()
    for entry in os.scandir(folder):
        name = entry.name
        if not (name.startswith(".") and name.endswith(".tmp")) or not entry.is_file(follow_symlinks=False):
            continue
        prefix = name[1:-4].rpartition(".")[0]  # .<prefix>.<random>.tmp (mkstemp's name)
        if prefix in prefixes and now - entry.stat(follow_symlinks=False).st_mtime >= min_age_s:
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


def _sync_folder(folder: str) -> None:
    """Make the rename itself durable; best effort (some file systems refuse a folder fsync)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None],
                 error: type[OmniCoreError] = AudioError, follow_links: bool = True) -> None:
    """Write a file in one go through `AtomicOutput`: `write(fh)` gets the open binary temporary
    file. `path` ends up the complete new file or untouched; nothing else is left behind. Any
    failure (the folder, the disk, `write` itself) raises `error`; typed errors from `write`
    pass through as they are. `follow_links`: see check_output_path."""
    with AtomicOutput(path, error, follow_links) as out:
        try:
            write(out.fh)
        except OmniCoreError:
            raise
        except Exception as exc:
            raise out.failed(exc) from None


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """`data` written to `path` through `write_atomic` (an OmniCoreError where it cannot be)."""
    write_atomic(path, lambda fh: fh.write(data), OmniCoreError)


def audio_format(path: str | os.PathLike) -> tuple[str, str]:
    """(format, subtype) soundfile writes for `path`'s extension: WAV, FLAC and the like as
    16-bit PCM, others (.ogg, ...) at libsndfile's default. AudioError for an extension no
    audio format has, so a typo fails before any work is done."""
    import soundfile as sf

    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lstrip(".").upper()
    if ext not in sf.available_formats() or ext == "RAW":
        known = ", ".join("." + f.lower() for f in ("WAV", "FLAC", "OGG"))
        raise AudioError(f"cannot tell the audio format of {path!r}; use an extension such as {known}")
    subtype = "PCM_16" if ext in ("WAV", "WAVEX", "FLAC", "AIFF", "RF64", "W64") else sf.default_subtype(ext)
    return ext, subtype


def write_audio_atomic(path: str | os.PathLike, wav: np.ndarray, sr: int = SAMPLE_RATE,
                       subtype: str | None = None) -> None:
    """Write `wav` ([L] mono or [C, L]) to `path` so that `path` is either the complete new
    file or untouched (see `write_atomic`).

    The format comes from the extension (.wav, .flac, .ogg, ... anything libsndfile writes);
    WAV and FLAC default to 16-bit PCM. Float samples are clipped to [-1, 1] for integer
    formats. Raises AudioError for an unknown extension, bad samples, a path that is a folder or
    device or in a missing folder, or a failed write.
    """
    import soundfile as sf

    sr = check_rate("sample rate", sr)
    path = os.fspath(path)
    check_output_path(path, AudioError)  # "it is a folder" says more than "no format"
    ext, default_subtype = audio_format(path)
    subtype = subtype or default_subtype
    data = np.asarray(wav, dtype=np.float32)
    if data.ndim == 2:
        data = data.T  # [C, L] -> [L, C], soundfile's layout
    elif data.ndim != 1:
        raise AudioError(f"audio to write must be [samples] or [channels, samples], got {data.shape}")
    if data.size == 0:
        raise AudioError(f"refusing to write empty audio to {path!r}")
    if not np.isfinite(data).all():
        raise AudioError(f"audio for {path!r} contains NaN or infinite samples; nothing was written")
    if subtype in _INT_SUBTYPES:
        data = np.clip(data, -1.0, 1.0)
    write_atomic(path, lambda fh: sf.write(fh, data, sr, format=ext, subtype=subtype), AudioError)


def to_pcm16(x: np.ndarray) -> np.ndarray:
    """float32 -> little-endian int16 samples as soundfile writes a PCM_16 WAV (floor of
    x * 32768, clipped to the int16 range; measured): the one conversion of output audio to
    16 bits, so raw output, WAV files and the demo's player hold the same samples. NaN -> 0."""
    scaled = np.floor(np.nan_to_num(np.asarray(x, np.float32)) * np.float32(32768))
    return np.clip(scaled, -32768, 32767).astype("<i2")


# ---------------------------------------------------------------------------------------------
# Writers: audio to a file or a pipe as it comes
# ---------------------------------------------------------------------------------------------


class RawPcmWriter:
    """Raw 16-bit little-endian mono PCM to a binary stream (e.g. stdout for
    `| aplay -r 24000 -f S16_LE -c 1`), flushed after every piece."""

    def __init__(self, fh):
        self.fh = fh
        self.samples = 0

    def write(self, x: np.ndarray) -> None:
        self.fh.write(to_pcm16(x).tobytes())
        self.fh.flush()
        self.samples += len(x)

    def commit(self) -> None:
        self.fh.flush()

    def abort(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest) -> None:
        self.abort() if exc_type else self.commit()


class AudioFileWriter:
    """Write audio pieces to `path` as they come, atomically (through `AtomicOutput`): the
    samples go to a temporary file in the same folder (for WAV, a header whose sizes libsndfile
    fixes up on close); `commit()` flushes, syncs and renames it over `path`; `abort()` (or an
    exception leaving a `with` block) removes it, so `path` is never half written. The format
    follows the extension (.wav, .flac, .ogg, ...; .raw / .pcm or raw=True: headerless 16-bit
    PCM); WAV and FLAC are 16-bit, samples clipped. The path is checked here, before any audio
    is made."""

    def __init__(self, path, sr: int = SAMPLE_RATE, *, raw: bool = False):
        import os

        import soundfile as sf

        self.path = os.fspath(path)
        self.sr = sr
        self.samples = 0
        self._sf = self._out = None
        ext = os.path.splitext(self.path)[1].lstrip(".").upper()
        self._raw = raw or ext in ("RAW", "PCM")
        check_output_path(self.path, AudioError)  # "it is a folder" says more than "no format"
        if not self._raw:
            try:
                ext, subtype = audio_format(self.path)
            except AudioError:
                raise AudioError(f"cannot tell the audio format of {self.path!r}; use an extension "
                                 "such as .wav, .flac, .ogg (or .raw for headerless PCM)") from None
            self._int = subtype.startswith("PCM")
        self._out = AtomicOutput(self.path, AudioError)
        try:
            if not self._raw:
                self._sf = sf.SoundFile(self._out.fh, "w", samplerate=sr, channels=1, format=ext,
                                        subtype=subtype)
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise self._out.failed(exc) from None
            raise

    def write(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float32)
        if not np.isfinite(x).all():
            self.abort()
            raise AudioError(f"audio for {self.path!r} contains NaN or infinite samples; nothing was written")
        if self._out is None:
            raise AudioError(f"{self.path!r} was already committed or aborted")
        try:
            if self._sf is None:
                self._out.fh.write(to_pcm16(x).tobytes())
            else:
                self._sf.write(np.clip(x, -1.0, 1.0) if self._int else x)
        except BaseException as exc:
            err = self._out.failed(exc)
            self.abort()
            if isinstance(exc, Exception):
                raise err from None
            raise
        self.samples += len(x)

    def commit(self) -> None:
        if self.samples == 0:
            self.abort()
            raise AudioError(f"refusing to write empty audio to {self.path!r}")
        if self._out is None:
            raise AudioError(f"{self.path!r} was already committed or aborted")
        out = self._out
        try:
            if self._sf is not None:
                self._sf.close()  # writes the final header sizes
        except BaseException as exc:
            self.abort()
            if isinstance(exc, Exception):
                raise out.failed(exc) from None
            raise
        self._out = None
        out.commit()  # removes the temporary file itself on failure

    def abort(self) -> None:
        """Remove the temporary file (idempotent; never raises)."""
        sfile, self._sf = self._sf, None
        try:
            if sfile is not None and not sfile.closed:
                sfile.close()
        except Exception:  # a header that cannot be finished: the file is thrown away anyway
            pass
        out, self._out = self._out, None
        if out is not None:
            out.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest) -> None:
        self.abort() if exc_type else self.commit()
