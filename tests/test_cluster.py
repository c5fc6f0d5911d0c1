"""`omnicore batch --ray` on a local Ray instance (2 CPUs) and the tiny checkpoint: the same
outputs as the local batch, actor deaths, an interrupted driver and bad lines; and the driver's
pure parts (queue, manifest) without Ray."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from conftest import require_module
from omnicore.audio import writers
from omnicore.apps import cluster
from omnicore.apps.cli import main
from omnicore.errors import InputError

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "weights" / "tiny-random")
SPEECH = str(ROOT / "tests" / "fixtures" / "audio" / "speech_24k.wav")
SPEECH16 = str(ROOT / "tests" / "fixtures" / "audio" / "speech_16k_stereo.wav")
# Greedy and seeded: the local batch and the actors must make the same codes.
FAST = ["--model", TINY, "--steps", "2", "--greedy", "--seed", "5", "-q"]


@pytest.fixture(scope="module")
def ray():
    """One local Ray instance for the module (starting one costs seconds), shut down at its end."""
    ray = require_module("ray", extra="ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _rows(n=12):
    """Auto, designed and cloned jobs; two voices, each shared by several jobs."""
    rows = []
    for i in range(n):
        row = {"id": f"j{i:02d}", "text": f"Sentence number {i}, spoken."}
        if i % 3 == 1:
            row.update(ref_audio=SPEECH, ref_text="The quick brown fox.")
        elif i % 3 == 2 and i % 2:
            row.update(ref_audio=SPEECH16, ref_text="The quick brown fox jumps over the lazy dog.")
        elif i % 4 == 0:
            row.update(instruct="female, low pitch", speed=1.1)
        rows.append(row)
    return rows


def _jobs_file(tmp_path, rows, name="jobs.jsonl") -> str:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n",
                    encoding="utf-8")
    return str(path)


def _manifest(out) -> list[dict]:
    """The manifest's records; a torn line (a driver killed mid-write) left out."""
    recs = []
    for line in (Path(out) / "manifest.jsonl").read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            assert line == TORN
    return recs


TORN = '{"id": "j11", "sta'


def _run(ray, jobs_path, out, on_record=None) -> dict:
    """The driver as the CLI calls it, with a hook on each result."""
    from omnicore.apps.cli import build_parser
    from omnicore.apps.cli.batch import run_ray_batch

    args = build_parser().parse_args(["batch", jobs_path, "--out-dir", str(out), "--ray", "--workers", "2",
                                      "--threads-per-worker", "1", *FAST])
    return run_ray_batch(args, on_record=on_record)


def _assert_complete(out, ids):
    """Every id written once and recorded ok once; no temporary file left."""
    recs = _manifest(out)
    ok = [r["id"] for r in recs if r["status"] == "ok"]
    assert sorted(ok) == sorted(ids), recs
    assert sorted(p.name for p in Path(out).iterdir()) == sorted(
        [f"{i}.wav" for i in ids] + ["manifest.jsonl"])
    for r in recs:
        assert sf.info(r["path"]).frames == r["samples"] and r["seconds"] > 0


def test_ray_batch_equals_the_local_batch(ray, tmp_path):
    """The same audio as the local batch; and the summary reports each actor's threads and
    memory (in this run, rather than starting two more actors for a run of their own)."""
    rows = _rows()
    jobs = _jobs_file(tmp_path, rows)
    assert main(["batch", jobs, "--out-dir", str(tmp_path / "local"), *FAST]) == 0
    # what `batch --ray` runs; the command itself, and its exit status, in test_bad_jobs_...
    summary = _run(ray, jobs, tmp_path / "ray")
    assert summary["ok"] == 12 and summary["failed"] == 0 and len(summary["workers"]) == 2
    for w in summary["workers"]:
        assert w["threads"] == 1  # --threads-per-worker reached the actor's Numba pool
        assert 50 * 2**20 < w["peak_rss"] < 8 * 2**30
    for row in rows:
        a, sa = sf.read(tmp_path / "local" / f"{row['id']}.wav", dtype="int16")
        b, sb = sf.read(tmp_path / "ray" / f"{row['id']}.wav", dtype="int16")
        assert sa == sb == 24000 and a.shape == b.shape, row["id"]
        # Same codes: one different code changes the (noise-like) tiny checkpoint's audio
        # everywhere after it. What may differ is the decode's float rounding (1-thread BLAS
        # in the actors, 2 threads here): float32 results a few ulp of full scale apart land
        # on either side of a 16-bit step on well under 1 % of the samples (0.02-0.3 % seen,
        # depending on the GEMM shapes); a wrong code would change most of them.
        diff = np.abs(a.astype(np.int32) - b)
        assert diff.max() <= 1 and np.count_nonzero(diff) < a.size // 100, row["id"]
    _assert_complete(tmp_path / "ray", [r["id"] for r in rows])
    recs = _manifest(tmp_path / "ray")
    # Jobs go to whichever actor is free: a slow-starting actor may get none of 12 short jobs,
    # so "both worked" would hold by chance. Each job names one of the two actors.
    workers = {r["worker"].split("@")[0] for r in recs}
    assert workers and workers <= {"w0", "w1"}, workers
    for r in recs:
        assert r["error"] is None and r["compute_seconds"] > 0 and r["line"] >= 1


