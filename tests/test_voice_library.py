"""The voice library in process (apps/server/library.py, voices.py): which checkpoint made a
voice (fingerprints, stale presets made again, a user's voice from another codec refused), a
start-up sweep that stays in the folder, and prompt files that fail to load or would inflate
past any prompt. The doors' side of the same rules is tests/test_server_voices.py."""

import logging
import os
import shutil
import zipfile

import numpy as np
import pytest

from conftest import TINY

from omnicore import OmniVoice, VoiceClonePrompt
from omnicore.apps.server import VoiceLibrary
from omnicore.apps.server.protocol import HTTPError
from omnicore.apps.server.voices import check_voice, is_stale, made_by, maker, resolve_voice
from omnicore.errors import VoicePromptError
from omnicore.machinery import checkpoint


def _variant(root, name: str, part: str):
    """A copy of the tiny checkpoint under `root/name` whose `part` ("backbone" or "codec")
    has its first float changed: the same layout, other weights (as a fine-tune or another
    random draw would be)."""
    folder = root / name
    shutil.copytree(TINY, folder)
    file = folder / ("model.safetensors" if part == "backbone"
                     else "audio_tokenizer/model.safetensors")
    with checkpoint.SafetensorsFile(file) as f:
        info = min((i for i in f.entries.values() if i.kind == "F32"), key=lambda i: i.offset)
    with open(file, "r+b") as fh:
        fh.seek(info.offset)
        value = np.frombuffer(fh.read(4), "<f4")[0]
        fh.seek(info.offset)
        fh.write(np.float32(value + 0.125).astype("<f4").tobytes())
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny checkpoint, a copy with another backbone, and one with another codec."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {"tiny": OmniVoice.from_pretrained(TINY),
            "backbone": OmniVoice.from_pretrained(_variant(root, "other-backbone", "backbone")),
            "codec": OmniVoice.from_pretrained(_variant(root, "other-codec", "codec"))}


def test_a_fingerprint_is_stable_across_copies_and_tells_weights_apart(tmp_path):
    """A copy (new inode, new mtime) keeps the fingerprint; one changed float in a tensor's
    head, in the same layout and size, changes it; so does the config."""
    copy = tmp_path / "copy"
    shutil.copytree(TINY, copy)
    os.utime(copy / "model.safetensors", (1, 1))
    assert checkpoint.fingerprint(copy) == checkpoint.fingerprint(TINY)
    other = _variant(tmp_path, "other", "backbone")
    size = (TINY / "model.safetensors").stat().st_size
    assert (other / "model.safetensors").stat().st_size == size
    assert checkpoint.fingerprint(other) != checkpoint.fingerprint(TINY)
    assert checkpoint.fingerprint(other / "audio_tokenizer") == checkpoint.fingerprint(
        TINY / "audio_tokenizer")
    (copy / "config.json").write_text((copy / "config.json").read_text() + "\n")
    assert checkpoint.fingerprint(copy) != checkpoint.fingerprint(TINY)


@pytest.mark.slow
def test_a_preset_made_by_another_model_is_made_again(models, tmp_path):
    """A preset whose record names another whole model is stale: resolving it designs it again
    with this model and replaces it (prompt and record); with the model that made it, it is
    used as it is."""
    lib = VoiceLibrary(tmp_path)
    tiny, other = models["tiny"], models["backbone"]
    first = resolve_voice(tiny, lib, "alloy")
    record = lib.record("alloy")
    assert made_by(record)["model"] == maker(tiny).model and not is_stale(record, tiny)
    assert is_stale(record, other)
    stamp = os.stat(tmp_path / "alloy.npz").st_ino
    kept = resolve_voice(tiny, lib, "alloy")  # not made again by its own model
    assert os.stat(tmp_path / "alloy.npz").st_ino == stamp
    np.testing.assert_array_equal(kept.ref_audio_tokens, first.ref_audio_tokens)
    again = resolve_voice(other, lib, "alloy")
    assert made_by(lib.record("alloy"))["model"] == maker(other).model
    assert not is_stale(lib.record("alloy"), other) and is_stale(lib.record("alloy"), tiny)
    assert os.stat(tmp_path / "alloy.npz").st_ino != stamp  # written again
    np.testing.assert_array_equal(lib.get("alloy").ref_audio_tokens, again.ref_audio_tokens)
    assert lib.names() == ["alloy"]


