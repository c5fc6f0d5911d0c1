"""The voice library survives SIGKILL at any point of a change: a library whose writer was
killed always starts, never lists a half-written voice or consent, and never loses one whose
change had returned.

Two scales, each with a bounded number of kills so that CI time stays bounded:
  * the library itself (`VoiceLibrary`, the code every route's changes go through): a forked
    child makes random changes (voices with and without a consent's copy, consents created,
    renamed, deleted) and journals each one once it returned; it is killed KILLS times at
    random points, and each time a new library opens the folder and is checked against the
    journal;
  * two `omnicore serve` replicas on one folder, driven through both by one client that
    creates and deletes voices and consents, each replica killed and started again once
    (SERVER_KILLS); the API of both is then checked against what they had acknowledged.
"""

import io
import multiprocessing
import os
import random
import signal
import threading
import time

import numpy as np
import pytest

from conftest import require_module, require_server_extra, start_server, stop_process  # noqa: E402

require_server_extra()
httpx = require_module("httpx")
sf = require_module("soundfile")

from omnicore import VoiceClonePrompt  # noqa: E402
from omnicore.apps.server import VoiceLibrary  # noqa: E402
from omnicore.apps.server.library import read_record  # noqa: E402

pytestmark = pytest.mark.subprocess

KILLS = 40          # library-level kills (a forked child each: a fraction of a second per kill)
SERVER_KILLS = 2    # replica kills, one per replica (a server start each)
NAMES = [f"v{i}" for i in range(6)]


def _recording() -> bytes:
    buf = io.BytesIO()
    t = np.arange(12000) / 24000
    sf.write(buf, (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000, format="WAV",
             subtype="PCM_16")
    return buf.getvalue()


RECORDING = _recording()


def _churn(folder: str, journal: str, seed: int) -> None:
    """The child: random changes to the library on `folder`, each journalled ("done ...") once
    it returned, after a "start ..." line before it; runs until it is killed."""
    rng = random.Random(seed)
    lib = VoiceLibrary(folder)
    consents = [c["id"] for c in lib.consents()]
    with open(journal, "a", buffering=1) as j:
        j.write("ready\n")
        while True:
            op, name = rng.choice(("add", "add", "delete", "consent", "rename", "drop")), rng.choice(NAMES)
            if op == "add":
                codes = np.arange(8 * rng.randint(5, 400), dtype=np.int64).reshape(8, -1) % 1024
                consent = rng.choice(consents) if consents and rng.random() < 0.5 else None
                j.write(f"start add {name}\n")
                try:
                    lib.add(name, VoiceClonePrompt(codes, "Hello there.", 0.05),
                            {"type": "audio_sample"}, consent)
                    j.write(f"done add {name}\n")
                except Exception as exc:  # noqa: BLE001 - 409 (taken) or a consent just deleted
                    j.write(f"done add-refused {name} {getattr(exc, 'code', '')}\n")
            elif op == "delete":
                j.write(f"start delete {name}\n")
                lib.delete(name)
                j.write(f"done delete {name}\n")
            elif op == "consent":
                j.write("start consent\n")
                cid = lib.add_consent("Ann", "en", RECORDING, "wav")["id"]
                consents.append(cid)
                j.write(f"done consent {cid}\n")
            elif consents:
                cid = rng.choice(consents)
                j.write(f"start {op} {cid}\n")
                if op == "rename":
                    lib.rename_consent(cid, f"label {rng.randrange(1000)}")
                else:
                    lib.delete_consent(cid)
                    consents.remove(cid)
                j.write(f"done {op} {cid}\n")


def _expected(lines: list[str]) -> tuple[dict, dict]:
    """What the journal says must be there ({name: True}), gone ({name: False}) or either
    (absent from the dict: its last change was cut short), for voices and for consents."""
    voices, consents = {}, {}
    for line in lines:
        words = line.split()
        if len(words) < 2:
            continue
        state, op, key = words[0], words[1], words[2] if len(words) > 2 else None
        table = voices if op in ("add", "add-refused", "delete") else consents
        if state == "start":
            if key is not None:
                table.pop(key, None)
        elif op in ("add", "consent", "rename"):
            table[key] = True
        elif op in ("delete", "drop"):
            table[key] = False
        elif op == "add-refused":  # taken: it was there; else (its consent gone): nothing
            voices[key] = words[-1] == "voice_exists"
    return voices, consents


def _check_whole(lib: VoiceLibrary) -> tuple[set, set]:
    """Every voice and consent the library lists is whole; returns their names and ids."""
    names = set(lib.names())
    for name in names:
        rec = read_record(lib.folder / f"{name}.voice.json")
        assert rec is not None and rec["name"] == name, name  # written before the prompt
        assert lib.get(name).ref_text == "Hello there."
        if "consent" in rec:
            assert (lib.folder / rec["consent"]["recording"]).read_bytes() == RECORDING, name
    ids = {c["id"] for c in lib.consents()}
    for cid in ids:
        assert (lib.folder / "consents" / f"{cid}.wav").read_bytes() == RECORDING, cid
    return names, ids


def test_the_library_survives_sigkill_at_any_point(tmp_path):
    folder, journal = tmp_path / "voices", tmp_path / "journal"
    fork = multiprocessing.get_context("fork")
    rng = random.Random(0)
    for k in range(KILLS):
        before = journal.read_text().count("ready") if journal.exists() else 0
        child = fork.Process(target=_churn, args=(str(folder), str(journal), k), daemon=True)
        child.start()
        deadline = time.monotonic() + 60
        while (journal.read_text().count("ready") if journal.exists() else 0) == before:
            assert child.is_alive() and time.monotonic() < deadline, "the churn did not start"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))  # a random point of its changes
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        lib = VoiceLibrary(folder)  # starts, whatever the kill left
        names, ids = _check_whole(lib)
        voices, consents = _expected(journal.read_text().splitlines())
        assert {n for n, there in voices.items() if there} <= names, (voices, names)
        assert not {n for n, there in voices.items() if not there} & names, (voices, names)
        assert {c for c, there in consents.items() if there} <= ids, (consents, ids)
        assert not {c for c, there in consents.items() if not there} & ids, (consents, ids)
    assert sum(line.startswith("done") for line in journal.read_text().splitlines()) > KILLS


