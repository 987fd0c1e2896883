"""The validation record (aicg/record.py): a GPU's validations shipped in hwdb/, used by builds without one."""
from __future__ import annotations

import json
import shutil
import tomllib

import pytest

from aicg import cas, hw, record
from aicg.tasks import graph, step
from doit_project import REPO, SMALL_PROFILE, doit, make_project

PROFILE = "profile=rulesets/profiles/small.toml"
# The small profile's target, and the GPU its hwdb entry names: what the record is of.
TARGET = tomllib.loads(SMALL_PROFILE)["instance"]["target"]
GPU = hw.load_target(REPO / "hwdb", TARGET).name
RECORD = f"hwdb/{TARGET}.validations.jsonl"


def _validate_as_the_gpu_would(project):
    """Put a passing validation of every candidate in the local store, as a build on the GPU leaves it
    (the checks and timings are invented: the test is about where they go, not what they say)."""
    instance = graph.load_instance(graph.Layout(project), project / "rulesets/profiles/small.toml", project / "build")
    local = instance.env.store.local
    for n, s in enumerate(x for x in instance.steps if x.kind == "validate"):
        outcome = {"status": "passed", "device": instance.hardware.name,
                   "checks": [{"shape": [64, 1000], "trial": 0, "passed": True, "worst_error_over_bound": 0.01}],
                   "timings": [{"shape": [64, 1000], "median_seconds": (n + 1) * 1e-6}]}
        local.put_action(cas.ActionEntry(step.key(s, instance.env), "validate",
                                         {s.targets[0]: local.put_blob(graph.to_json(outcome))}))


@pytest.fixture
def recorded(tmp_path):
    """A project whose GPU build was recorded: (the project, its manifest's bytes)."""
    gpu = make_project(tmp_path / "gpu")
    assert doit(gpu, "build", PROFILE).code == 0
    _validate_as_the_gpu_would(gpu)
    shutil.rmtree(gpu / "build")
    run = doit(gpu, "record", PROFILE)
    assert run.code == 0, run.output
    assert f"recorded 6 validations of small on {GPU}" in run.output
    return gpu, (gpu / "build/small/manifest.json").read_bytes()


def _fresh_clone(tmp_path, gpu, name="clone"):
    clone = make_project(tmp_path / name)
    shutil.copy(gpu / RECORD, clone / RECORD)
    return clone


def test_a_machine_without_a_gpu_builds_the_gpus_instance_from_the_record(tmp_path, recorded):
    gpu, manifest = recorded
    lines = (gpu / RECORD).read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line)["gpu"] == GPU for line in lines)
    clone = _fresh_clone(tmp_path, gpu)
    run = doit(clone, "build", PROFILE)
    assert run.code == 0, run.output
    assert "6 validations from the record" in run.output and f"validated on {GPU}" in run.output
    assert "UNVALIDATED" not in run.output
    assert (clone / "build/small/manifest.json").read_bytes() == manifest



def test_a_record_pulled_in_after_a_cpu_build_validates_the_next_build(tmp_path, recorded):
    """A machine that built before the record came (git pull, a copied file) takes it on its next
    build: a validation it could not make is never held up to date against one that has arrived."""
    gpu, manifest = recorded
    clone = make_project(tmp_path / "clone")
    (clone / RECORD).unlink(missing_ok=True)
    before = doit(clone, "build", PROFILE)
    assert before.code == 0 and "UNVALIDATED" in before.output
    shutil.copy(gpu / RECORD, clone / RECORD)
    after = doit(clone, "build", PROFILE)
    assert after.code == 0, after.output
    assert "6 validations from the record" in after.output and "UNVALIDATED" not in after.output
    assert (clone / "build/small/manifest.json").read_bytes() == manifest
    assert doit(clone, "build", PROFILE).executed == []     # and then it is up to date

