"""The command line: settings refused with the nearest, `doit help <task>` listing them, the
kept graph (aicg/cli_graph.py), progress, and where inputs come from (aicg/cli_layout.py)."""
from __future__ import annotations

import io
import json
import os

import pytest

from aicg import cli_graph, cli_layout, cli_progress, cli_vars, digest, suggest
from aicg.errors import InputError
from aicg.tasks import doit_tasks, graph
from doit_project import doit, instance_files, make_project

PROFILE = "profile=rulesets/profiles/small.toml"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A project whose small instance is built."""
    project = make_project(tmp_path_factory.mktemp("cli") / "p")
    run = doit(project, "build", PROFILE)
    assert run.code == 0, run.output
    return project


# -- did you mean -----------------------------------------------------------------------

@pytest.mark.parametrize("typed, known, expected", [
    ("sofmax", ["softmax", "log_softmax", "row_sum"], "softmax"),
    ("h100", ["h100-sxm", "nvidia-h200", "l4"], "h100-sxm"),
    ("FLOAT16", ["float16", "bfloat16", "float32"], "float16"),
    ("profil", list(cli_vars.SETTINGS), "profile"),
    ("mi300x", ["h100-sxm", "nvidia-h200", "l4"], None),
    ("", ["a"], None),
])
def test_the_nearest_known_name(typed, known, expected):
    assert suggest.nearest(typed, known) == expected
    assert suggest.did_you_mean(typed, known) == (f"Did you mean {expected}?" if expected and expected != typed else "")


# -- name=value settings -----------------------------------------------------------------

def test_an_unknown_setting_is_refused_naming_it_the_known_ones_and_the_nearest(tmp_path):
    project = make_project(tmp_path / "p")
    run = doit(project, "build", "profil=rulesets/profiles/small.toml")
    assert run.code != 0
    assert "command line: profil: expected a setting that aicg reads (one of: profile=, target=, recache=" in run.output
    assert "Did you mean profile?" in run.output and "Traceback" not in run.output
    assert not (project / "build").exists()   # the default profile was not built instead


def test_a_flag_that_is_neither_0_nor_1(tmp_path):
    with pytest.raises(InputError, match="recache: expected 0 or 1, found 'yes'"):
        cli_vars.check({"recache": "yes"})
    cli_vars.check({"recache": "1", "profile": "x", "op": "softmax"})


def test_a_misspelt_profile_path_names_the_nearest(tmp_path):
    run = doit(make_project(tmp_path / "p"), "list", "profile=rulesets/profiles/smal.toml")
    assert run.code != 0 and "Did you mean rulesets/profiles/small.toml?" in run.output


def test_a_target_hwdb_lacks_fails_the_build_not_the_probe(tmp_path):
    """A profile whose target has no hwdb entry yet (a GPU not probed) fails the instance's tasks
    with the reason; `doit probe`, which writes that entry, stays runnable."""
    project = make_project(tmp_path / "p")
    whole = {line.split()[0] for line in doit(make_project(tmp_path / "whole"), "list").output.splitlines() if line.strip()}
    (project / "hwdb/h100-sxm.toml").unlink()
    listed = doit(project, "list")
    assert listed.code == 0 and "probe" in listed.output, listed.output
    # every command of the instance is there, failing with the reason (the kinds of its steps aside)
    assert whole - set(doit_tasks.KIND_DOCS) <= {line.split()[0] for line in listed.output.splitlines() if line.strip()}
    run = doit(project, "build")
    assert run.code != 0 and "instance.target: expected a hwdb entry in" in run.output, run.output
    assert "'h100-sxm'" in run.output and not (project / "build").exists()
    assert "Kernel launch overhead" in doit(project, "info", "probe:launch").output


def test_help_of_a_task_lists_its_settings(built):
    helped = doit(built, "help", "build", PROFILE).output
    for name in ("profile=PATH", "target=ENTRY|auto", "recache=0|1"):
        assert name in helped, helped
    assert "op=" not in helped
    explain = doit(built, "help", "explain", PROFILE).output
    assert "op=OPERATOR" in explain and "dtype=DTYPE" in explain
    primitives = doit(built, "help", "primitives", PROFILE).output
    assert "budget=SECONDS" in primitives and "profile=" not in primitives
    assert all(n in cli_vars.SETTINGS for n in ("profile", "target", "recache", "op", "dtype", "budget"))


@pytest.mark.parametrize("arg, nearest", [("op=sofmax", "softmax"), ("dtype=float61", "float16")])
def test_explain_suggests_the_nearest_operator_or_dtype(built, arg, nearest):
    run = doit(built, "explain", arg, PROFILE)
    assert run.code != 0 and f"Did you mean {nearest}?" in run.output


# -- the kept graph ------------------------------------------------------------------------

def _no_full_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the instance was loaded in full")
    monkeypatch.setattr(graph, "load_instance", refuse)


def test_list_and_a_build_with_nothing_to_do_read_the_kept_graph(built, monkeypatch):
    doit(built, "list", PROFILE)
    _no_full_load(monkeypatch)
    listed = doit(built, "list", "--all", PROFILE)
    assert listed.code == 0 and "compile:" in listed.output
    run = doit(built, "build", PROFILE)
    assert run.code == 0 and "nothing to do" in run.output and "instance small -> " in run.output


def test_the_kept_graph_is_the_loaded_one(built, monkeypatch):
    monkeypatch.setenv("AICG_CACHE_DIR", str(built / "cache"))   # as doit_project runs doit
    layout = cli_layout.resolve(built)
    profile = built / "rulesets/profiles/small.toml"
    instance = graph.load_instance(layout, profile, built / "build")
    kept = cli_graph.load(layout, profile, None, False, lambda instance: [])
    assert kept.from_kept_graph
    assert [s.name for s in kept.steps] == [s.name for s in instance.steps]
    for light, full in zip(kept.steps, instance.steps):
        assert kept.env.reads_digest(light) == digest.of_value(full.reads)
        assert (light.upstream, light.targets, light.role, light.code) == (full.upstream, full.targets, full.role,
                                                                          full.code)


def test_an_edit_of_an_input_loads_the_graph_again(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p")
    assert doit(project, "list", PROFILE).code == 0
    profile = project / "rulesets/profiles/small.toml"
    profile.write_text(profile.read_text().replace("candidates_per_family = 2", "candidates_per_family = 1"))
    loads = []
    real = graph.load_instance
    monkeypatch.setattr(graph, "load_instance", lambda *a, **k: loads.append(1) or real(*a, **k))
    assert doit(project, "list", PROFILE).code == 0 and loads == [1]
    assert doit(project, "list", PROFILE).code == 0 and loads == [1]   # kept again


def test_a_file_read_again_only_where_its_stat_changed(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text("a = 1\n")
    os.utime(path, ns=(10**18, 10**18))
    first = cli_graph.Stamps()
    assert first.digest("rules.toml", path) == digest.of_bytes(b"a = 1\n")
    kept = cli_graph.Stamps(first.now, written_ns=10**18 + 3 * cli_graph.Stamps.RACY_NS)
    path.write_text("a = 2\n")          # the same size, another mtime
    assert kept.digest("rules.toml", path) == digest.of_bytes(b"a = 2\n")
    racy = cli_graph.Stamps({"rules.toml": [*first.now["rules.toml"][:3], "stale"]}, written_ns=10**18)
    os.utime(path, ns=(10**18, 10**18))
    assert racy.digest("rules.toml", path) == digest.of_bytes(b"a = 2\n")   # recorded too soon after: read


def test_a_damaged_kept_graph_is_a_miss(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p")
    assert doit(project, "list", PROFILE).code == 0
    (kept,) = (project / "cache" / cli_graph.GRAPHS).iterdir()
    kept.write_bytes(kept.read_bytes()[:-7] + b"damaged")
    loads = []
    real = graph.load_instance
    monkeypatch.setattr(graph, "load_instance", lambda *a, **k: loads.append(1) or real(*a, **k))
    assert doit(project, "list", PROFILE).code == 0 and loads == [1]


def test_a_step_of_the_kept_graph_runs_as_loaded(built, tmp_path):
    """A build from the kept graph that has steps to run gives the instance a full load gives."""
    before = instance_files(built)
    (built / "build/small/select/softmax.json").unlink()
    run = doit(built, "build", PROFILE)
    assert run.code == 0 and run.executed == ["select:softmax"], run.output
    assert instance_files(built) == before


def test_a_kept_graph_that_is_not_the_instance_runs_nothing_and_is_removed(tmp_path):
    project = make_project(tmp_path / "p")
    assert doit(project, "build", PROFILE).code == 0
    (kept,) = (project / "cache" / cli_graph.GRAPHS).iterdir()
    table = cli_graph._read(kept)
    row = next(r for r in table["steps"] if r["name"] == "select:softmax")
    row["reads"] = digest.of_value("another value")
    cli_graph._write(kept, table)
    (project / "build/small/select/softmax.json").unlink()
    run = doit(project, "build", PROFILE)
    assert run.code != 0 and "select:softmax reads other values than its kept graph said" in run.output
    assert not kept.exists() and not (project / "build/small/select/softmax.json").exists()
    assert doit(project, "build", PROFILE).code == 0 and (project / "build/small/select/softmax.json").exists()


def test_receipts_written_by_another_process_are_read_again(tmp_path):
    from aicg.store import LayeredStore
    from aicg import config
    store = LayeredStore(config.load(tmp_path))
    parent, worker = cli_graph.Env(tmp_path / "i", store), cli_graph.Env(tmp_path / "i", store)
    worker.write_receipt("compile:x", {"key": "old", "origin": "ran", "outputs": {}})
    assert parent.receipt("compile:x")["key"] == "old"
    worker.write_receipt("compile:x", {"key": "new", "origin": "ran", "outputs": {}})
    assert parent.receipt("compile:x")["key"] == "new"


# -- progress and parallel builds ----------------------------------------------------------------

def test_no_bar_where_the_output_is_not_a_terminal():
    out = io.StringIO()
    bar = cli_progress.Bar(3, "aicg", stream=out)
    assert not bar.drawn
    bar.advance()
    bar.write("a line")
    bar.close()
    assert out.getvalue() == "a line\n" and bar.done == 1


def test_a_bar_on_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setenv("TERM", "xterm")
    out = Terminal()
    bar = cli_progress.Bar(4, "aicg", stream=out)
    assert bar.drawn and "aicg: 0/4 tasks" in out.getvalue() and "elapsed" in out.getvalue()
    bar.write("a line")
    bar.close()
    assert "a line\n" in out.getvalue() and not bar.drawn


def test_a_parallel_build_is_the_serial_one(built, tmp_path):
    """Workers forked by doit -n publish receipts that the parent, checking the next steps, reads."""
    project = make_project(tmp_path / "p")
    run = doit(project, "-n", "2", "build", PROFILE)
    assert run.code == 0, run.output
    assert "1 tasks ran" not in run.output and " up to date, in " in run.output
    assert instance_files(project) == instance_files(built)
    counters = json.loads((project / "cache/last-build.json").read_text())["counters"]
    assert counters.get("misses", 0) >= 6, counters   # counted in the workers, summed here
    assert "nothing to do" in doit(project, "-n", "2", "build", PROFILE).output


def test_parallel_by_default_where_no_gpu_is_present(monkeypatch):
    from aicg import cli
    monkeypatch.setattr(cli_graph, "no_gpu_here", lambda: True)
    assert cli.processes() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(cli_graph, "no_gpu_here", lambda: False)
    assert cli.processes() == 1
    assert cli.DOIT_CONFIG["num_process"] >= 1 and cli.tasks()["DOIT_CONFIG"] is cli.DOIT_CONFIG


# -- where inputs come from ----------------------------------------------------------------

def test_a_directory_of_its_own_reads_the_shipped_inputs(tmp_path):
    layout = cli_layout.resolve(tmp_path)
    assert layout.rules == cli_layout.shipped("rulesets") and layout.kernels == cli_layout.shipped("kernels")
    assert layout.hwdb == cli_layout.shipped("hwdb") and layout.own_hwdb == tmp_path / "hwdb"
    shipped_profile = cli_layout.profile_path("rulesets/profiles/fast.toml", tmp_path)
    assert shipped_profile == cli_layout.shipped("rulesets") / "profiles/fast.toml"
    with pytest.raises(InputError, match="Did you mean rulesets/profiles/fast.toml"):
        cli_layout.profile_path("rulesets/profiles/fats.toml", tmp_path)


def test_a_users_hwdb_entries_over_the_shipped_ones(tmp_path):
    own = tmp_path / "hwdb"
    own.mkdir()
    (own / "my-gpu.toml").write_text("# mine\n")
    (own / "l4.toml").write_text("# my L4\n")
    layout = cli_layout.resolve(tmp_path)
    view = layout.hwdb
    assert view == tmp_path / cli_layout.VIEW
    assert (view / "my-gpu.toml").read_text() == "# mine\n" and (view / "l4.toml").read_text() == "# my L4\n"
    assert (view / "h100-sxm.toml").read_bytes() == (cli_layout.shipped("hwdb") / "h100-sxm.toml").read_bytes()
    (own / "l4.toml").unlink()
    (own / "my-gpu.toml").unlink()
    view = cli_layout.resolve(tmp_path).hwdb
    assert not (view / "my-gpu.toml").exists()
    assert (view / "l4.toml").read_bytes() == (cli_layout.shipped("hwdb") / "l4.toml").read_bytes()


def test_a_record_is_written_to_the_users_hwdb_starting_from_the_shipped_one(tmp_path):
    from aicg.tasks import record_task
    (tmp_path / "hwdb").mkdir()
    layout = cli_layout.resolve(tmp_path)
    path = record_task._own_record(layout, "h100-sxm")
    assert path == tmp_path / "hwdb/h100-sxm.validations.jsonl"
    assert path.read_bytes() == (cli_layout.shipped("hwdb") / "h100-sxm.validations.jsonl").read_bytes()


def test_a_project_of_its_own_reads_its_own_inputs(tmp_path):
    project = make_project(tmp_path / "p")
    layout = cli_layout.resolve(project)
    assert (layout.rules, layout.hwdb, layout.kernels) == (project / "rulesets", project / "hwdb", project / "kernels")
