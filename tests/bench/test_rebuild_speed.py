"""Benchmarks (pytest-benchmark) of rebuilding the default instance.

No-op rebuild and cache-hit rebuild (build/ deleted) against `doit list` of
the same graph, all in one run. Figures go to docs/performance.md; nothing
here asserts a time.
"""
from __future__ import annotations

import shutil

import pytest

from doit_project import doit, make_project

DEFAULT = "profile=rulesets/profiles/default.toml"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("bench"))
    assert doit(project, "build", DEFAULT).code == 0
    return project


def test_list(benchmark, project):
    benchmark.pedantic(lambda: doit(project, "list", "--all", DEFAULT), rounds=5, iterations=1)


def test_noop_build(benchmark, project):
    run = benchmark.pedantic(lambda: doit(project, "build", DEFAULT), rounds=5, iterations=1)
    assert run.executed == []


def test_cache_hit_build(benchmark, project):
    def rebuild():
        shutil.rmtree(project / "build")
        return doit(project, "build", DEFAULT)
    run = benchmark.pedantic(rebuild, rounds=3, iterations=1)
    assert run.compilations == 0
