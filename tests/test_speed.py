"""`doit list` and a build with nothing to do answer without loading the instance: the graph kept
by the last load is read (aicg/cli_graph.py), nothing is planned, no realisation profile decoded.
Run as a user runs them, in a process of their own (docs/performance.md has the figures on the
default instance)."""
from __future__ import annotations

import os
import resource
import statistics
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


def _environment(project) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AICG_")}
    return {**env, "AICG_CACHE_DIR": str(project / "cache")}   # as the build above had it


def _aicg(project, *args) -> tuple[subprocess.CompletedProcess, float]:
    """The run and the processor time it took (user and system: what other work on the machine
    does not lengthen, as it does the wall clock)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", RUN.format(modules=FULL_LOAD), *args], cwd=project,
                          env=_environment(project), capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("command", ["list", "build"])
def test_a_command_with_nothing_to_do_loads_nothing_of_the_instance(project, command):
    done, _ = _aicg(project, command, PROFILE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded: \n" in done.stdout, done.stdout
    if command == "build":
        assert "nothing to do" in done.stdout and "instance small -> " in done.stdout


@pytest.mark.parametrize("command", ["list", "build"])
def test_a_command_with_nothing_to_do_takes_under_a_second(project, command):
    seconds = statistics.median(_aicg(project, command, PROFILE)[1] for _ in range(3))
    print(f"aicg {command} with nothing to do: {seconds:.3f} s of processor time")
    assert seconds < 1.0


def test_an_edit_loads_it_in_full_once(project):
    profile = project / "rulesets/profiles/small.toml"
    text = profile.read_text()
    profile.write_text(text + "\n# an edit\n")
    try:
        first, _ = _aicg(project, "list", PROFILE)
        again, _ = _aicg(project, "list", PROFILE)
    finally:
        profile.write_text(text)
    assert "loaded: aicg.tasks.graph" in first.stdout and "loaded: \n" in again.stdout
