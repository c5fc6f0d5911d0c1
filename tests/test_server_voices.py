"""OpenAI's voice resources and the one voice library, as users and operators run them: two
`omnicore serve` subprocesses on loopback ports sharing one voices folder (both with
--require-consent), driven by the official `openai` client (httpx for omnicore's own
/v1/voices and for the exact JSON shapes)."""

import io
import json
import os
import threading
import time

import numpy as np
import pytest

from conftest import (TINY, free_port, require_module, require_server_extra,  # noqa: E402
                      spawn_omnicore, start_server, stop_process, wait_until_serving)

openai = require_module("openai")  # a skip locally, a failure under CI
httpx = require_module("httpx")
sf = require_module("soundfile")
require_server_extra()

from omnicore import OmniVoice, VoiceClonePrompt  # noqa: E402
from test_server import GREEDY, _close, _streamed  # noqa: E402

pytestmark = pytest.mark.subprocess

VOICE_KEYS = {"id", "object", "name", "type", "created_at"}  # openai.types.audio.Voice
CONSENT_KEYS = {"id", "object", "name", "language", "created_at"}  # ...VoiceConsent


def _wav(seconds: float, pitch: float = 180.0) -> bytes:
    """A noisy tone as 16-bit WAV bytes (a clip to clone, or a consent recording)."""
    rng = np.random.default_rng(int(pitch))
    t = np.arange(int(24000 * seconds)) / 24000
    wav = 0.2 * np.sin(2 * np.pi * pitch * t) * (1 + 0.5 * rng.standard_normal(t.size))
    buf = io.BytesIO()
    sf.write(buf, wav.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("shared_voices")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logs")
    return [folder / f"server{i}.log" for i in range(2)]


@pytest.fixture(scope="module")
def servers(voices_dir, logs):
    """Two servers on one folder, as replicas behind a load balancer."""
    started = []
    try:
        for log in logs:
            started.append(start_server(voices_dir, "--require-consent", log_path=log))
        yield [url for _, url in started]
    finally:
        for proc, _ in started:
            stop_process(proc, 10)


@pytest.fixture(scope="module")
def clients(servers):
    return [openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
            for url in servers]


@pytest.fixture(scope="module")
def model():
    return OmniVoice.from_pretrained(TINY)


def _error(exc_info) -> dict:
    err = exc_info.value.response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_consents_with_the_official_client(servers, clients):
    a, b = clients
    recording = _wav(1.0)
    made = [a.audio.voice_consents.create(name=f"Speaker {i}", language="en-US",
                                          recording=("consent.wav", recording, "audio/wav"))
            for i in range(3)]
    assert all(c.object == "audio.voice_consent" and c.id.startswith("cons_") for c in made)
    raw = httpx.get(f"{servers[0]}/v1/audio/voice_consents/{made[0].id}").json()
    assert set(raw) == CONSENT_KEYS and raw["language"] == "en-US" and raw["name"] == "Speaker 0"
    # One library: the other server sees, renames and lists what the first made.
    assert b.audio.voice_consents.retrieve(made[0].id).name == "Speaker 0"
    assert b.audio.voice_consents.update(made[1].id, name="Renamed").name == "Renamed"
    assert a.audio.voice_consents.retrieve(made[1].id).name == "Renamed"
    first = a.audio.voice_consents.list(limit=2)
    assert len(first.data) == 2 and first.has_more
    listed = [c.id for c in b.audio.voice_consents.list(limit=2)]  # every page, in order
    assert sorted(listed) == sorted(c.id for c in made) and listed[:2] == [c.id for c in first.data]

    with pytest.raises(openai.BadRequestError) as exc:
        a.audio.voice_consents.create(name="x", language="English!",
                                      recording=("c.wav", recording, "audio/wav"))
    assert _error(exc)["param"] == "language"
    with pytest.raises(openai.BadRequestError) as exc:
        a.audio.voice_consents.create(name="x", language="en", recording=("c.wav", b"not audio"))
    assert _error(exc)["code"] == "invalid_audio"
    with pytest.raises(openai.BadRequestError) as exc:
        a.audio.voice_consents.create(name="  ", language="en",
                                      recording=("c.wav", recording, "audio/wav"))
    assert _error(exc)["param"] == "name"

    deleted = b.audio.voice_consents.delete(made[2].id)
    assert deleted.deleted and deleted.id == made[2].id
    for call in (lambda: a.audio.voice_consents.retrieve(made[2].id),
                 lambda: a.audio.voice_consents.delete(made[2].id),
                 lambda: a.audio.voice_consents.update(made[2].id, name="again"),
                 lambda: a.audio.voice_consents.retrieve("cons_" + "0" * 24),
                 lambda: a.audio.voice_consents.retrieve("../../etc")):
        with pytest.raises(openai.NotFoundError):
            call()


def test_openai_voices_speak_and_share_one_library(servers, clients, voices_dir, model):
    a, b = clients
    recording, clip = _wav(1.0), _wav(2.0, pitch=150.0)
    consent = a.audio.voice_consents.create(name="Ann", language="en",
                                            recording=("consent.wav", recording, "audio/wav"))
    sample = ("ann.wav", clip, "audio/wav")
    # No speech recognition here: the clip's transcript is required, and the 400 says how.
    with pytest.raises(openai.BadRequestError) as exc:
        a.audio.voices.create(name="Ann", audio_sample=sample, consent=consent.id)
    err = _error(exc)
    assert err["param"] == "ref_text" and "extra_body" in err["message"]
    # --require-consent: a clone needs a consent that exists, on both APIs.
    form = {"name": "Ann", "ref_text": "A short test clip."}
    for route, field in (("/v1/audio/voices", "audio_sample"), ("/v1/voices", "audio")):
        r = httpx.post(servers[0] + route, data=form, files={field: sample}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "consent_required", r.text
        r = httpx.post(servers[0] + route, data={**form, "consent": "cons_" + "1" * 24},
                       files={field: sample}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "consent_not_found", r.text

    voice = a.audio.voices.create(name="Ann", audio_sample=sample, consent=consent.id,
                                  extra_body={"ref_text": "A short test clip."})
    assert (voice.object, voice.type, voice.name, voice.prompt) == ("audio.voice", "audio_sample",
                                                                   "Ann", None)
    # The consent recording is kept with the voice it authorises, and stays when the consent
    # itself is deleted.
    kept = voices_dir / f"{voice.id}.consent.wav"
    assert kept.read_bytes() == recording
    assert b.audio.voice_consents.delete(consent.id).deleted
    assert kept.read_bytes() == recording
    listed = {v["id"]: v for v in httpx.get(servers[1] + "/v1/voices").json()["data"]}
    assert listed[voice.id]["name"] == "Ann" and listed[voice.id]["consent"] == consent.id

    # Speech with {"id": ...}, on either server, is the stored voice's.
    prompt = VoiceClonePrompt.load(voices_dir / f"{voice.id}.npz")
    assert prompt.ref_text == "A short test clip."
    want = _streamed(model, "Hello there.", prompt)
    for client in (a, b):
        got = client.audio.speech.create(model="tts-1", voice={"id": voice.id}, input="Hello there.",
                                         response_format="pcm", extra_body=GREEDY).content
        _close(np.frombuffer(got, "<i2"), want)

    # A prompt voice is a designed voice: its prompt is checked as an instruct, with hints...
    with pytest.raises(openai.BadRequestError) as exc:
        a.audio.voices.create(name="Low", prompt="female, low pich", type="prompt")
    err = _error(exc)
    assert err["param"] == "prompt" and "did you mean 'low pitch'" in err["message"]
    # ...and it is the voice /v1/voices designs from the same description.
    designed = b.audio.voices.create(name="Low", prompt="female, low pitch", type="prompt",
                                     script_hint="This is how I sound.", extra_body={"num_step": 4})
    assert (designed.type, designed.prompt, designed.name) == ("prompt", "female, low pitch", "Low")
    r = httpx.post(servers[0] + "/v1/voices", timeout=120, json={
        "name": "low_twin", "instruct": "female, low pitch", "text": "This is how I sound.",
        "num_step": 4})
    assert r.status_code == 201, r.text
    np.testing.assert_array_equal(
        VoiceClonePrompt.load(voices_dir / f"{designed.id}.npz").ref_audio_tokens,
        VoiceClonePrompt.load(voices_dir / "low_twin.npz").ref_audio_tokens)
    # OpenAI's route takes JSON too; the bodies are exactly OpenAI's shapes.
    r = httpx.post(servers[0] + "/v1/audio/voices", timeout=120, json={
        "name": "Low again", "type": "prompt", "prompt": "female, low pitch", "num_step": 2})
    assert r.status_code == 200 and set(r.json()) == VOICE_KEYS | {"prompt"}, r.text
    again = r.json()["id"]
    r = httpx.delete(f"{servers[1]}/v1/audio/voices/{again}")
    assert r.json() == {"id": again, "object": "audio.voice.deleted", "deleted": True}

    # Deleted on one server: gone on the other, files and all.
    assert b.audio.voices.delete(voice.id).deleted
    with pytest.raises(openai.NotFoundError):
        a.audio.voices.delete(voice.id)
    with pytest.raises(openai.NotFoundError):
        a.audio.speech.create(model="tts-1", voice={"id": voice.id}, input="Hi.")
    assert not list(voices_dir.glob(f"{voice.id}*"))
    assert a.audio.voices.delete("low_twin").deleted  # one library: any voice, by its id
    assert httpx.get(servers[1] + "/v1/voices/low_twin").status_code == 404


ROUNDS = 6          # per thread
THREADS = 2         # per server
HAMMER_S = 150.0    # at most, all threads together


def test_two_servers_one_name_create_delete_race(servers, voices_dir):
    """Both servers create and delete one name at once, two threads each, bounded in count
    and time. Every answer is a 201/409 or a 200/404; the successes alternate (creates minus
    deletes is 0 or 1, and is what both servers then show); the folder holds the voice whole
    (prompt and record) or not at all, and no temporary file."""
    spec = {"name": "shared", "instruct": "male, high pitch", "num_step": 1, "text": "Hi there."}
    deadline = time.monotonic() + HAMMER_S
    results, lock = [], threading.Lock()

    def hammer(url: str, create_first: bool):
        for i in range(ROUNDS):
            if time.monotonic() > deadline:
                return
            if (i % 2 == 0) == create_first:
                got = ("create", httpx.post(url + "/v1/voices", json=spec, timeout=120).status_code)
            else:
                got = ("delete", httpx.delete(url + "/v1/voices/shared", timeout=120).status_code)
            with lock:
                results.append(got)
    threads = [threading.Thread(target=hammer, args=(url, k % 2 == 0))
               for url in servers for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HAMMER_S + 60)
    assert not any(t.is_alive() for t in threads)

    assert results and set(results) <= {("create", 201), ("create", 409), ("delete", 200),
                                        ("delete", 404)}, results
    created = results.count(("create", 201))
    deleted = results.count(("delete", 200))
    assert created >= 1 and created - deleted in (0, 1), results
    exists = created - deleted == 1
    for url in servers:
        assert httpx.get(url + "/v1/voices/shared").status_code == (200 if exists else 404)
    files = sorted(p.name for p in voices_dir.glob("shared.*"))
    assert files == (["shared.npz", "shared.voice.json"] if exists else []), files
    if exists:
        assert VoiceClonePrompt.load(voices_dir / "shared.npz").ref_text == "Hi there."
    assert not list(voices_dir.rglob("*.tmp"))


def test_library_start_removes_what_a_killed_change_left(tmp_path):
    """A server killed mid-change can leave a voice's record or consent copy without its
    prompt, or a recording without its consent: the next library on the folder removes them
    (under the lock), and keeps every whole voice and consent and every file not its own. A
    consent record naming a file outside its own is damaged: kept for inspection, never
    followed."""
    from omnicore.apps.server import VoiceLibrary

    lib = VoiceLibrary(tmp_path)
    whole = VoiceClonePrompt(np.zeros((8, 5), np.int64), "Whole.", 0.05)
    consent = lib.add_consent("Ann", "en", _wav(0.5), "wav")
    lib.add("kept", whole, {"type": "audio_sample"}, consent["id"])
    (tmp_path / "gone.voice.json").write_text("{}")
    (tmp_path / "gone.consent.wav").write_bytes(b"RIFF")
    (tmp_path / "consents" / "cons_0123456789abcdef01234567.wav").write_bytes(b"RIFF")
    (tmp_path / "notes.txt").write_text("an operator's file")
    bad = "cons_" + "a" * 24
    (tmp_path / "consents" / f"{bad}.json").write_text(json.dumps({
        "id": bad, "object": "audio.voice_consent", "name": "x", "language": "en",
        "created_at": 0, "recording": "../notes.txt"}))

    again = VoiceLibrary(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        ".lock", "kept.consent.wav", "kept.npz", "kept.voice.json", "notes.txt"]
    assert again.names() == ["kept"] and again.record("kept")["consent"]["id"] == consent["id"]
    assert [c["id"] for c in again.consents()] == [consent["id"]]
    assert again.consent(bad) is None and not again.delete_consent(bad)
    assert (tmp_path / "notes.txt").exists() and (tmp_path / "consents" / f"{bad}.json").exists()


def _get(url: str, **kw):
    """A request that must be answered: a server whose event loop is blocked fails it with a
    timeout instead of hanging the test."""
    return httpx.request(kw.pop("method", "GET"), url, timeout=30, **kw)


def test_a_hostile_file_costs_its_own_entry_only(servers, voices_dir, logs):
    """A FIFO in place of a voice's record or a consent, a record nested 1,100 deep, a consent
    over the size of any record: every route still answers on both replicas (a FIFO read on
    the event loop would freeze the whole server, /health included), each bad file costs its
    own entry (a voice is then shown as a voice with no record) and is logged once, and a
    voice behind a FIFO record is deleted like any other. Every entry of the list has one
    shape, presets not made yet included."""
    made = []
    for name in ("fifo_rec", "deep_rec"):
        r = _get(servers[0] + "/v1/voices", method="POST", json={
            "name": name, "instruct": "male, low pitch", "num_step": 1, "text": "Hi there."})
        assert r.status_code == 201, r.text
        made.append(name)
    consent = _get(servers[1] + "/v1/audio/voice_consents", method="POST",
                   data={"name": "Kept", "language": "en"},
                   files={"recording": ("c.wav", _wav(1.0), "audio/wav")}).json()["id"]
    (voices_dir / "fifo_rec.voice.json").unlink()
    os.mkfifo(voices_dir / "fifo_rec.voice.json")
    (voices_dir / "deep_rec.voice.json").write_text("[" * 1100 + "]" * 1100)
    deep, fifo, big = ("cons_" + c * 24 for c in "bcd")
    (voices_dir / "consents" / f"{deep}.json").write_text("[" * 1100 + "]" * 1100)
    os.mkfifo(voices_dir / "consents" / f"{fifo}.json")
    (voices_dir / "consents" / f"{big}.json").write_text(json.dumps({"id": big, "pad": "x" * 70_000}))
    for url in servers:
        assert _get(url + "/health").json()["status"] == "ok"
        listed = _get(url + "/v1/voices").json()["data"]
        shown = {v["id"]: v for v in listed}
        assert {"fifo_rec", "deep_rec", "ash"} <= set(shown)
        assert len({tuple(v) for v in listed}) == 1, listed  # one shape for every entry
        assert shown["ash"]["made"] is False and shown["deep_rec"]["made"] is True
        for name in made:  # a voice whose record is unreadable is a voice without one
            v = _get(f"{url}/v1/voices/{name}").json()
            assert v["id"] == name and v["frames"] > 0 and v["name"] == name
        consents = _get(url + "/v1/audio/voice_consents?limit=100").json()["data"]
        ids = [c["id"] for c in consents]
        assert consent in ids and not {deep, fifo, big} & set(ids)
        for cid in (deep, fifo, big):
            assert _get(f"{url}/v1/audio/voice_consents/{cid}").status_code == 404
    assert _get(servers[1] + "/v1/voices/fifo_rec", method="DELETE").status_code == 200
    assert not (voices_dir / "fifo_rec.voice.json").exists()
    assert _get(servers[0] + "/v1/voices/fifo_rec").status_code == 404
    for log in logs:
        text = log.read_text()
        assert text.count("deep_rec.voice.json is skipped") == 1, text
        assert f"{fifo}.json is skipped (" in text and "a FIFO" in text
        assert "Traceback" not in text
    for p in [voices_dir / "deep_rec.voice.json"] + [voices_dir / "consents" / f"{c}.json"
                                                     for c in (deep, fifo, big)]:
        p.unlink()
    assert _get(servers[0] + "/v1/voices/deep_rec", method="DELETE").status_code == 200


def test_names_are_matched_whole_on_every_route(servers, voices_dir):
    """A name with a trailing newline (or any other character a name cannot hold) is not the
    voice of the name before it: on the path of every voice route, and in the speech body."""
    r = _get(servers[0] + "/v1/voices", method="POST", json={
        "name": "racer", "instruct": "female", "num_step": 1, "text": "Hi there."})
    assert r.status_code == 201, r.text
    for url in servers:
        for method, path in (("GET", "/v1/voices/racer%0a"), ("DELETE", "/v1/voices/racer%0a"),
                             ("DELETE", "/v1/audio/voices/racer%0a"),
                             ("DELETE", "/v1/audio/voices/racer%0d"),
                             ("GET", "/v1/voices/racer%20")):
            r = _get(url + path, method=method)
            err = r.json()["error"]
            assert (r.status_code, err["code"]) == (400, "invalid_voice_name"), (path, r.text)
        r = _get(url + "/v1/audio/speech", method="POST", json={"input": "Hi.", "voice": "racer\n"})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "voice"), r.text
    assert _get(servers[1] + "/v1/voices/racer").status_code == 200
    assert (voices_dir / "racer.npz").exists()
    assert _get(servers[1] + "/v1/voices/racer", method="DELETE").status_code == 200


def _audio_file(kind: str) -> bytes:
    """Audio a consent or a clip must not be: a rate of 1 Hz or 1 GHz, NaN samples, digital
    silence, garbage with an MP3 frame header."""
    buf = io.BytesIO()
    if kind == "nan":
        sf.write(buf, np.full(24000, np.nan, np.float32), 24000, format="WAV", subtype="FLOAT")
    elif kind == "silent":
        sf.write(buf, np.zeros(24000, np.int16), 24000, format="WAV", subtype="PCM_16")
    elif kind == "mp3":
        return b"\xff\xfb\x90\x64" + bytes(range(256)) * 40
    else:
        sf.write(buf, np.zeros(3000, np.int16), {"1hz": 1, "1ghz": 10**9}[kind], format="WAV",
                 subtype="PCM_16")
    return buf.getvalue()


def test_consent_recordings_are_checked_as_clips(servers, clients):
    """A consent recording is decoded and checked as a clip to clone is: every file refused
    as a clip is refused as a consent, naming `recording`; a good one is kept as uploaded."""
    a, _ = clients
    kept = a.audio.voice_consents.create(name="ok", language="en",
                                         recording=("c.wav", _wav(1.0), "audio/wav"))
    for kind in ("1hz", "1ghz", "nan", "silent", "mp3"):
        data = _audio_file(kind)
        with pytest.raises(openai.BadRequestError) as exc:
            a.audio.voice_consents.create(name="x", language="en",
                                          recording=("c.wav", data, "audio/wav"))
        err = _error(exc)
        assert (err["param"], err["code"]) == ("recording", "invalid_audio"), (kind, err)
        r = _get(servers[1] + "/v1/voices", method="POST", files={"audio": ("c.wav", data)},
                 data={"name": "clip_" + kind, "ref_text": "Hello there.", "consent": kept.id})
        err = r.json()["error"]
        assert (err["param"], err["code"]) == ("audio", "invalid_audio"), (kind, r.text)
    assert a.audio.voice_consents.delete(kept.id).deleted


def test_an_ill_typed_record_costs_its_own_entry_on_every_route(servers, voices_dir, logs):
    """Records that parse as JSON but hold what no record holds (a NaN or infinite time, an
    object where the consent is, a time that is no whole number): every list and every
    voice still answers on both replicas, each bad record costs its own entry (a voice is
    then a voice without its record), and each is logged once."""
    bad_records = {"nan_time": '{"name": "x", "type": "prompt", "created_at": NaN}',
                   "inf_time": '{"name": "x", "type": "prompt", "created_at": 1e999}',
                   "odd_consent": json.dumps({"name": "x", "type": "audio_sample",
                                              "created_at": 1, "consent": {"id": 7}}),
                   "list_name": json.dumps({"name": ["x"], "type": "prompt", "created_at": 1})}
    for name, text in bad_records.items():
        r = _get(servers[0] + "/v1/voices", method="POST", json={
            "name": name, "instruct": "female", "num_step": 1, "text": "Hi there."})
        assert r.status_code == 201, r.text
        (voices_dir / f"{name}.voice.json").write_text(text)
    float_time, text_time = "cons_" + "e" * 24, "cons_" + "f" * 24
    for cid, created in ((float_time, 1.5), (text_time, "yesterday")):
        (voices_dir / "consents" / f"{cid}.json").write_text(json.dumps({
            "id": cid, "object": "audio.voice_consent", "name": "x", "language": "en",
            "created_at": created, "recording": f"{cid}.wav"}))
        (voices_dir / "consents" / f"{cid}.wav").write_bytes(_wav(0.5))
    try:
        for url in servers:
            r = _get(url + "/v1/voices")
            assert r.status_code == 200, r.text
            shown = {v["id"]: v for v in r.json()["data"]}
            for name in bad_records:
                assert shown[name]["name"] == name and shown[name]["consent"] is None
                assert isinstance(shown[name]["created_at"], int)
                assert _get(f"{url}/v1/voices/{name}").status_code == 200
            r = _get(url + "/v1/audio/voice_consents?limit=100")
            assert r.status_code == 200, r.text
            assert not {float_time, text_time} & {c["id"] for c in r.json()["data"]}
            assert _get(f"{url}/v1/audio/voice_consents/{float_time}").status_code == 404
        for log in logs:
            text = log.read_text()
            for name in bad_records:
                assert text.count(f"{name}.voice.json is skipped") == 1, text
            assert f"{text_time}.json is skipped ('created_at'" in text
            assert "Traceback" not in text
    finally:
        for cid in (float_time, text_time):
            for p in (voices_dir / "consents").glob(f"{cid}.*"):
                p.unlink()
    for name in bad_records:
        assert _get(f"{servers[1]}/v1/voices/{name}", method="DELETE").status_code == 200


def test_a_prompt_file_that_does_not_load_is_no_voice_on_any_route(servers, voices_dir):
    """A FIFO where a voice's prompt would be: GET, DELETE and speech all answer 404 (it is
    no voice), the FIFO stays for inspection, and a create of that name is a 409 that writes
    nothing and removes nothing (a stray record there stays)."""
    os.mkfifo(voices_dir / "piped.npz")
    stray = voices_dir / "piped.voice.json"
    stray.write_text(json.dumps({"name": "an operator's", "type": "prompt", "created_at": 1}))
    try:
        for url in servers:
            assert _get(url + "/v1/voices/piped").status_code == 404
            assert _get(url + "/v1/voices/piped", method="DELETE").status_code == 404
            assert _get(url + "/v1/audio/voices/piped", method="DELETE").status_code == 404
            r = _get(url + "/v1/audio/speech", method="POST", json={"input": "Hi.",
                                                                     "voice": "piped"})
            assert r.status_code == 404, r.text
            assert "piped" not in {v["id"] for v in _get(url + "/v1/voices").json()["data"]}
            r = _get(url + "/v1/voices", method="POST", json={
                "name": "piped", "instruct": "female", "num_step": 1, "text": "Hi there."})
            assert (r.status_code, r.json()["error"]["code"]) == (409, "voice_file_unreadable")
        assert (voices_dir / "piped.npz").is_fifo()
        assert json.loads(stray.read_text())["name"] == "an operator's"
        assert sorted(p.name for p in voices_dir.glob("piped*")) == ["piped.npz", "piped.voice.json"]
    finally:
        (voices_dir / "piped.npz").unlink()
        stray.unlink()


def test_the_consent_policy_is_the_folders(tmp_path):
    """Consent is required by the folder, not by a flag of one process: a library opened
    without the flag on a folder that requires it refuses a cloned voice without a consent
    (a designed one needs none), and a failed create removes only what it wrote. Only an
    explicit False lifts it; a damaged policy file requires consent."""
    from omnicore.apps.server import VoiceLibrary
    from omnicore.apps.server.protocol import HTTPError

    voice = VoiceClonePrompt(np.zeros((8, 5), np.int64), "A voice.", 0.05)
    VoiceLibrary(tmp_path, require_consent=True)  # what `serve --require-consent` does
    assert json.loads((tmp_path / "policy.json").read_text()) == {"require_consent": True}
    lib = VoiceLibrary(tmp_path)  # a replica, or `omnicore mcp`, without the flag
    assert lib.require_consent
    (tmp_path / "clone.voice.json").write_text("a stray file")
    with pytest.raises(HTTPError) as exc:
        lib.add("clone", voice, {"type": "audio_sample"})
    assert (exc.value.status, exc.value.code) == (400, "consent_required")
    with pytest.raises(HTTPError) as exc:
        lib.add("clone", voice, {"type": "audio_sample"}, "cons_" + "1" * 24)
    assert exc.value.code == "consent_not_found"
    assert (tmp_path / "clone.voice.json").read_text() == "a stray file"
    assert lib.add("designed", voice, {"type": "prompt", "prompt": "female"})["type"] == "prompt"
    consent = lib.add_consent("Ann", "en", _wav(0.5), "wav")
    assert lib.add("clone", voice, None, consent["id"])["consent"]["id"] == consent["id"]

    VoiceLibrary(tmp_path, require_consent=False)  # --no-require-consent
    assert not lib.require_consent
    lib.add("free", voice)
    (tmp_path / "policy.json").write_text('{"require_consent": "no"}')
    assert lib.require_consent  # a damaged policy never opens the folder
    VoiceLibrary(tmp_path, require_consent=True)  # and the flag rewrites it
    assert json.loads((tmp_path / "policy.json").read_text()) == {"require_consent": True}
    (tmp_path / "policy.json").unlink()
    assert not lib.require_consent
    assert lib.names() == ["clone", "designed", "free"]


def test_a_prompt_loads_once_per_process_until_its_file_changes(tmp_path):
    """What /metrics reports as the prompt cache (omnicore_voice_prompts, and the cluster's
    loads per replica under `serve --ray`): a voice asked for again is not parsed again, one
    whose file was replaced is; a missing name is no lookup."""
    from omnicore.apps.server import VoiceLibrary

    lib = VoiceLibrary(tmp_path)
    lib.add("ann", VoiceClonePrompt(np.zeros((8, 5), np.int64), "A voice.", 0.05))
    other = VoiceLibrary(tmp_path)  # another process on the folder: its own cache
    for _ in range(3):
        assert other.get("ann") is not None
    assert other.get("nobody") is None
    assert (other.lookups["ann"], other.loads["ann"], other.lookups["nobody"]) == (3, 1, 0)
    lib.delete("ann")
    lib.add("ann", VoiceClonePrompt(np.ones((8, 7), np.int64), "Another.", 0.07))
    assert other.get("ann").ref_text == "Another." and other.loads["ann"] == 2


def test_without_a_folder_the_voices_outlive_the_server(tmp_path, monkeypatch):
    """`omnicore serve` without --voices-dir keeps its voices in the user's data folder
    ($XDG_DATA_HOME/omnicore/voices), named in its start-up lines: a voice made before a
    restart is there after it. OMNICORE_VOICES_DIR chooses another folder for every door."""
    from omnicore.apps.server import server_state

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    folder = tmp_path / "data" / "omnicore" / "voices"
    log = tmp_path / "server.log"
    for run in range(2):
        port = free_port()
        proc = spawn_omnicore("serve", "--model", TINY, "--port", port, log_path=log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_serving(proc, url + "/health", 90, "the server", log.read_text)
            if run == 0:
                r = _get(url + "/v1/voices", method="POST", json={
                    "name": "kept", "instruct": "female", "num_step": 1, "text": "Hi there."})
                assert r.status_code == 201, r.text
            else:
                assert _get(url + "/v1/voices/kept").status_code == 200
        finally:
            stop_process(proc, 30)
        held = 2 * run  # "kept" and the door's voice "alloy", made before run 0 was ready
        assert f"Voices: {held} in {folder}; cloned voices need no consent" in log.read_text()
    assert (folder / "kept.npz").is_file()

    monkeypatch.setenv("OMNICORE_VOICES_DIR", str(tmp_path / "chosen"))
    state = server_state(TINY)  # what serve, wyoming and mcp start on
    try:
        assert state.voices.folder == tmp_path / "chosen" and state.voices.persistent
    finally:
        state.close()


def _designed(url: str, name: str) -> None:
    r = _get(url + "/v1/voices", method="POST", json={
        "name": name, "instruct": "female, low pitch", "num_step": 1, "text": "Hi there."})
    assert r.status_code == 201, r.text


def test_a_label_that_is_not_text_is_refused_and_costs_only_its_own_entry(servers, voices_dir):
    """A lone surrogate is JSON but not text: as a voice's or a consent's label it is a 400
    (it would break every answer that lists it), and a record on disk that holds one (written
    by an older server, or by hand) costs its own entry in the lists, never the list."""
    body = b'{"name": "\\ud800 x", "type": "prompt", "prompt": "female", "num_step": 1}'
    r = _get(servers[0] + "/v1/audio/voices", method="POST", content=body,
             headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "name", r.text
    consent = _get(servers[0] + "/v1/audio/voice_consents", method="POST",
                   data={"name": "Plain", "language": "en"},
                   files={"recording": ("c.wav", _wav(1.0), "audio/wav")}).json()["id"]
    r = _get(f"{servers[1]}/v1/audio/voice_consents/{consent}", method="POST",
             content=b'{"name": "\\udfff"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "name", r.text
    assert _get(f"{servers[0]}/v1/audio/voice_consents/{consent}").json()["name"] == "Plain"

    _designed(servers[0], "odd_label")
    record = voices_dir / "odd_label.voice.json"
    record.write_text(record.read_text().replace('"name": "odd_label"', '"name": "\\ud800 x"'))
    odd = "cons_" + "e" * 24
    (voices_dir / "consents" / f"{odd}.json").write_text(
        '{"id": "%s", "object": "audio.voice_consent", "name": "\\udfff", "language": "en", '
        '"created_at": 1, "recording": "%s.wav"}' % (odd, odd))
    try:
        for url in servers:
            r = _get(url + "/v1/voices")
            assert r.status_code == 200, r.text
            shown = {v["id"]: v for v in r.json()["data"]}
            assert shown["odd_label"]["name"] == "odd_label"  # a voice without its record
            assert _get(url + "/v1/voices/odd_label").status_code == 200
            r = _get(url + "/v1/audio/voice_consents?limit=100")
            assert r.status_code == 200 and consent in {c["id"] for c in r.json()["data"]}
            assert odd not in {c["id"] for c in r.json()["data"]}
    finally:
        (voices_dir / "consents" / f"{odd}.json").unlink()
        assert _get(servers[0] + "/v1/voices/odd_label", method="DELETE").status_code == 200


def test_preset_names_are_reserved_in_any_case(servers):
    for name in ("Alloy", "ALLOY", "Cedar"):
        r = _get(servers[0] + "/v1/voices", method="POST", json={
            "name": name, "instruct": "female", "num_step": 1, "text": "Hi there."})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "voice_reserved"), r.text
    r = _get(servers[1] + "/v1/voices/ash", method="DELETE")  # listed, not made: nothing to delete
    assert r.status_code == 404 and "preset voice not made" in r.json()["error"]["message"]


def test_a_folder_where_a_record_should_be_deletes_nothing(servers, voices_dir):
    """A folder named like a voice's record: DELETE is a 409 that names it, checked before
    anything is removed, so the voice stays whole and usable."""
    _designed(servers[0], "foldered")
    (voices_dir / "foldered.voice.json").unlink()
    (voices_dir / "foldered.voice.json").mkdir()
    try:
        for url in servers:
            r = _get(url + "/v1/voices/foldered", method="DELETE")
            assert (r.status_code, r.json()["error"]["code"]) == (409, "voice_file_unremovable")
            assert "foldered.voice.json" in r.json()["error"]["message"]
            assert str(voices_dir) not in r.text
        assert (voices_dir / "foldered.npz").is_file()
        assert _get(servers[1] + "/v1/voices/foldered").status_code == 200
    finally:
        (voices_dir / "foldered.voice.json").rmdir()
    assert _get(servers[1] + "/v1/voices/foldered", method="DELETE").status_code == 200


def test_nothing_outside_the_folder_is_read_or_copied_in(servers, voices_dir, tmp_path):
    """A record symlinked to a file outside the folder is not read (its label is not shown);
    a consent whose recording is a symlink out of the folder, or is missing, is a 409 on a
    clone that names neither path, and nothing is copied in."""
    _designed(servers[0], "linked")
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"name": "Outside label", "type": "prompt", "created_at": 1}))
    (voices_dir / "linked.voice.json").unlink()
    (voices_dir / "linked.voice.json").symlink_to(outside)
    secret = tmp_path / "secret.wav"
    secret.write_bytes(_wav(1.0, pitch=300.0))
    made = []
    for _ in range(2):
        made.append(_get(servers[0] + "/v1/audio/voice_consents", method="POST",
                         data={"name": "Ann", "language": "en"},
                         files={"recording": ("c.wav", _wav(1.0), "audio/wav")}).json()["id"])
    linked, missing = made
    (voices_dir / "consents" / f"{linked}.wav").unlink()
    (voices_dir / "consents" / f"{linked}.wav").symlink_to(secret)
    (voices_dir / "consents" / f"{missing}.wav").unlink()
    try:
        for url in servers:
            assert _get(url + "/v1/voices/linked").json()["name"] == "linked"
            shown = {v["id"]: v["name"] for v in _get(url + "/v1/voices").json()["data"]}
            assert shown["linked"] == "linked"
        for cid in (linked, missing):
            r = _get(servers[1] + "/v1/voices", method="POST",
                     data={"name": "stolen", "ref_text": "A short test clip.", "consent": cid},
                     files={"audio": ("a.wav", _wav(2.0, pitch=150.0), "audio/wav")})
            assert r.status_code == 409, r.text
            err = r.json()["error"]
            assert (err["code"], err["param"]) == ("consent_recording_missing", "consent")
            assert str(voices_dir) not in r.text and str(tmp_path) not in r.text
        assert not list(voices_dir.glob("stolen*"))
    finally:
        (voices_dir / "linked.voice.json").unlink()
        assert _get(servers[0] + "/v1/voices/linked", method="DELETE").status_code == 200
        for cid in made:
            _get(f"{servers[0]}/v1/audio/voice_consents/{cid}", method="DELETE")


def test_a_voice_made_by_a_door_names_its_checkpoint(servers, voices_dir):
    """Every voice a door makes records the checkpoint that made it: its codec's fingerprint
    for a clone, the whole model's too for a designed voice."""
    from omnicore.apps.server.voices import maker
    from omnicore.machinery import checkpoint

    _designed(servers[0], "marked")
    try:
        made = json.loads((voices_dir / "marked.voice.json").read_text())["made_by"]
        assert made["checkpoint"] == TINY.name
        assert made["codec"] == checkpoint.fingerprint(TINY / "audio_tokenizer")
        assert made["model"] == maker(OmniVoice.from_pretrained(TINY)).model
    finally:
        assert _get(servers[0] + "/v1/voices/marked", method="DELETE").status_code == 200
