"""The build's promises, each checked by counting what a rebuild runs."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aicg import build_lock, cas, digest
from aicg.config import StoreConfig
from aicg.store import LayeredStore
from aicg.runtime import driver
from aicg.tasks import graph, step
from doit_project import SMALL_PROFILE_COMPILATIONS, doit, instance_files, make_project

PROFILE = "profile=rulesets/profiles/small.toml"


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "proj")


@pytest.fixture
def built(project):
    run = doit(project, "build", PROFILE)
    assert run.code == 0, run.output
    return project


def test_first_build_runs_every_step_and_prints_the_summary(project):
    run = doit(project, "build", PROFILE)
    assert run.code == 0, run.output
    kinds = {name.split(":")[0] for name in run.executed}
    assert kinds == {"hw", "legality", "plan", "codegen", "compile", "validate", "select", "package"}
    compiled = [n for n in run.executed if n.startswith("compile:")]
    assert len(compiled) == SMALL_PROFILE_COMPILATIONS
    # one NVRTC run a candidate, and one more where its launch bound asked for more blocks (aicg/occupancy.py)
    reports = [json.loads(p.read_text())["resources"] for p in (project / "build/small/cubin").glob("*.json")]
    assert run.compilations == len(compiled) + sum(r["asked_blocks"] > 0 for r in reports)
    for column in ("legal families", "chosen", "params", "regs", "smem", "spills", "validation"):
        assert column in run.output
    if driver.probe_device() is None:
        assert "UNVALIDATED" in run.output   # no GPU here, and no validation in this fresh cache
    manifest = json.loads((project / "build/small/manifest.json").read_text())
    assert set(manifest["kernels"]) == {"softmax.float32", "row_sum.float32"}
    for entry in manifest["kernels"].values():
        cubin = (project / "build/small" / entry["cubin"]).read_bytes()
        assert digest.of_bytes(cubin) == entry["cubin_digest"] and entry["resources"]["registers"] > 0


def test_a_second_build_runs_nothing_and_says_so(built):
    run = doit(built, "build", PROFILE)
    assert run.code == 0 and run.executed == [] and run.compilations == 0
    assert re.search(r"aicg: nothing to do, all \d+ tasks are up to date, in \d+\.\d\d s\n", run.output), run.output


def test_touching_inputs_without_changing_them_runs_nothing(built):
    for path in [*built.glob("rulesets/**/*.toml"), *built.glob("hwdb/*.toml"), *built.glob("kernels/*.cuh")]:
        path.touch()
    assert doit(built, "build", PROFILE).executed == []


def test_a_softmax_only_rule_edit_reruns_only_softmax(built, edit):
    edit(built / "rulesets/rules.toml", 'needs = ["online_decomposable"]',
         'needs = ["online_decomposable", "shift_invariant"]')
    run = doit(built, "build", PROFILE)
    assert "legality:softmax" in run.executed
    assert all("softmax" in name or name == "package" for name in run.executed), run.executed
    assert run.compilations == 0


def test_a_header_edit_recompiles_only_the_candidates_that_include_it(built):
    header = built / "kernels/online_softmax.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    run = doit(built, "build", PROFILE)
    compiled = {n for n in run.executed if n.startswith("compile:")}
    assert compiled and all(n.startswith("compile:softmax_") for n in compiled)
    # a comment leaves the cubins as they were: nothing downstream of compile runs but
    # the package, which carries the headers for the instance's JIT
    assert set(run.executed) == compiled | {"package"}


def test_a_hw_fact_the_plan_does_not_read_changes_no_plan(built, edit):
    edit(built / "hwdb/nvidia-h200.toml", "value = 989.4e12", "value = 990e12")
    run = doit(built, "build", PROFILE)
    assert "hw:nvidia-h200" in run.executed
    assert not [n for n in run.executed if n.split(":")[0] in {"plan", "codegen", "compile", "select"}]


def test_deleting_build_restores_everything_from_the_cache_without_compiling(built):
    before = instance_files(built)
    shutil.rmtree(built / "build")
    run = doit(built, "build", PROFILE)
    assert run.code == 0 and run.compilations == 0
    assert "restored from cache" in run.output
    assert instance_files(built) == before   # same inputs, bit-identical instance


def compiled_files(project):
    return {n: d for n, d in instance_files(project).items() if n.startswith(("src/", "cubin/"))}


def test_a_corrupt_cache_entry_is_a_miss_and_is_rebuilt(built):
    before = compiled_files(built)   # (a re-validation on a GPU would time anew)
    cubin_digest = digest.of_bytes(next((built / "build/small/cubin").glob("*.cubin")).read_bytes())
    blob = built / "cache/objects" / cubin_digest[:2] / cubin_digest[2:]
    blob.write_bytes(blob.read_bytes()[:100])          # truncated
    for entry in (built / "cache/actions").rglob("*"):
        if entry.is_file() and entry.stat().st_size % 3 == 0:
            entry.write_bytes(b"\x00garbage")             # and some action entries destroyed
    shutil.rmtree(built / "build")
    run = doit(built, "build", PROFILE)
    assert run.code == 0 and run.compilations >= 1
    assert compiled_files(built) == before


def test_another_profile_builds_beside_the_first(built):
    run = doit(built, "build", "profile=rulesets/profiles/bitwise.toml")
    assert run.code == 0, run.output
    assert (built / "build/small/manifest.json").exists()
    manifest = json.loads((built / "build/h200-bitwise/manifest.json").read_text())
    assert set(manifest["kernels"]) == {"row_max.float32", "row_max.bfloat16", "row_sum.float32", "row_sum.bfloat16"}
    assert manifest["kernels"]["row_sum.float32"]["family"] == "row_sum_sequential"   # the only bitwise sum


def test_a_profile_asking_for_what_its_rules_forbid_fails_with_the_reason(built):
    bitwise_softmax = (built / "rulesets/profiles/bitwise.toml").read_text().replace(
        'ops = ["row_sum", "row_max"]', 'ops = ["softmax", "row_max"]')
    (built / "rulesets/profiles/bitwise_softmax.toml").write_text(bitwise_softmax)
    run = doit(built, "build", "profile=rulesets/profiles/bitwise_softmax.toml")
    assert run.code != 0
    assert "FAILED legality:softmax" in run.output and "bitwise_softmax.toml: workload" in run.output
    assert "function exp of softmax is correctly_rounded in real arithmetic only" in run.output
    assert "order = 'fixed'" in run.output and "preset 'deterministic'" in run.output
    assert not (built / "build/h200-bitwise/manifest.json").exists()


def test_list_info_and_clean_behave_as_doit_users_expect(built):
    listing = doit(built, "list", PROFILE)
    for kind in ("build", "hw", "legality", "plan", "codegen", "compile", "validate", "select", "package"):
        assert any(line.startswith(kind + " ") and len(line.split()) > 1 for line in listing.output.splitlines()), kind
    info = doit(built, "info", PROFILE, "plan:softmax")
    assert info.code == 0 and "legality:softmax" in info.output
    assert doit(built, "clean", PROFILE).code in (0, None)   # doit's clean returns no status
    assert not (built / "build/small/manifest.json").exists()
    assert not list((built / "build/small").rglob("*.cubin"))
    run = doit(built, "build", PROFILE)
    assert run.compilations == 0 and (built / "build/small/manifest.json").exists()


def test_a_validation_done_on_the_target_is_reused_without_a_gpu(built):
    """A GPU node's result in the shared store is taken as is, keyed by cubin and GPU."""
    instance = graph.load_instance(graph.Layout(built), built / "rulesets/profiles/small.toml", built / "build")
    validate = next(s for s in instance.steps if s.name.startswith("validate:softmax_online"))
    key = step.key(validate, instance.env)
    record = {"status": "passed", "device": instance.hardware.name, "checks": [{"trial": 0, "passed": True}],
              "timings": [{"shape": [64, 1000], "median_seconds": 1e-6}]}
    out = validate.targets[0]
    local = instance.env.store.local
    local.put_action(cas.ActionEntry(key, "validate", {out: local.put_blob(graph.to_json(record))}))
    shutil.rmtree(built / "build")
    run = doit(built, "build", PROFILE)
    manifest = json.loads((built / "build/small/manifest.json").read_text())
    assert manifest["kernels"]["softmax.float32"]["validation"] == "passed"
    assert manifest["kernels"]["softmax.float32"]["candidate"] == validate.name.split(":", 1)[1]
    assert run.compilations == 0


