"""The one atomic writer every omnicore output goes through (audio files, streamed audio, voice
prompts, codes): a unique temporary file in the target's folder, fsync, rename; nothing left
behind on any failure; folders, devices, FIFOs and missing folders refused with a typed error;
concurrent writers of one path never corrupt it; the process umask is never touched."""

import os
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest
import soundfile as sf

from omnicore.audio import writers
from omnicore.errors import AudioError, InputError, VoicePromptError
from omnicore.pipeline import VoiceClonePrompt
from omnicore.text.limits import MAX_REF_FRAMES

SR = 24000


def _umask_now() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_concurrent_saves_to_one_path_never_corrupt_it(tmp_path):
    # A fixed temporary name failed half of these rounds (FileNotFoundError; BadZipFile with
    # bigger files). The largest prompt that loads, for the widest window.
    path = tmp_path / "x.npz"
    frames = MAX_REF_FRAMES
    prompts = [VoiceClonePrompt(np.full((8, frames), k, np.int64), f"voice {k}", 0.1) for k in (1, 2)]
    for _ in range(20):
        errors = []

        def save(p):
            try:
                p.save(path)
            except BaseException as exc:  # anything at all is a failure of this test
                errors.append(exc)

        threads = [threading.Thread(target=save, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        back = VoiceClonePrompt.load(path)
        k = int(back.ref_audio_tokens[0, 0])
        assert back.ref_text == f"voice {k}" and (back.ref_audio_tokens == k).all()
        assert _names(tmp_path) == ["x.npz"]  # no temporary file left


def test_concurrent_audio_writes_never_corrupt_the_file(tmp_path):
    path = tmp_path / "a.wav"
    waves = [np.full(SR * 2, v, np.float32) for v in (0.25, -0.5)]
    for _ in range(4):
        threads = [threading.Thread(target=writers.write_audio_atomic, args=(path, w, SR)) for w in waves]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        data, sr = sf.read(path, dtype="float32")
        assert sr == SR and len(data) == SR * 2 and data[0] in (0.25, -0.5) and (data == data[0]).all()
        assert _names(tmp_path) == ["a.wav"]


def _targets(tmp_path):
    """Paths that must be refused, with a word the message must contain."""
    (tmp_path / "adir.wav").mkdir()  # an audio extension, so only the path is at fault
    os.mkfifo(tmp_path / "fifo.wav")
    (tmp_path / "afile").write_bytes(b"keep")
    return [(tmp_path / "adir.wav", "folder"), (str(tmp_path / "adir.wav") + "/", "folder name"),
            (tmp_path / "fifo.wav", "FIFO"), ("/dev/null", "device"),
            (tmp_path / "nodir" / "x.wav", "does not exist"),
            (tmp_path / "afile" / "x.wav", "not a folder"), (f"{tmp_path}/a\0.wav", "NUL")]


def test_refused_targets_with_the_callers_typed_error(tmp_path):
    prompt = VoiceClonePrompt(np.zeros((8, 3), np.int64), "Hi.", 0.1)
    for target, word in _targets(tmp_path):
        with pytest.raises(AudioError, match=word):
            writers.write_audio_atomic(target, np.zeros(10, np.float32), SR)
        with pytest.raises(AudioError, match=word):
            writers.AudioFileWriter(target, SR)
        with pytest.raises(VoicePromptError, match=word):
            prompt.save(target)
        with pytest.raises(InputError, match=word):
            writers.write_atomic(target, lambda fh: fh.write(b"x"), InputError)
    assert _names(tmp_path) == ["adir.wav", "afile", "fifo.wav"]
    assert list((tmp_path / "adir.wav").iterdir()) == [] and (tmp_path / "afile").read_bytes() == b"keep"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_proc_is_refused_with_a_typed_error(tmp_path):
    with pytest.raises(VoicePromptError, match="could not write|cannot write"):
        VoiceClonePrompt(np.zeros((8, 3), np.int64), "Hi.", 0.1).save("/proc/v.npz")


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), RuntimeError("codec"),
                                 KeyboardInterrupt()])
def test_temporary_file_removed_on_any_failure(tmp_path, exc):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")

    def write(fh):
        fh.write(b"partial" * 1000)
        raise exc

    expected = KeyboardInterrupt if isinstance(exc, KeyboardInterrupt) else InputError
    with pytest.raises(expected):
        writers.write_atomic(path, write, InputError)
    assert _names(tmp_path) == ["out.bin"] and path.read_bytes() == b"old"


def test_failed_rename_or_sync_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "out.bin"
    for name in ("replace", "fsync"):
        with monkeypatch.context() as m:
            m.setattr(os, name, lambda *a: (_ for _ in ()).throw(OSError(5, "Input/output error")))
            with pytest.raises(AudioError, match="could not write .*Input/output error"):
                writers.write_atomic(path, lambda fh: fh.write(b"data"))
        assert _names(tmp_path) == []


def test_stream_writer_removes_its_temporary_file_on_interrupt(tmp_path):
    path = tmp_path / "s.wav"
    with pytest.raises(KeyboardInterrupt):
        with writers.AudioFileWriter(path, SR) as w:
            w.write(np.zeros(1000, np.float32))
            assert len(_names(tmp_path)) == 1 and _names(tmp_path)[0].startswith(".s.wav.")
            raise KeyboardInterrupt
    assert _names(tmp_path) == []
    w = writers.AudioFileWriter(path, SR)
    with pytest.raises(AudioError, match="NaN"):
        w.write(np.array([np.nan], np.float32))
    assert _names(tmp_path) == []


def test_mode_follows_the_umask_and_the_umask_is_never_touched(tmp_path, monkeypatch):
    def no_umask(*a):
        raise AssertionError("os.umask called while writing")

    monkeypatch.setattr(os, "umask", no_umask)
    want = 0o666 & ~_umask_now()
    writers.write_audio_atomic(tmp_path / "a.wav", np.zeros(10, np.float32), SR)
    with writers.AudioFileWriter(tmp_path / "b.raw", SR) as w:
        w.write(np.zeros(10, np.float32))
    VoiceClonePrompt(np.zeros((8, 3), np.int64), "Hi.", 0.1).save(tmp_path / "c.npz")
    for name in ("a.wav", "b.raw", "c.npz"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == want, name


@pytest.mark.subprocess
def test_umask_is_read_at_import_without_changing_it():
    code = ("import os; os.umask(0o027); from omnicore.audio import writers; "
            "print(oct(writers._FILE_MODE), oct(os.umask(0o027)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0o640", "0o27"]


def test_symlink_target_is_replaced_and_the_link_kept(tmp_path):
    real = tmp_path / "real.wav"
    writers.write_audio_atomic(real, np.zeros(10, np.float32), SR)
    link = tmp_path / "link.wav"
    link.symlink_to(real)
    writers.write_audio_atomic(link, np.full(20, 0.5, np.float32), SR)
    assert link.is_symlink() and len(sf.read(real)[0]) == 20
    assert _names(tmp_path) == ["link.wav", "real.wav"]


def test_long_file_name_keeps_the_temporary_name_legal(tmp_path):
    path = tmp_path / ("n" * 240 + ".npy")
    writers.write_atomic(path, lambda fh: np.save(fh, np.arange(3)))
    assert np.load(path).tolist() == [0, 1, 2] and _names(tmp_path) == [path.name]
