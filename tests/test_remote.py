"""Sharing the store through a remote, each fault with a real server on loopback."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from aicg import digest, remote
from doit_project import SMALL_PROFILE_COMPILATIONS, doit, instance_files, make_project, receipt_keys
from remote_servers import Misbehaving, Nginx, Silent, free_port

PROFILE = "profile=rulesets/profiles/small.toml"


@pytest.fixture
def nginx(tmp_path):
    server = Nginx(tmp_path / "nginx")
    yield server
    server.stop()


def build(project, env=None):
    run = doit(project, "build", PROFILE, env=env)
    assert run.code == 0, run.output
    return run


def counters(project):
    return json.loads((project / "cache/last-build.json").read_text())["counters"]


def writer(url, **extra):
    return {"AICG_REMOTE": url, "AICG_REMOTE_MODE": "write", **extra}


def test_a_second_checkout_restores_everything_from_the_remote(tmp_path, nginx):
    first = make_project(tmp_path / "first")
    build(first, writer(nginx.url))
    second = make_project(tmp_path / "elsewhere/second")    # another directory, a fresh local store
    run = build(second, {"AICG_REMOTE": nginx.url})
    assert run.compilations == 0
    origins = json.loads((second / "build/small/provenance.json").read_text())["origins"]
    assert {o for n, o in origins.items() if n.startswith(("compile:", "codegen:", "plan:"))} == {"remote"}
    assert receipt_keys(first) == receipt_keys(second)       # no path leaks into a key
    connections, requests = nginx.connections()
    assert requests > 50 and connections == 2                 # one kept alive per build
    assert instance_files(first) == instance_files(second)
    assert counters(second)["bytes_down"] > 0
    # the remote hits now live in the local store too: without the remote, nothing is missing
    (second / "build").rename(second / "old-build")
    assert build(second).compilations == 0 and counters(second).get("remote_hits", 0) == 0


def test_read_mode_never_writes_to_the_remote(tmp_path, nginx):
    build(make_project(tmp_path / "p"), {"AICG_REMOTE": nginx.url})
    assert not nginx.files.exists() or not any(nginx.files.rglob("*"))


@pytest.mark.parametrize("fault", ["down", "slow"])
def test_a_dead_or_silent_remote_costs_one_warning_and_one_request(tmp_path, fault):
    server = Silent() if fault == "slow" else None
    url = server.url if server else f"http://127.0.0.1:{free_port()}/aicg"
    try:
        run = build(make_project(tmp_path / "p"), writer(url, AICG_REMOTE_TIMEOUT="0.5"))
    finally:
        if server:
            server.stop()
    assert run.code == 0 and run.compilations == SMALL_PROFILE_COMPILATIONS
    assert run.output.count("remote store") == 1 and "unavailable" in run.output
    # The first request that times out marks the remote unavailable for the build: no step after
    # it waits on the remote again (a timeout per request would cost the dozens of steps 0.5 s each).
    assert server is None or len(server.held) == 1, len(server.held)


def test_a_trickling_remote_holds_a_build_no_longer_than_its_timeout(tmp_path):
    # A byte every 0.2 s, so that no read waits the 0.5 s timeout; 9 s of it in all, then the rest at once.
    server = Misbehaving(tmp_path, lambda n: "trickle", trickle_gap=0.2, trickle_limit=9.0)
    try:
        run = build(make_project(tmp_path / "p"), {"AICG_REMOTE": server.url, "AICG_REMOTE_TIMEOUT": "0.5"})
    finally:
        server.stop()
    assert sum(server.held) < 1.0, server.held
    assert run.output.count("remote store") == 1 and "unavailable" in run.output
    assert run.compilations == SMALL_PROFILE_COMPILATIONS


@pytest.mark.parametrize("fault", ["garbage status line", "half a body"])
def test_a_remote_answering_nonsense_is_a_miss_with_one_warning(tmp_path, fault):
    server = Misbehaving(tmp_path / "remote", lambda n: fault)
    try:
        run = build(make_project(tmp_path / "p"), {"AICG_REMOTE": server.url, "AICG_REMOTE_TIMEOUT": "1"})
    finally:
        server.stop()
    assert run.compilations == SMALL_PROFILE_COMPILATIONS
    assert run.output.count("remote store") == 1 and "unavailable" in run.output and "Traceback" not in run.output


@pytest.mark.parametrize("fault", ["trickle", "503", "reset", "half a body"])
def test_one_request_takes_the_timeout_at_most_retries_included(tmp_path, fault):
    server = Misbehaving(tmp_path, lambda n: fault, trickle_gap=0.05)
    try:
        start = time.monotonic()
        with pytest.raises(remote.Unavailable):
            remote.connect(server.url, 0.5).get("ac", "0" * 64)
        elapsed = time.monotonic() - start
    finally:
        server.stop()
    assert elapsed < 0.7, elapsed
    assert fault == "trickle" or server.requests > 1        # a transient fault is tried again


def test_one_connection_serves_a_build_and_transient_faults_are_retried(tmp_path):
    shared = tmp_path / "shared"
    faults = {}
    server = Misbehaving(shared, lambda n: faults.get(n))
    try:
        first = make_project(tmp_path / "first")
        build(first, writer(server.url))
        assert server.requests > 100 and server.connections == 1
        # One of each on the next build's early requests, each but the 503 closing its connection.
        server.requests = server.connections = 0
        faults.update({2: "reset", 4: "503", 6: "hang up", 9: "garbage status line", 12: "half a body"})
        second = make_project(tmp_path / "second")
        run = build(second, {"AICG_REMOTE": server.url})
    finally:
        server.stop()
    assert sorted(server.faults_done) == sorted(faults.values())
    assert "remote store" not in run.output and run.compilations == 0
    assert instance_files(second) == instance_files(first)
    assert server.requests > 30 and server.connections == 1 + 4


def test_write_mode_checks_every_blob_its_entries_name(tmp_path, nginx):
    """A writer relies on the blobs under the entries it writes: a wrong one is replaced, whether
    this build read it or only found it there."""
    first = make_project(tmp_path / "first")
    build(first, writer(nginx.url))
    blobs = sorted((nginx.files / "cas").iterdir())
    for path in blobs:
        data = path.read_bytes()
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    for path in sorted((nginx.files / "ac").iterdir())[::2]:
        path.unlink()                    # these steps run without reading their blobs
    build(make_project(tmp_path / "second"), writer(nginx.url))
    wrong = [p.name for p in blobs if hashlib.sha256(p.read_bytes()).hexdigest() != p.name]
    assert wrong == [], f"{len(wrong)} of {len(blobs)} blobs still wrong"


@pytest.mark.parametrize("kind", ["directory", "http"])
def test_a_remote_holds_a_blob_only_with_its_bytes(tmp_path, kind):
    (tmp_path / "cas").mkdir()
    blob = b"a cubin"
    sha = hashlib.sha256(blob).hexdigest()
    server = Misbehaving(tmp_path) if kind == "http" else None
    try:
        store = remote.connect(server.url if server else str(tmp_path), 1.0)
        assert not store.has("cas", sha)
        (tmp_path / "cas" / sha).write_bytes(b"a cubiN")
        assert not store.has("cas", sha)          # a file of that name is not the blob
        store.put("cas", sha, blob)
        assert store.has("cas", sha) and store.get("cas", sha) == blob
    finally:
        if server:
            server.stop()


def _compile_blobs(project):
    """sha256 names of the cubins the project's compile steps produced."""
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((project / "build/small/cubin").glob("*.cubin"))]


