"""Benchmarks: a cold build against a build from a warm remote (nginx on
loopback), same machine, fresh local store each time; the bytes moved are
printed. Figures go to docs/performance.md; nothing here asserts a time."""
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


def _timed_build(project, env):
    start = time.monotonic()
    run = doit(project, "build", DEFAULT, env=env)
    assert run.code == 0, run.output
    counters = json.loads((project / "cache/last-build.json").read_text())["counters"]
    return time.monotonic() - start, run, counters


def test_cold_build_against_warm_remote(tmp_path, nginx):
    cold, run, up = _timed_build(make_project(tmp_path / "cold"), {"AICG_REMOTE": nginx.url, "AICG_REMOTE_MODE": "write"})
    warm, again, down = _timed_build(make_project(tmp_path / "warm"), {"AICG_REMOTE": nginx.url})
    assert again.compilations == 0
    print(f"\ncold build (populating the remote): {cold:.2f} s, {run.compilations} NVRTC compilations, "
          f"{up.get('bytes_up', 0)} bytes up")
    print(f"warm remote, fresh local store:     {warm:.2f} s, 0 compilations, {down.get('bytes_down', 0)} bytes down, "
          f"{down.get('remote_hits', 0)} remote hits")
    print(f"ratio cold / warm: {cold / warm:.1f}")