def test_killed_actor_every_job_finishes_exactly_once(ray, tmp_path):
    rows = _rows()
    killed = []

    def kill_once(rec, actor):
        if not killed:  # the actor has other items in flight: they must be run again
            killed.append(rec["worker"])
            ray.kill(actor)

    summary = _run(ray, _jobs_file(tmp_path, rows), tmp_path / "o", on_record=kill_once)
    assert killed and summary["retried"] >= 1  # the killed actor's unfinished items ran again
    assert summary["ok"] == 12 and summary["failed"] == 0
    _assert_complete(tmp_path / "o", [r["id"] for r in rows])
    assert len(_manifest(tmp_path / "o")) == 12  # one line per job: none written twice


def test_interrupted_driver_rerun_does_only_the_missing_jobs(ray, tmp_path):
    rows = _rows()
    jobs, out = _jobs_file(tmp_path, rows), tmp_path / "o"

    def interrupt(rec, actor):
        if len(_manifest(out)) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(ray, jobs, out, on_record=interrupt)
    first = _manifest(out)
    assert len(first) == 4 and all(r["status"] == "ok" for r in first)
    # a torn last line (a driver killed mid-write) is skipped, and the next record starts clean
    with open(out / "manifest.jsonl", "a") as fh:
        fh.write(TORN)
    # temporary files of writers killed mid-write: this batch's go, others stay
    killed_writer, other = writers.AtomicOutput(out / "j11.wav"), writers.AtomicOutput(out / "x.wav")
    summary = _run(ray, jobs, out)
    assert summary["skipped"] == 4 and summary["ok"] == 8
    assert not Path(killed_writer._tmp).exists() and Path(other._tmp).exists()
    other.abort()
    assert sorted(r["id"] for r in _manifest(out)[4:]) == sorted(
        {r["id"] for r in rows} - {r["id"] for r in first})
    _assert_complete(out, [r["id"] for r in rows])
    assert _run(ray, jobs, out)["skipped"] == 12  # all done: nothing runs


def test_bad_jobs_fail_alone_and_are_in_the_manifest(ray, tmp_path, capsys):
    rows = _rows(4)
    rows[1:1] = ["{not json",                                                   # line 2
                 {"id": "neg", "text": "Negative speed.", "speed": -1},          # line 3
                 {"id": "gone", "text": "Missing clip.", "ref_audio": str(tmp_path / "no.wav"),
                  "ref_text": "Hi."}]                                            # line 4
    out = tmp_path / "o"
    assert main(["batch", _jobs_file(tmp_path, rows), "--out-dir", str(out), "--ray",
                 "--workers", "2", *FAST]) == 1
    recs = {r["line"]: r for r in _manifest(out)}
    assert recs[2]["status"] == "failed" and recs[2]["id"] is None and "invalid JSON" in recs[2]["error"]
    assert recs[3]["status"] == "failed" and recs[3]["id"] == "neg" and "speed" in recs[3]["error"]
    assert recs[4]["status"] == "failed" and "no.wav" in recs[4]["error"]
    assert sorted(r["id"] for r in recs.values() if r["status"] == "ok") == ["j00", "j01", "j02", "j03"]
    err = capsys.readouterr().err
    assert "jobs.jsonl:2: invalid JSON" in err and "jobs.jsonl:4: id 'gone':" in err
    assert not (out / "gone.wav").exists() and not (out / "neg.wav").exists()


# ---------------------------------------------------------------------------------------------
# Without Ray
# ---------------------------------------------------------------------------------------------


def test_without_ray_the_flag_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    out = tmp_path / "o"
    assert main(["batch", _jobs_file(tmp_path, _rows(1)), "--out-dir", str(out), "--ray", *FAST]) == 2
    assert "pip install 'omnicore[ray]'" in capsys.readouterr().err and not out.exists()
    assert main(["batch", _jobs_file(tmp_path, _rows(1)), "--out-dir", str(out), "--workers", "2",
                 *FAST]) == 2
    assert "--workers sets the Ray workers; it needs --ray" in capsys.readouterr().err


def _item(i, voice=None):
    return cluster._Item(f"j{i}", i, "x", f"j{i}.wav", {}, voice)


def test_queue_keeps_a_voice_on_one_worker_and_retries_first():
    a, b = ("a.wav", "A"), ("b.wav", "B")
    q = cluster._Queue([_item(1, a), _item(2), _item(3, b), _item(4, a), _item(5, b), _item(6, a)])
    # worker 1 starts voice a and stays on it; worker 2 takes the plain item, then voice b
    assert q.take(None).id == "j1"
    assert q.take(None).id == "j2"
    assert q.take(a).id == "j4" and q.take(None).id == "j3" and q.take(b).id == "j5"
    retried = _item(9, b)
    q.put_back(retried)
    assert q.take(b) is retried  # a retry goes first in its group
    assert q.take(b).id == "j6"  # b is done: help with the largest group left (a)
    assert q.take(a) is None and len(q) == 0


def test_manifest_has_one_writer(tmp_path):
    m = cluster.Manifest(tmp_path / "manifest.jsonl")
    try:
        with pytest.raises(InputError, match="in use by another"):
            cluster.Manifest(tmp_path / "manifest.jsonl")
        m.append({"id": "a", "status": "ok", "samples": 5})
        m.append({"id": "a", "status": "failed"})  # the later line wins
    finally:
        m.close()
    assert cluster.read_manifest(tmp_path / "manifest.jsonl") == {"a": {"id": "a", "status": "failed"}}
    assert not cluster.is_done({"id": "a", "status": "ok", "samples": 5}, tmp_path / "a.wav")