@pytest.mark.parametrize("bad, message", [
    ("[instance]\nname = 'x'\ntarget = 'nvidia-h200'\npreservation = 'tolerance'\n[[workload]]\nops = ['softmaks']\n"
     "dtypes = ['float32']\nshapes = [[1, 2]]\n", "small.toml: workload[0].ops: expected one of"),
    ("[instance\n", "small.toml: (syntax): expected valid TOML"),
    ("[instance]\nname = 'x'\ntarget = 'h900'\npreservation = 'tolerance'\n", "small.toml: instance.target: expected a hwdb entry"),
    ("[instance]\nname = 'x'\ntarget = 'nvidia-h200'\npreservation = 'tolerance'\ncolour = 1\n", "small.toml: instance.colour: expected a known key"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, bad, message):
    project = make_project(tmp_path / "proj", bad)
    run = doit(project, "build", PROFILE)
    assert run.code != 0 and message in run.output, run.output
    assert "Traceback" not in run.output
    assert not (project / "build").exists() and not (project / "cache").exists()


def test_a_kernel_that_fails_to_compile_names_the_header_and_line_and_caches_nothing(project):
    header = project / "kernels/welford.cuh"
    header.write_text(header.read_text().replace("struct Welford { float n, mean, m2; };", "struct Welford { float n mean; };"))
    profile = (project / "rulesets/profiles/small.toml").read_text().replace('["softmax", "row_sum"]', '["layernorm"]')
    (project / "rulesets/profiles/small.toml").write_text(profile)
    run = doit(project, "build", PROFILE)
    assert run.code != 0
    assert "kernels/welford.cuh(" in run.output and "error" in run.output
    store = cas.Store(project / "cache")
    steps_cached = {store.get_action(e.parent.name + e.name).step for e in (project / "cache/actions").rglob("*") if e.is_file()}
    assert "compile" not in steps_cached    # failures are never cached
    assert not (project / "build/small/manifest.json").exists()


def test_an_input_changed_while_a_step_runs_is_not_published(tmp_path):
    env = step.Env(tmp_path / "inst", LayeredStore(StoreConfig(tmp_path / "cache", None, False, 1.0, None, False)))
    upstream = step.Step("codegen:a", "", {"v": 1}, lambda ctx: step.Result({"src/a.cu": b"one"}), ("codegen.py",),
                         targets=("src/a.cu",))
    step.execute(upstream, env)

    def run(ctx):
        (env.instance_dir / "src/a.cu").write_bytes(b"two")   # someone edits the input meanwhile
        return step.Result({"out/a": ctx.upstream("codegen:a", "src/a.cu")})

    down = step.Step("compile:a", "", {}, run, ("nvrtc.py",), upstream=("codegen:a",), targets=("out/a",))
    with pytest.raises(Exception, match="changed while"):
        step.execute(down, env)
    assert env.receipt("compile:a") is None and not (env.instance_dir / "out/a").exists()
    cached = [env.store.local.get_action(p.parent.name + p.name).step
              for p in (tmp_path / "cache/actions").rglob("*") if p.is_file()]
    assert cached == ["codegen"]


def test_selecting_a_rule_the_preservation_level_forbids_fails_with_the_reason(built):
    profile = (built / "rulesets/profiles/small.toml").read_text().replace(
        "[plan]", '[rules]\nselect = ["tree_reduction", "fast_intrinsics", "libdevice_math", "online_softmax"]\n\n[plan]')
    (built / "rulesets/profiles/small.toml").write_text(profile)
    run = doit(built, "build", PROFILE)
    assert run.code != 0
    assert "small.toml: rules.select" in run.output and "fast_intrinsics needs math in ('approximate')" in run.output


def test_a_candidate_that_spills_goes_to_validation_like_any_other(built):
    """A spill is a cost for the timing to measure, not a verdict: the compiler's report
    of one does not keep a candidate from the device (here: no GPU, so unvalidated)."""
    from aicg.tasks import graph as graph_module
    from aicg.tasks.step import Context
    instance = graph_module.load_instance(graph_module.Layout(built), built / "rulesets/profiles/small.toml", built / "build")
    validate = next(s for s in instance.steps if s.name.startswith("validate:"))
    cand = validate.name.split(":", 1)[1]
    report_path = built / f"build/small/cubin/{cand}.json"
    report = json.loads(report_path.read_text())
    report["resources"]["spill_store_bytes"] = 64
    receipt = instance.env.receipt(f"compile:{cand}")
    report_bytes = (json.dumps(report, indent=1, sort_keys=True) + "\n").encode()
    report_path.write_bytes(report_bytes)
    receipt["outputs"][f"cubin/{cand}.json"] = digest.of_bytes(report_bytes)
    result = validate.run(Context(validate, instance.env))
    outcome = json.loads(next(iter(result.outputs.values())))
    assert outcome["status"] == "unvalidated" and not result.cache

def test_the_summary_says_when_the_prior_measured_other_kernels_than_these(built):
    """The realisation profile records the headers it measured; a header edited since is named."""
    from aicg.primitives import lab
    from aicg.semantics import ruleset
    profile_path = built / "hwdb/nvidia-h200.realisation.json"
    data = json.loads(profile_path.read_text())
    data["provenance"].pop("kernels", None)         # as a profile measured before the record was kept
    profile_path.write_text(json.dumps(data))
    assert "does not record which kernels it measured" in doit(built, "build", PROFILE).output
    data["provenance"]["kernels"] = lab.kernel_digests(ruleset.load(built / "rulesets"), built / "kernels")
    profile_path.write_text(json.dumps(data))
    run = doit(built, "build", PROFILE)
    assert run.code == 0 and "The plan's prior" not in run.output
    header = built / "kernels/welford.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    run = doit(built, "build", PROFILE)
    assert "measured kernels that have changed since: welford.cuh;" in run.output
    manifest = json.loads((built / "build/small/manifest.json").read_text())
    assert manifest["prior"]["kernels_changed"] == ["welford.cuh"]


def test_the_summary_shows_a_missing_ptxas_report_as_unknown():
    from aicg.tasks import summary
    kernel = {"op": "softmax", "dtype": "float32", "legal_families": ["softmax_online"], "considered": 4,
              "family": "softmax_online", "params": {"threads": 128, "vec_bytes": 16, "topology": "warp"},
              "validation": "passed", "measured_seconds": 1e-5,
              "resources": {"reported": False, "registers": 0, "shared_bytes": 0, "stack_bytes": 0,
                            "spill_store_bytes": 0, "spill_load_bytes": 0, "barriers": 0}}
    row = summary.rows({"kernels": {"softmax.float32": kernel}, "unavailable": {}})[0]
    assert row[5] == "?" and row[7] == "?"
    kernel["resources"].update(reported=True, registers=40)
    assert summary.rows({"kernels": {"softmax.float32": kernel}, "unavailable": {}})[0][5] == "40"


def test_a_second_build_of_the_same_instance_waits_for_the_first(built):
    """While one process holds the instance's build lock, a build of it in the same directory says
    so and waits; once the lock is free it goes on and finds nothing to do."""
    path = build_lock.path_for(built / "build", "small")
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AICG_")}, "AICG_CACHE_DIR": str(built / "cache")}
    with open(path, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.truncate(0)
        held.write("4242")
        held.flush()
        waiting = subprocess.Popen([sys.executable, "-m", "doit", "build", PROFILE], cwd=built, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(3)
        assert waiting.poll() is None          # still waiting for the lock
    out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, out
    assert "another build of small is running in this directory (process 4242); waiting" in out
    assert "nothing to do" in out and path.read_text() == ""   # released, empty of any process


def test_a_process_forked_during_a_build_does_not_keep_its_lock(tmp_path):
    """doit's -n workers are forked while the build holds its lock; one orphaned by a killed build
    must not hold the next build back."""
    build_lock.hold(tmp_path, "small", lambda text: None)
    ready, started = os.pipe()
    child = os.fork()
    if child == 0:   # a worker that outlives the build (the fork's hooks have run when it writes)
        os.write(started, b"1")
        time.sleep(5)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"1"
        build_lock.release()
        with open(build_lock.path_for(tmp_path, "small"), "a+") as other:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)   # free at once, the child still alive
        assert os.waitpid(child, os.WNOHANG) == (0, 0)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
        os.close(ready)
        os.close(started)


def test_a_worker_forked_from_a_killed_build_ends_with_it(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    # The worker says it is running (its fork handlers done) before the build dies, so the death
    # signal is what must end it; its output goes nowhere, so that if it lingers it holds no pipe.
    script = ("import os, sys, time\nimport aicg.build_lock\nready, say = os.pipe()\nchild = os.fork()\n"
              "if child == 0:\n    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
              "    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n    os.write(say, b'r')\n"
              "    time.sleep(60)\n    os._exit(0)\n"
              "os.read(ready, 1)\nprint(child, flush=True)\nos._exit(0)\n")
    # Started with SIGTERM ignored, as a build run under nohup or some CI runners is: the
    # disposition is inherited, so the worker must be ended by a signal it cannot ignore.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                          preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    child = int(done.stdout.split()[0])
    for _ in range(50):
        if not _running(child):
            return
        time.sleep(0.1)
    os.kill(child, 9)
    raise AssertionError(f"the forked worker {child} outlived its build by 5 s")


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not yet reaped by whoever adopted it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