def test_a_users_voice_from_another_codec_is_refused_saying_how_to_remake_it(models, tmp_path):
    """A user's voice is the codes of the codec that made it: with the same codec (another
    backbone) it is used; with another codec it is a 409 naming both checkpoints and how to
    make it again, before admission (check_voice) and when resolved, also through an alias."""
    lib = VoiceLibrary(tmp_path)
    tiny = models["tiny"]
    prompt = tiny.synthesize("How I sound.", instruct="male", seed=1, num_step=2)[0].as_voice()
    lib.add("mine", prompt, {"type": "audio_sample", "made_by": maker(tiny).record(False)})
    lib.add("drawn", prompt, {"type": "prompt", "prompt": "male",
                              "made_by": maker(tiny).record(True)})
    assert resolve_voice(models["backbone"], lib, "mine") is not None
    check_voice(lib, "mine", model=models["backbone"])
    other = models["codec"]
    for name, how in (("mine", "clone it again"), ("drawn", "design it again")):
        for call in (lambda: check_voice(lib, name, model=other),
                     lambda: resolve_voice(other, lib, name),
                     lambda: resolve_voice(other, lib, "alias", aliases={"alias": name})):
            with pytest.raises(HTTPError) as exc:
                call()
            err = exc.value
            assert (err.status, err.code) == (409, "voice_made_by_another_model")
            assert TINY.name in err.message and "other-codec" in err.message
            assert maker(tiny).codec in err.message and maker(other).codec in err.message
            assert how in err.message and str(tmp_path) not in err.message


def test_a_record_without_its_maker_is_read_and_logged_once(models, tmp_path, caplog):
    """Records from before makers were kept (and voices dropped in by hand) still work, with
    one log line per voice."""
    lib = VoiceLibrary(tmp_path)
    tiny = models["tiny"]
    prompt = tiny.synthesize("How I sound.", instruct="male", seed=1, num_step=2)[0].as_voice()
    lib.add("old", prompt, {"type": "audio_sample"})
    prompt.save(tmp_path / "dropped.npz")
    seen = []  # the logger's own records (a server run before may have stopped propagation)
    handler = logging.Handler(logging.INFO)
    handler.emit = seen.append
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    level, disabled = logger.level, logger.disabled
    logger.setLevel(logging.INFO)
    logger.disabled = False  # (as a logging config may have left it)
    try:
        for _ in range(3):
            for name in ("old", "dropped"):
                assert resolve_voice(models["codec"], lib, name) is not None
                check_voice(lib, name, model=models["codec"])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled
    lines = [r.getMessage() for r in seen if "which model made it" in r.getMessage()]
    assert len(lines) == 2 and "'old'" in lines[0] + lines[1], lines


def test_the_start_up_sweep_never_follows_consents_out_of_the_folder(tmp_path):
    """A `consents/` that is a symlink out of the folder: its target's files are neither
    removed by the sweep nor read as consents, and a new consent is not written there."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.wav").write_bytes(b"RIFF")
    (outside / "notes.txt").write_text("kept")
    folder = tmp_path / "voices"
    folder.mkdir()
    (folder / "consents").symlink_to(outside)
    lib = VoiceLibrary(folder)
    assert sorted(p.name for p in outside.iterdir()) == ["notes.txt", "precious.wav"]
    assert lib.consents() == []
    with pytest.raises(HTTPError) as exc:
        lib.add_consent("Ann", "en", b"RIFF", "wav")
    assert (exc.value.status, exc.value.code) == (409, "consents_folder_outside")
    assert sorted(p.name for p in outside.iterdir()) == ["notes.txt", "precious.wav"]


def _bomb(path, inflated: int) -> None:
    """A zip whose member would inflate to `inflated` zero bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("ref_audio_tokens.npy", "w", force_zip64=True) as fh:
            block = bytes(1 << 20)
            for _ in range(inflated >> 20):
                fh.write(block)


def test_a_prompt_that_would_inflate_past_any_prompt_is_refused_unread(tmp_path):
    """An .npz whose member would expand past a prompt's largest size, or a file larger than
    any prompt, is refused from its zip directory or its size alone."""
    _bomb(tmp_path / "bomb.npz", 64 << 20)
    assert (tmp_path / "bomb.npz").stat().st_size < 1 << 20
    with pytest.raises(VoicePromptError, match="expanded"):
        VoiceClonePrompt.load(tmp_path / "bomb.npz")
    (tmp_path / "big.npz").write_bytes(bytes(19 << 20))
    with pytest.raises(VoicePromptError, match="larger than any voice prompt"):
        VoiceClonePrompt.load(tmp_path / "big.npz")


def test_a_prompt_file_that_fails_is_parsed_once_until_it_changes(tmp_path, monkeypatch):
    """The library remembers a prompt file that failed to load, by its file's identity: every
    list after the first costs a stat, not a parse; once the file changes it is read again."""
    lib = VoiceLibrary(tmp_path)
    parsed = []
    real = VoiceClonePrompt.load.__func__

    def counted(cls, path):
        parsed.append(os.path.basename(path))
        return real(cls, path)
    monkeypatch.setattr(VoiceClonePrompt, "load", classmethod(counted))
    _bomb(tmp_path / "bomb.npz", 8 << 20)
    for _ in range(4):
        assert lib.names() == [] and lib.get("bomb") is None
    assert parsed == ["bomb.npz"]
    VoiceClonePrompt(np.zeros((8, 5), np.int64), "Whole.", 0.05).save(tmp_path / "bomb.npz")
    assert lib.names() == ["bomb"] and parsed == ["bomb.npz", "bomb.npz"]