def test_corrupt_truncated_and_foreign_blobs_are_misses_rebuilt_and_replaced(tmp_path, nginx):
    first = make_project(tmp_path / "first")
    build(first, writer(nginx.url))
    good = instance_files(first)
    a, b, c = _compile_blobs(first)[:3]
    blob = lambda sha: nginx.files / "cas" / sha
    original = {sha: blob(sha).read_bytes() for sha in (a, b, c)}
    blob(a).write_bytes(original[a][:-1] + bytes([original[a][-1] ^ 0xFF]))   # corrupted
    blob(b).write_bytes(original[b][:64])                                       # truncated
    blob(c).write_bytes(original[a])                                            # another blob's bytes

    second = make_project(tmp_path / "second")
    run = build(second, writer(nginx.url))
    assert run.compilations == 3
    assert counters(second)["remote_corrupt_blobs"] == 3
    assert instance_files(second) == good
    assert all(blob(sha).read_bytes() == original[sha] for sha in (a, b, c))   # replaced in write mode


def test_an_entry_whose_blob_is_missing_is_a_miss(tmp_path, nginx):
    first = make_project(tmp_path / "first")
    build(first, writer(nginx.url))
    (nginx.files / "cas" / _compile_blobs(first)[0]).unlink()
    second = make_project(tmp_path / "second")
    run = build(second, {"AICG_REMOTE": nginx.url})
    assert run.compilations == 1 and counters(second)["remote_missing_blobs"] == 1
    assert instance_files(second) == instance_files(first)


