"""Benchmarks: a cold build against a build from a warm remote (nginx on
loopback), same machine, fresh local store each time; the bytes moved and the
connections nginx accepted for them are printed. Figures go to
docs/performance.md; nothing here asserts a time."""
from __future__ import annotations

import json
import time

import pytest

from doit_project import doit, make_project
from remote_servers import Nginx

DEFAULT = "profile=rulesets/profiles/default.toml"


@pytest.fixture(scope="module")
def nginx(tmp_path_factory):
    server = Nginx(tmp_path_factory.mktemp("nginx"))
    yield server
    server.stop()


def _timed_build(project, env, nginx):
    connections, requests = nginx.connections()
    start = time.monotonic()
    run = doit(project, "build", DEFAULT, env=env)
    assert run.code == 0, run.output
    elapsed = time.monotonic() - start
    counters = json.loads((project / "cache/last-build.json").read_text())["counters"]
    now = nginx.connections()
    return elapsed, run, counters, f"{now[0] - connections} connections for {now[1] - requests} requests"


def test_cold_build_against_warm_remote(tmp_path, nginx):
    cold, run, up, traffic_up = _timed_build(make_project(tmp_path / "cold"),
                                             {"AICG_REMOTE": nginx.url, "AICG_REMOTE_MODE": "write"}, nginx)
    warm, again, down, traffic_down = _timed_build(make_project(tmp_path / "warm"), {"AICG_REMOTE": nginx.url}, nginx)
    assert again.compilations == 0
    print(f"\ncold build (populating the remote): {cold:.2f} s, {run.compilations} NVRTC compilations, "
          f"{up.get('bytes_up', 0)} bytes up, {traffic_up}")
    print(f"warm remote, fresh local store:     {warm:.2f} s, 0 compilations, {down.get('bytes_down', 0)} bytes down, "
          f"{down.get('remote_hits', 0)} remote hits, {traffic_down}")
    print(f"ratio cold / warm: {cold / warm:.1f}")