def test_a_kernel_edit_makes_its_kernels_unvalidated_and_says_which(tmp_path, recorded):
    gpu, _ = recorded
    clone = _fresh_clone(tmp_path, gpu)
    header = clone / "kernels/softmax.cuh"      # every softmax family's, and no row sum's
    header.write_text(header.read_text() + "\n// a comment changes no cubin\n")
    assert doit(clone, "build", PROFILE).code == 0
    assert json.loads((clone / "build/small/manifest.json").read_text())["kernels"]["softmax.float32"]["validation"] == "passed"
    header.write_text(header.read_text() + "\n__device__ int an_edit_that_changes_the_cubins = 1;\n")
    run = doit(clone, "build", PROFILE)
    assert run.code == 0, run.output
    manifest = json.loads((clone / "build/small/manifest.json").read_text())
    assert manifest["kernels"]["row_sum.float32"]["validation"] == "passed"
    assert manifest["kernels"]["softmax.float32"]["validation"] == "unvalidated"
    assert "1 of 2 kernels are UNVALIDATED (softmax.float32)" in run.output
    origins = json.loads((clone / "build/small/provenance.json").read_text())["origins"]
    assert {o for n, o in origins.items() if n.startswith("validate:row_sum")} == {"record"}


@pytest.mark.parametrize("damage", ["output", "key", "truncate", "junk"])
def test_a_damaged_line_is_a_miss(tmp_path, recorded, damage):
    gpu, _ = recorded
    clone = _fresh_clone(tmp_path, gpu)
    path = clone / RECORD
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    if damage == "output":
        verdict = next(iter(first["outputs"].values()))
        verdict["timings"][0]["median_seconds"] = 1e-9   # a faster time, claimed after the fact
    elif damage == "key":
        first["key"] = "0" * 32
    lines[0] = json.dumps(first) if damage in ("output", "key") else ("{\"instance\"" if damage == "truncate" else "\x00junk")
    path.write_text("\n".join(lines) + "\n")
    original_key = json.loads((gpu / RECORD).read_text().splitlines()[0])["key"]
    assert record.Record(path).lookup(original_key) is None
    run = doit(clone, "build", PROFILE)
    assert run.code == 0 and "5 validations from the record" in run.output, run.output


def test_with_a_key_only_signed_lines_count(tmp_path, recorded):
    gpu, _ = recorded
    key = tmp_path / "key"
    key.write_bytes(b"team secret")
    clone = _fresh_clone(tmp_path, gpu)
    run = doit(clone, "build", PROFILE, env={"AICG_SIGNING_KEY_FILE": str(key)})
    assert run.code == 0 and "from the record" not in run.output and "UNVALIDATED" in run.output
    # recorded with the key, the lines count under it
    shutil.rmtree(gpu / "build")
    assert doit(gpu, "record", PROFILE, env={"AICG_SIGNING_KEY_FILE": str(key)}).code == 0
    signed = _fresh_clone(tmp_path, gpu, "signed")
    run = doit(signed, "build", PROFILE, env={"AICG_SIGNING_KEY_FILE": str(key)})
    assert run.code == 0 and "6 validations from the record" in run.output, run.output


def test_recording_where_nothing_was_validated_fails_and_says_why(tmp_path):
    project = make_project(tmp_path / "cpu")
    run = doit(project, "record", PROFILE)
    assert run.code != 0 and "nothing to record for small" in run.output and "no GPU" in run.output
    assert not (project / RECORD).exists()


def test_a_build_cut_short_records_what_it_validated_and_builds_nothing_more(tmp_path):
    """`doit record_validated`: the validations a GPU made before its build stopped, the rest left out."""
    gpu = make_project(tmp_path / "gpu")
    assert doit(gpu, "build", PROFILE).code == 0
    _validate_as_the_gpu_would(gpu)
    shutil.rmtree(gpu / "build")
    instance = graph.load_instance(graph.Layout(gpu), gpu / "rulesets/profiles/small.toml", gpu / "build")
    first = next(s.name for s in instance.steps if s.kind == "validate")
    assert doit(gpu, first, PROFILE).code == 0
    run = doit(gpu, "record_validated", PROFILE)
    assert run.code == 0 and f"recorded 1 validations of small on {GPU}" in run.output, run.output
    assert "5 left out" in run.output and "not built" in run.output and run.compilations == 0
    assert [json.loads(line)["outputs"] for line in (gpu / RECORD).read_text().splitlines()] and \
        not (gpu / "build/small/manifest.json").exists()


def test_recording_again_replaces_the_instances_lines_and_keeps_others(tmp_path, recorded):
    gpu, _ = recorded
    path = gpu / RECORD
    other = json.loads(path.read_text().splitlines()[0])
    other["instance"] = "another"
    path.write_text(path.read_text() + json.dumps(other) + "\n")
    assert doit(gpu, "record", PROFILE).code == 0
    instances = [json.loads(line)["instance"] for line in path.read_text().splitlines()]
    assert instances.count("small") == 6 and instances.count("another") == 1