def test_two_replicas_killed_while_they_change_one_library(tmp_path):
    """A client creates and deletes voices and consents through both replicas of one folder
    while each replica in turn is SIGKILLed at a random point and started again (it always
    starts). Then both replicas list the same voices and consents, each of which is whole
    (its voice answers with its frames, its consent with its label), and every change a
    replica acknowledged and nothing later touched is there (or gone)."""
    folder = tmp_path / "voices"
    procs, urls = [], []
    for i in range(2):
        proc, url = start_server(folder, log_path=tmp_path / f"r{i}.log")
        procs.append(proc)
        urls.append(url)
    acked, lock, stop = [], threading.Lock(), threading.Event()
    rng = random.Random(1)

    def churn():
        k = 0
        while not stop.is_set():
            k += 1
            url, name = urls[k % 2], rng.choice(NAMES)
            op = rng.choice(("add", "add", "delete", "consent", "drop"))
            try:
                if op == "add":
                    r = httpx.post(url + "/v1/voices", timeout=60, json={
                        "name": name, "instruct": "male", "num_step": 1, "text": "Hi there."})
                    key, there = name, {201: True, 409: True}.get(r.status_code)
                elif op == "delete":
                    r = httpx.delete(f"{url}/v1/voices/{name}", timeout=60)
                    key, there = name, {200: False, 404: False}.get(r.status_code)
                elif op == "consent":
                    r = httpx.post(url + "/v1/audio/voice_consents", timeout=60,
                                   data={"name": "Ann", "language": "en"},
                                   files={"recording": ("c.wav", RECORDING, "audio/wav")})
                    key, there = r.json().get("id"), (True if r.status_code == 200 else None)
                else:
                    listed = httpx.get(url + "/v1/audio/voice_consents?limit=100", timeout=60)
                    ids = [c["id"] for c in listed.json()["data"]]
                    if not ids:
                        continue
                    key = rng.choice(ids)
                    r = httpx.delete(f"{url}/v1/audio/voice_consents/{key}", timeout=60)
                    there = {200: False, 404: False}.get(r.status_code)
            except (httpx.HTTPError, ValueError):  # the replica was killed under it
                key, there = (name if op in ("add", "delete") else None), None
            with lock:
                acked.append((op in ("consent", "drop"), key, there))

    client = threading.Thread(target=churn, daemon=True)
    client.start()
    try:
        for k in range(SERVER_KILLS):
            i = k % 2
            time.sleep(rng.uniform(0.5, 3.0))
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait()
            procs[i], urls[i] = start_server(folder, log_path=tmp_path / f"r{i}.{k}.log")
        time.sleep(1.0)
    finally:
        stop.set()
        client.join(120)
    try:
        listings = []
        for url in urls:
            voices = {v["id"] for v in httpx.get(url + "/v1/voices").json()["data"] if v["made"]}
            consents = {c["id"] for c in httpx.get(
                url + "/v1/audio/voice_consents?limit=100").json()["data"]}
            for name in voices:
                assert httpx.get(f"{url}/v1/voices/{name}").json()["frames"] > 0, name
            for cid in consents:
                assert httpx.get(f"{url}/v1/audio/voice_consents/{cid}").json()["name"] == "Ann"
            listings.append((voices, consents))
        assert listings[0] == listings[1]
        voices, consents = listings[0]
        final = {}
        for is_consent, key, there in acked:  # the last word on each key; None: unknown
            final[(is_consent, key)] = there
        for (is_consent, key), there in final.items():
            if key is None or there is None:
                continue
            assert (key in (consents if is_consent else voices)) == there, (key, there)
        assert sum(there is not None for _, _, there in acked) > 4 * SERVER_KILLS
    finally:
        for proc in procs:
            stop_process(proc, 10)
