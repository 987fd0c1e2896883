"""`doit list` and a build with nothing to do answer without loading the instance: the graph kept
by the last load is read (aicg/cli_graph.py), nothing is planned, no realisation profile decoded.
Run as a user runs them, in a process of their own (docs/performance.md has the figures on the
default instance)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from doit_project import doit, make_project

PROFILE = "profile=rulesets/profiles/small.toml"
# What a load of the instance in full imports and the kept graph does not.
FULL_LOAD = ("aicg.tasks.graph", "aicg.tasks.package")
RUN = """
import sys
from aicg import cli
code = cli.main(sys.argv[1:])
loaded = [m for m in {modules!r} if m in sys.modules]
print("loaded:", ",".join(loaded))
sys.exit(code)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("speed") / "p")
    run = doit(project, "build", PROFILE)
    assert run.code == 0, run.output
    return project


def _environment(project, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AICG_")}
    return {**env, "AICG_CACHE_DIR": str(project / "cache"), **extra}   # as the build above had it


def _aicg(project, *args, extra: dict | None = None) -> subprocess.CompletedProcess:
    """The run, in a process of its own (what it imports is its own)."""
    return subprocess.run([sys.executable, "-c", RUN.format(modules=FULL_LOAD), *args], cwd=project,
                          env=_environment(project, extra or {}), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["list", "build"])
def test_a_command_with_nothing_to_do_loads_nothing_of_the_instance(project, command):
    done = _aicg(project, command, PROFILE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded: \n" in done.stdout, done.stdout
    if command == "build":
        assert "nothing to do" in done.stdout and "instance small -> " in done.stdout


def test_a_variable_aicg_does_not_read_keeps_the_graph(project):
    """A CI's own AICG_-named switches are not among what the graph is made from."""
    done = _aicg(project, "list", PROFILE, extra={"AICG_REQUIRE_SOMETHING": "1"})
    assert "loaded: \n" in done.stdout, done.stdout


def test_a_variable_aicg_reads_loads_it_in_full(project):
    done = _aicg(project, "list", PROFILE, extra={"AICG_REMOTE_TIMEOUT": "7"})
    assert "loaded: aicg.tasks.graph" in done.stdout, done.stdout


def test_an_edit_loads_it_in_full_once(project):
    profile = project / "rulesets/profiles/small.toml"
    text = profile.read_text()
    profile.write_text(text + "\n# an edit\n")
    try:
        first = _aicg(project, "list", PROFILE)
        again = _aicg(project, "list", PROFILE)
    finally:
        profile.write_text(text)
    assert "loaded: aicg.tasks.graph" in first.stdout and "loaded: \n" in again.stdout