def test_signed_entries_are_trusted_only_with_the_same_key(tmp_path, nginx):
    key, other = tmp_path / "key", tmp_path / "other"
    key.write_text("team secret")
    other.write_text("somebody else")
    build(make_project(tmp_path / "signer"), writer(nginx.url, AICG_SIGNING_KEY_FILE=str(key)))
    trusted = build(make_project(tmp_path / "trusted"), {"AICG_REMOTE": nginx.url, "AICG_SIGNING_KEY_FILE": str(key)})
    assert trusted.compilations == 0
    stranger = make_project(tmp_path / "stranger")
    run = build(stranger, {"AICG_REMOTE": nginx.url, "AICG_SIGNING_KEY_FILE": str(other)})
    assert run.compilations == SMALL_PROFILE_COMPILATIONS and counters(stranger)["remote_untrusted_entries"] > 0


def test_unsigned_entries_are_refused_by_a_client_with_a_key(tmp_path, nginx):
    key = tmp_path / "key"
    key.write_text("team secret")
    build(make_project(tmp_path / "unsigned"), writer(nginx.url))      # a writer without the key
    careful = make_project(tmp_path / "careful")
    run = build(careful, {"AICG_REMOTE": nginx.url, "AICG_SIGNING_KEY_FILE": str(key)})
    assert run.compilations == SMALL_PROFILE_COMPILATIONS and counters(careful)["remote_untrusted_entries"] > 0


def test_a_shared_directory_works_as_a_remote(tmp_path):
    shared = tmp_path / "nfs"
    build(make_project(tmp_path / "a"), writer(str(shared)))
    assert (shared / "ac").is_dir() and (shared / "cas").is_dir()
    assert build(make_project(tmp_path / "b"), {"AICG_REMOTE": str(shared)}).compilations == 0


def _doit_process(project, env_extra=None):
    env = {**os.environ, "AICG_CACHE_DIR": str(project / "cache"), **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "doit", "build", PROFILE], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _well_formed(project):
    """No torn file: every JSON parses and every packaged cubin matches its digest."""
    root = project / "build/small"
    for path in root.rglob("*.json"):
        json.loads(path.read_text())
    manifest = json.loads((root / "manifest.json").read_text())
    for entry in manifest["kernels"].values():
        assert digest.of_bytes((root / entry["cubin"]).read_bytes()) == entry["cubin_digest"]


def test_two_builds_at_once_both_finish_correct(tmp_path, nginx):
    reference = make_project(tmp_path / "reference")
    build(reference)
    project = make_project(tmp_path / "p")
    runs = [_doit_process(project, writer(nginx.url)) for _ in range(2)]
    outputs = [r.communicate(timeout=300)[0].decode() for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outputs
    _well_formed(project)
    assert instance_files(project) == instance_files(reference)


def test_a_build_killed_at_random_points_then_finished_is_bit_identical(tmp_path):
    reference = make_project(tmp_path / "reference")
    build(reference)
    project = make_project(tmp_path / "p")
    rng = random.Random(7)
    for _ in range(5):
        process = _doit_process(project)
        time.sleep(rng.uniform(0.3, 2.0))
        process.send_signal(signal.SIGKILL)
        process.wait()
    build(project)
    _well_formed(project)
    assert instance_files(project) == instance_files(reference)


def test_recache_reruns_everything_and_overwrites_bad_entries(tmp_path):
    project = make_project(tmp_path / "p")
    build(project)
    for path in (project / "cache/objects").rglob("*"):
        if path.is_file():
            path.write_bytes(b"rot")        # every blob rotten
    run = doit(project, "build", PROFILE, "recache=1")
    assert run.code == 0 and run.compilations == SMALL_PROFILE_COMPILATIONS
    (project / "build").rename(project / "old-build")
    assert build(project).compilations == 0   # the entries were rewritten whole


def test_cache_stats_and_gc(tmp_path):
    project = make_project(tmp_path / "p")
    build(project)
    stats = doit(project, "cache", "stats")
    assert "objects" in stats.output and "last build" in stats.output and "misses" in stats.output
    size = lambda: sum(p.stat().st_size for p in (project / "cache").glob("*/*/*"))
    assert size() > 50_000
    gc = doit(project, "cache", "gc", "--max-size", "50K")
    assert gc.code in (0, None) and "removed" in gc.output and size() <= 50 * 1024
    assert build(project).code == 0            # whatever went is rebuilt
