"""The voice library on disk: the one store of the server's voices and of the consent
recordings that authorise cloned ones, shared by every route, and by every server process
pointed at the same folder.

    <name>.npz            a voice prompt (VoiceClonePrompt.save), or <name>.pt (the reference's)
    <name>.voice.json     the voice's record: label, type, creation time, design prompt, consent,
                          made_by (the checkpoint that made it: voices.py)
    <name>.consent.<ext>  the consent recording kept with the voice it authorises
    consents/<id>.json    a consent: label, language, creation time, its recording's file
    consents/<id>.<ext>   the recording, as uploaded
    policy.json           the folder's policy: {"require_consent": true} (absent: none)

The folder is the truth: every read looks at it (a prompt is parsed again only when its file
changed), so servers sharing the folder see each other's voices at once. Every change happens
under one lock file (`.lock`, flock: exclusive across threads, processes and, on NFS, hosts),
and every file is written atomically (audio/writers.py). A voice exists once its prompt file
does, which is written last and removed first, so concurrent creates and deletes of one name
leave it whole or absent, never half there. Without a folder the library lives in a private
temporary one; the servers give it `default_folder()` instead, so their voices outlive them.

Nothing outside the folder is the library's: a record, prompt or recording that is a symlink
out of it is skipped like a damaged file (never read, copied in, or removed through), and a
`consents/` that leads out of the folder holds no consents.

The policy is the folder's, not a process's: a folder that requires consent refuses a cloned
voice without one from every server on it, whatever flags that server was started with
(`add`). Every record is checked when read (types, finite numbers): a bad one is skipped
with a warning, costing its own entry, never the list it is in.

Dimensions: a prompt's codes are [C, T] (C codebooks, T frames).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path

from ...audio import writers
from ...errors import OmniCoreError, VoicePromptError
from ...machinery.checkpoint import open_regular, read_regular
from .protocol import HTTPError

try:
    import fcntl
except ImportError:  # not POSIX: only this process's threads are excluded
    fcntl = None

VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # matched whole (fullmatch)
CONSENT_ID = re.compile(r"cons_[0-9a-f]{24}")
PROMPT_EXTS = (".npz", ".pt")  # an .npz (omnicore's own) wins over a .pt of the same name
CONSENTS = "consents"
LOCK = ".lock"
POLICY = "policy.json"
VOICE_TYPES = ("audio_sample", "prompt")
# A write's temporary file untouched this long is debris of a writer that died mid-write (a
# write takes milliseconds; one from outside the library, e.g. `omnicore clone-prompt -o` into
# the folder, takes no lock).
STALE_TEMP_S = 60.0
PUBLIC_CONSENT = ("id", "object", "name", "language", "created_at")  # OpenAI's VoiceConsent
MAX_RECORD_BYTES = 64 * 1024  # a record is a few hundred bytes; a larger file is not one
log = logging.getLogger("uvicorn.error")
_reported: set[tuple] = set()  # damaged records already logged: (path, mtime, size)


def _write_json(path: Path, data: dict) -> None:
    writers.write_atomic(path, lambda fh: fh.write(json.dumps(data).encode("utf-8")),
                         OmniCoreError)


def read_record(path: Path) -> dict | None:
    """The JSON object in a record file (a voice's record, a consent), or None when there is
    none. The one reader of records, safe on a shared folder: a file that is not a record (a
    FIFO or device, which would block a read forever; over MAX_RECORD_BYTES; not JSON; nested
    too deep to parse; not an object) is None too, and logged once. It costs its own entry,
    never the list it is in."""
    if not os.path.lexists(path):
        return None
    try:
        raw = read_regular(path, MAX_RECORD_BYTES, OmniCoreError)
        if len(raw) > MAX_RECORD_BYTES:
            data, problem = None, f"over {MAX_RECORD_BYTES:,} bytes"
        else:
            data = json.loads(raw)
            problem = None if isinstance(data, dict) else "not a JSON object"
            if problem is None:  # JSON can spell a lone surrogate that no answer can encode
                json.dumps(data, ensure_ascii=False).encode("utf-8")
    except OmniCoreError as exc:
        data, problem = None, str(exc)
    except UnicodeEncodeError:
        data, problem = None, "holds an unpaired surrogate (\\ud800-\\udfff), which is not text"
    except (ValueError, RecursionError):
        data, problem = None, "not a JSON object (malformed, or nested too deep)"
    if problem is None:
        return data
    _report(path, problem)
    return None


def _int_time(value) -> bool:
    """A creation time as records hold it: whole seconds (NaN, 1e999, 1.5 or true are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 63


def _consent_problem(rec: dict) -> str | None:
    """What is wrong with a consent as records hold it (OpenAI's fields and its recording's
    file name), or None."""
    for key in PUBLIC_CONSENT:
        if key not in rec:
            return f"no {key!r}"
    if not isinstance(rec["id"], str) or not CONSENT_ID.fullmatch(rec["id"]):
        return "'id' is not a consent id"
    for key in ("object", "name", "language", "recording"):
        if not isinstance(rec.get(key), str):
            return f"{key!r} is not a string"
    if not _int_time(rec["created_at"]):
        return "'created_at' is not a whole number of seconds"
    return None


def _voice_problem(rec: dict) -> str | None:
    """What is wrong with a voice's record (the fields `add` writes), or None."""
    if not isinstance(rec.get("name"), str):
        return "'name' is not a string"
    if rec.get("type") not in VOICE_TYPES:
        return f"'type' is not one of {VOICE_TYPES}"
    if not _int_time(rec.get("created_at")):
        return "'created_at' is not a whole number of seconds"
    if not isinstance(rec.get("prompt", ""), str):
        return "'prompt' is not a string"
    consent = rec.get("consent")
    if consent is not None:
        problem = _consent_problem(consent) if isinstance(consent, dict) else "not an object"
        if problem:
            return f"'consent': {problem}"
    return None


def consent_required() -> HTTPError:
    """A cloned voice without a consent, in a folder that requires one (every door's 400)."""
    return HTTPError(400, "this voice library requires the speaker's consent for a cloned "
                          "voice", "consent", "consent_required", hint="give_consent")


def default_folder() -> Path:
    """Where the servers keep their voices without --voices-dir: OMNICORE_VOICES_DIR, else
    the user's data folder, $XDG_DATA_HOME/omnicore/voices (~/.local/share/omnicore/voices
    without it; XDG ignores a relative one)."""
    chosen = os.environ.get("OMNICORE_VOICES_DIR", "")
    if chosen.strip():
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_DATA_HOME", "")
    data = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return data / "omnicore" / "voices"


def _report(path: Path, problem: str) -> None:
    try:
        st = os.lstat(path)
    except OSError:  # gone meanwhile: nothing to report
        return
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _reported:
        if len(_reported) > 4096:  # a bound, whatever a folder holds
            _reported.clear()
        _reported.add(key)
        log.warning("Voice library: %s is skipped (%s)", path, problem)


def _temporary_targets(folder: Path) -> set[str]:
    """The voice files (`<name>.npz`, `<name>.voice.json`, ...) that have a write's temporary
    file (`.<file>.<random>.tmp`) in `folder`."""
    found = set()
    for p in folder.glob(".*.tmp"):
        target = p.name[1:-len(".tmp")].rpartition(".")[0]
        if VOICE_NAME.fullmatch(target.split(".")[0]):
            found.add(target)
    return found


def _copy_atomic(source: Path, target: Path) -> None:
    with os.fdopen(open_regular(source, OmniCoreError), "rb") as src:  # a FIFO would block
        writers.write_atomic(target, lambda fh: shutil.copyfileobj(src, fh), OmniCoreError)


def _plain(path: Path) -> bool:
    """Not a folder (what the library may remove: a folder someone made there is left)."""
    return path.is_symlink() or not path.is_dir()


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


class VoiceLibrary:
    """Named voice prompts with their records, and consent recordings, in one folder (see the
    module's docstring); thread- and process-safe."""

    def __init__(self, folder: str | Path | None, require_consent: bool | None = None):
        """`require_consent`: True sets the folder's policy to require consent for cloned
        voices, False lifts it (logged), None keeps what the folder says."""
        from ...voice import VoiceClonePrompt

        self._cls = VoiceClonePrompt
        self._tmp = None
        self.persistent = folder is not None  # without a folder, voices die with the process
        if folder is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="omnicore-voices-")
            folder = self._tmp.name
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / CONSENTS).mkdir(exist_ok=True)
        self._real = os.path.realpath(self.folder)  # what "in the folder" means
        self._thread_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._cache: dict[str, tuple[tuple, object]] = {}  # name -> (its file's stat, prompt)
        # A prompt file that failed to load -> its stat then: not parsed again until it changes
        # (a hostile file would cost its parse on every list).
        self._failed: dict[Path, tuple] = {}
        # Voice prompts asked for (`get` of an existing voice) and parsed from their files, by
        # name: what /metrics reports as the prompt cache's hit rate (once per process per file).
        self.lookups: collections.Counter = collections.Counter()
        self.loads: collections.Counter = collections.Counter()
        self._making: dict[str, threading.Lock] = {}
        with self._locked():
            self.removed_temporaries = writers.remove_stale_temporaries(
                self.folder, _temporary_targets(self.folder), STALE_TEMP_S)
            self._remove_orphans()
        if require_consent is not None:
            self.set_require_consent(require_consent)

    # -- the lock and the folder ----------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        """Exclusive use of the folder for one change, against this process's threads and
        every other process on the folder (the flock goes with the descriptor's close)."""
        with self._thread_lock:
            fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _inside(self, path: Path) -> bool:
        """Whether `path`, its symlinks followed, lies in the folder (what the library may
        read, copy or remove through)."""
        return os.path.realpath(path).startswith(self._real + os.sep)

    def _remove_orphans(self) -> None:
        """What a process killed mid-change left (a record or consent copy without its prompt,
        a recording without its consent's record, an interrupted write's temporary file in
        consents/). Under the lock: no change is half done now. A `consents/` that leads out
        of the folder is not swept: nothing outside the folder is the library's to remove."""
        for p in list(self.folder.glob("*.voice.json")) + list(self.folder.glob("*.consent.*")):
            name = p.name.split(".")[0]
            if VOICE_NAME.fullmatch(name) and self._prompt_path(name) is None and _plain(p):
                _unlink(p)
        folder = self.folder / CONSENTS
        if folder.is_symlink() or not self._inside(folder):
            log.warning("Voice library: %s leads out of the folder; its consents are not "
                        "read, and nothing in it is removed", folder)
            return
        for p in folder.iterdir():
            if (p.suffix != ".json" and not (folder / f"{p.name.split('.')[0]}.json").exists()
                    and _plain(p)):
                _unlink(p)

    # -- the folder's policy -----------------------------------------------------------------------

    @property
    def require_consent(self) -> bool:
        """Whether the folder requires a consent for a cloned voice (read now: a policy set by
        another server on the folder holds at once). A policy file that cannot be read
        requires it: a damaged file never opens the folder."""
        path = self.folder / POLICY
        if not os.path.lexists(path):
            return False
        rec = read_record(path) if self._inside(path) else None
        value = None if rec is None else rec.get("require_consent")
        if isinstance(value, bool):
            return value
        if rec is not None:
            _report(path, "'require_consent' is not true or false; consent is required until "
                          "--require-consent or --no-require-consent rewrites it")
        return True

    def set_require_consent(self, value: bool) -> None:
        """Set the folder's policy (for every server on it); a lift is logged."""
        path = self.folder / POLICY
        with self._locked():
            if not os.path.lexists(path) and not value:
                return
            was = self.require_consent
            held = read_record(path)  # a damaged file is rewritten whatever it says
            if held is not None and held.get("require_consent") is bool(value):
                return
            _write_json(path, {"require_consent": bool(value)})
        if was and not value:
            log.warning("Voice library: %s no longer requires consent for cloned voices "
                        "(--no-require-consent), for every server on it", self.folder)

    def _record_path(self, name: str) -> Path:
        return self.folder / f"{name}.voice.json"

    def _prompt_path(self, name: str) -> Path | None:
        for ext in PROMPT_EXTS:
            path = self.folder / f"{name}{ext}"
            if path.is_file():
                return path
        return None

    # -- voices ---------------------------------------------------------------------------------

    @staticmethod
    def check_name(name, param: str = "name") -> str:
        """The one check of a voice's name, wherever one arrives (a path, a JSON or form field):
        matched whole, so "alloy\n" is not alloy; a 400 naming `param` otherwise."""
        if not isinstance(name, str) or not VOICE_NAME.fullmatch(name):
            raise HTTPError(400, "a voice name is 1-64 characters of letters, digits, '_' or "
                                 f"'-', starting with a letter or digit; got {repr(name)[:80]}", param,
                            "invalid_voice_name")
        return name

    def names(self) -> list[str]:
        return [name for name, _ in self.items()]

    def items(self) -> list[tuple[str, object]]:
        """(name, prompt) of every readable voice in the folder now, by name."""
        stems = {p.stem for ext in PROMPT_EXTS for p in self.folder.glob(f"*{ext}")
                 if VOICE_NAME.fullmatch(p.stem)}
        found = ((name, self.get(name)) for name in sorted(stems))
        return [(name, prompt) for name, prompt in found if prompt is not None]

    def get(self, name: str):
        """The voice prompt `name` as the folder holds it now, or None (no such voice, or a
        file that does not load: that stays for inspection). Parsed again only when its file
        changed."""
        if not isinstance(name, str) or not VOICE_NAME.fullmatch(name):
            return None
        for ext in PROMPT_EXTS:
            path = self.folder / f"{name}{ext}"
            try:
                st = path.stat()
            except OSError:
                continue
            key = (ext, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            with self._cache_lock:
                hit = self._cache.get(name)
                failed = self._failed.get(path) == key
                self.lookups[name] += 1
            if hit is not None and hit[0] == key:
                return hit[1]
            if failed:
                continue
            try:
                if not self._inside(path):
                    raise VoicePromptError("a symlink out of the voice library's folder")
                prompt = self._cls.load(path)
            except VoicePromptError as exc:
                _report(path, f"not a voice prompt that loads: {exc}")
                with self._cache_lock:
                    if len(self._failed) > 4096:  # a bound, whatever a folder holds
                        self._failed.clear()
                    self._failed[path] = key
                continue
            with self._cache_lock:
                self._cache[name] = (key, prompt)
                self.loads[name] += 1
            return prompt
        with self._cache_lock:
            self._cache.pop(name, None)
        return None

    def record(self, name: str) -> dict:
        """The voice's record (label, type, created_at, prompt, consent); a voice dropped into
        the folder by hand has none: then its name, a clone, and its file's time."""
        path = self._record_path(name)
        rec = read_record(path) if self._inside(path) else None
        if rec is None and os.path.lexists(path) and not self._inside(path):
            _report(path, "a symlink out of the voice library's folder")
        if rec is not None:
            problem = _voice_problem(rec)
            if problem is None:
                return rec
            _report(path, problem)
        created = time.time()
        for ext in PROMPT_EXTS:
            with contextlib.suppress(OSError):
                created = (self.folder / f"{name}{ext}").stat().st_mtime
                break
        return {"name": name, "type": "audio_sample", "created_at": int(created)}

    def check_new(self, name: str) -> None:
        """409 unless `name` is free: taken by a voice, or by a prompt file that does not load
        (a damaged file, a FIFO), which stays for inspection until someone removes it."""
        if self.get(name) is not None:
            raise HTTPError(409, f"voice {name!r} already exists", "name", "voice_exists",
                            hint="replace_voice")
        for ext in PROMPT_EXTS:
            if os.path.lexists(self.folder / f"{name}{ext}"):
                raise HTTPError(409, f"the voice library holds {name}{ext}, which is not a voice "
                                     "prompt that loads (kept for inspection); remove it from the "
                                     "folder to use this name", "name", "voice_file_unreadable")

    def add(self, name: str, prompt, record: dict | None = None, consent: str | None = None,
            replace: bool = False) -> dict:
        """Store a new voice with its record (and a copy of consent `consent`'s recording);
        409 when the name is taken (check_new), by this process or another; 400
        `consent_required` for a cloned voice without a consent in a folder that requires
        one; 409 `consent_recording_missing` when the consent's recording is gone (or is not
        a file of the folder). Everything is checked before the first write, and a failed
        write removes only what this call wrote. `replace`: overwrite the voice `name` (a
        stale preset made again): its prompt first, then its record, so a change cut short
        leaves the old record, which still says the prompt must be made again. Returns the
        record."""
        with self._locked():
            if not replace:
                self.check_new(name)
            record = {"name": name, "type": "audio_sample", "created_at": int(time.time()),
                      **(record or {})}
            rec = None if consent is None else self._consent_record(consent)
            if consent is not None and rec is None:
                raise HTTPError(400, f"unknown consent {consent!r}", "consent",
                                "consent_not_found", hint="create_consent")
            if consent is None and record["type"] != "prompt" and self.require_consent:
                raise consent_required()
            source = None if rec is None else self.folder / CONSENTS / rec["recording"]
            if source is not None and not (source.is_file() and self._inside(source)):
                raise HTTPError(409, f"consent {consent!r} has no recording in the voice library "
                                     f"(its file {rec['recording']} is missing, or is not one of "
                                     "the library's); record the consent again", "consent",
                                "consent_recording_missing", hint="create_consent")
            if replace:
                prompt.save(self.folder / f"{name}.npz")
                _write_json(self._record_path(name), record)
                return record
            written = []
            try:
                if rec is not None:
                    kept = self.folder / f"{name}.consent{Path(rec['recording']).suffix}"
                    _copy_atomic(source, kept)
                    written.append(kept)
                    record["consent"] = {**public_consent(rec), "recording": kept.name}
                _write_json(self._record_path(name), record)
                written.append(self._record_path(name))
                prompt.save(self.folder / f"{name}.npz")  # last: now the voice exists
            except BaseException:
                for path in written:
                    _unlink(path)
                raise
            return record

    def delete(self, name: str) -> bool:
        """Remove a voice (its prompt first: from then on it is gone), its record and its kept
        consent recording; False when there was none. A voice exists when `get` finds it:
        a prompt file that does not load is no voice here either, and stays for inspection."""
        if not isinstance(name, str) or not VOICE_NAME.fullmatch(name):
            return False
        with self._locked():
            if self.get(name) is None:
                return False
            for path in [*(self.folder / f"{name}{ext}" for ext in PROMPT_EXTS),
                         self._record_path(name), *self.folder.glob(f"{name}.consent.*")]:
                if not _plain(path):  # checked before the first removal: none is half done
                    raise HTTPError(409, f"voice {name!r} cannot be deleted: the voice library "
                                         f"holds a folder named {path.name}, which is not a "
                                         "voice's file; remove it from the folder by hand",
                                    "name", "voice_file_unremovable")
            existed = [_unlink(self.folder / f"{name}{ext}") for ext in PROMPT_EXTS]
            for path in [self._record_path(name), *self.folder.glob(f"{name}.consent.*")]:
                _unlink(path)
            with self._cache_lock:
                self._cache.pop(name, None)
            return any(existed)

    def making_lock(self, name: str) -> threading.Lock:
        """One lock per name, for work that must run once per process (a preset's design)."""
        with self._cache_lock:
            return self._making.setdefault(name, threading.Lock())

    # -- consents -------------------------------------------------------------------------------

    def _consent_record(self, cid) -> dict | None:
        """A consent's stored record, or None (no such consent, or a damaged record)."""
        if not isinstance(cid, str) or not CONSENT_ID.fullmatch(cid):
            return None
        path = self.folder / CONSENTS / f"{cid}.json"
        if not self._inside(path):  # consents/ or the record leads out of the folder
            if os.path.lexists(path):
                _report(path, "a symlink out of the voice library's folder")
            return None
        rec = read_record(path)
        if rec is None:
            return None
        problem = _consent_problem(rec)
        # The recording's file is named by the record: only ever <id>.<ext>, beside it.
        if problem is None and (rec["id"] != cid
                                or not re.fullmatch(rf"{cid}\.[a-z0-9]+", rec["recording"])):
            problem = "its id or its recording's file is not its own"
        if problem is None:
            return rec
        _report(path, problem)
        return None

    def consent(self, cid) -> dict | None:
        rec = self._consent_record(cid)
        return None if rec is None else public_consent(rec)

    def consents(self) -> list[dict]:
        """Every consent, oldest first."""
        recs = (self._consent_record(p.stem) for p in (self.folder / CONSENTS).glob("cons_*.json"))
        return sorted((public_consent(r) for r in recs if r is not None),
                      key=lambda r: (r["created_at"], r["id"]))

    def add_consent(self, name: str, language: str, recording: bytes, ext: str) -> dict:
        """Keep a consent recording (its bytes as uploaded, `ext` its container's extension)."""
        cid = "cons_" + secrets.token_hex(12)
        folder = self.folder / CONSENTS
        rec = {"id": cid, "object": "audio.voice_consent", "name": name, "language": language,
               "created_at": int(time.time()), "recording": f"{cid}.{ext}"}
        with self._locked():
            if folder.is_symlink() or not self._inside(folder):  # never write outside it
                raise HTTPError(409, "the voice library's consents folder leads out of the "
                                     "library's folder; its operator must make it a folder of "
                                     "the library again", None, "consents_folder_outside")
            writers.write_atomic(folder / rec["recording"], lambda fh: fh.write(recording),
                                 OmniCoreError)
            try:
                _write_json(folder / f"{cid}.json", rec)  # last: now the consent exists
            except BaseException:
                _unlink(folder / rec["recording"])
                raise
        return public_consent(rec)

    def rename_consent(self, cid, name: str) -> dict | None:
        with self._locked():
            rec = self._consent_record(cid)
            if rec is None:
                return None
            rec["name"] = name
            _write_json(self.folder / CONSENTS / f"{cid}.json", rec)
        return public_consent(rec)

    def delete_consent(self, cid) -> bool:
        """Remove a consent (the voices it authorised keep their copy of the recording)."""
        with self._locked():
            rec = self._consent_record(cid)
            if rec is None:
                return False
            _unlink(self.folder / CONSENTS / f"{cid}.json")
            _unlink(self.folder / CONSENTS / rec["recording"])
        return True


def public_consent(rec: dict) -> dict:
    """A consent as OpenAI's API shows it."""
    return {k: rec[k] for k in PUBLIC_CONSENT}
