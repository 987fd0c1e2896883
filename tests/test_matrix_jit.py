"""inst.tune()'s matrix part (aicg/matrix/jit.py) on a machine without a GPU: a shape outside the
workload planned from the instance's own snapshot, the realisations it lacks compiled and cached,
nothing chosen without a validation on the target, and (validation stood in for, as a GPU node's
would come back) the fastest valid kernel kept per shape, read back by a later process, and refused
where its record or cubin does not check out."""
from __future__ import annotations

import json
import shutil

import pytest

import aicg
from aicg.matrix import dispatch, jit, validation
from aicg.matrix.problem import Problem
from aicg.matrix.space import Epilogue
from aicg.matrix.templates import RULES
from test_matrix_graph import built, validated  # noqa: F401  (fixtures: the CPU build of matmul.toml, validated)

PLAIN = "matmul.bfloat16.kk.plain"
OFF = Problem(300, 4096, 4096)          # outside the profile's workload
POINTERS = {"a": 1 << 20, "b": 1 << 20, "c": 1 << 30}


def instance_copy(project, tmp_path):
    return shutil.copytree(project / "build/h100-matmul", tmp_path / "h100-matmul")


def kernels_of(root, key=None) -> dispatch.MatrixKernels:
    manifest = json.loads((root / "manifest.json").read_text())
    section = manifest["matrix"]
    packaged = {c: k for e in section["classes"].values() for c, k in e["kernels"].items()}
    return dispatch.MatrixKernels(root, section, allow_unvalidated=False,
                                  jit=jit.MatrixJit(root, packaged, manifest["target"]["name"], key))


def plain_class(kernels):
    return kernels.classes[("bfloat16", "k", "k", Epilogue())]


def test_a_shape_outside_the_workload_is_planned_from_the_instance_s_snapshot(validated, tmp_path):  # noqa: F811
    root = instance_copy(validated[0], tmp_path)
    assert sorted(p.name for p in (root / "source/kernels/matrix").glob("*.cuh")) == \
        sorted(p.name for p in (validated[0] / "kernels/matrix").glob("*.cuh"))
    assert (root / "source/hwdb/h100-sxm.matrix.json").is_file()     # the profile the plan was calibrated with
    ranked = kernels_of(root).jit.ranked(PLAIN, OFF)
    assert 1 <= len(ranked) <= jit.TUNED_CANDIDATES
    times = [c.predicted_seconds[0] for c in ranked]
    assert times == sorted(times)
    assert all(RULES[c.template].unsupported(c.real, OFF) is None for c in ranked)
    with pytest.raises(jit.MatrixJitError, match="no matrix class matmul.float16"):
        kernels_of(root).jit.ranked("matmul.float16.kk.plain", OFF)


def test_without_the_gpu_tune_compiles_what_the_instance_lacks_and_chooses_nothing(validated, tmp_path):  # noqa: F811
    root = instance_copy(validated[0], tmp_path)
    kernels = kernels_of(root)
    running = kernels.pick(plain_class(kernels), OFF, POINTERS)
    assert running.candidate in plain_class(kernels).usable and list(kernels.untuned) == [(PLAIN, 300, 4096, 4096)]
    assert kernels.jit._planned is None        # the call ran its packaged kernel without planning anything
    assert kernels.tune() == [(PLAIN, 300, 4096, 4096)] and not kernels.untuned
    ranked = kernels.jit.ranked(PLAIN, OFF)
    lacking = [c.id for c in ranked if c.id not in kernels.jit.packaged]
    compiled = [e["candidate"] for e in kernels.jit.events if e.get("compiled")]
    assert compiled == lacking
    (tuned,) = [e for e in kernels.jit.events if "tried" in e]
    assert set(tuned["tried"]) == {running.candidate, *(c.id for c in ranked)} and "chosen" not in tuned
    assert {t["status"] for t in tuned["tried"].values()} == {"unvalidated"}
    assert kernels.tuned[(PLAIN, 300, 4096, 4096)] is None
    kernels.pick(plain_class(kernels), OFF, POINTERS)
    assert kernels.tune() == []           # tried once in this process: not again until the next one
    again = kernels_of(root)
    again.pick(plain_class(again), OFF, POINTERS)
    again.tune()
    assert not any(e.get("compiled") for e in again.jit.events)     # the cubins come from the JIT's cache


def passing(times: dict):
    """validation.validate_on_device as a GPU node answers: passed, timed at the one shape asked."""
    def validate(real, cubin, report, hardware, shapes, repetitions):
        seconds = times.get(f"matmul.{real.name}", 1e-3)
        if seconds is None:
            return {"status": "failed", "reason": "wrong", "device": hardware.name, "checks": [], "timings": []}
        return {"status": "passed", "reason": None, "device": hardware.name, "checks": [{"passed": True}],
                "timings": [{"shape": list(shapes[0]), "median_seconds": seconds}]}
    return validate


def tuned_off_workload(root, monkeypatch, times):
    """The instance at `root` called at OFF and tuned, validation answering with `times` (candidate ->
    seconds, None: failed): (its kernels, the realisations the prior ranked there, the kernel that ran)."""
    kernels = kernels_of(root)
    ranked = kernels.jit.ranked(PLAIN, OFF)
    monkeypatch.setattr(validation, "validate_on_device", passing(times(ranked)))
    running = kernels.pick(plain_class(kernels), OFF, POINTERS)
    kernels.tune()
    return kernels, ranked, running


def test_with_the_gpu_tune_keeps_the_fastest_valid_kernel_for_later_processes(validated, tmp_path,  # noqa: F811
                                                                              monkeypatch):
    root = instance_copy(validated[0], tmp_path)
    planned = kernels_of(root).jit
    lacking = [c for c in planned.ranked(PLAIN, OFF) if c.id not in planned.packaged]
    assert len(lacking) >= 2, "the test needs two of the prior's picks that the instance does not carry"
    new, failing = lacking[0], lacking[1].id
    kernels, _, running = tuned_off_workload(root, monkeypatch, lambda _: {new.id: 1e-4, failing: None})
    chosen = kernels.tuned[(PLAIN, 300, 4096, 4096)]
    assert chosen.candidate == new.id and chosen.cubin
    assert kernels.pick(plain_class(kernels), OFF, POINTERS) == chosen and not kernels.untuned
    # a workload shape keeps the build's kernel
    workload = plain_class(kernels).entry["dispatch"][-1]
    assert kernels.pick(plain_class(kernels), Problem(workload["m"], workload["n"], workload["k"]), POINTERS).candidate \
        == workload["candidate"]
    # a later process reads the choice
    later = kernels_of(root)
    assert later.pick(plain_class(later), OFF, POINTERS).candidate == new.id
    # a failed one is kept as failed for this GPU and never chosen
    _, meta = kernels.jit.compiled(lacking[1].real)
    assert meta["validation"] == {kernels.jit.gpu: "failed"}
    # a JIT cubin that no longer matches its record is not run
    (cubin_path,) = [p for p in (root / "jit/matrix").glob("*.cubin")
                     if p.read_bytes() == chosen.cubin]
    cubin_path.write_bytes(chosen.cubin[:-1] + bytes([chosen.cubin[-1] ^ 1]))
    tampered = kernels_of(root)
    assert tampered.pick(plain_class(tampered), OFF, POINTERS).candidate == running.candidate


def test_with_a_signing_key_an_unsigned_choice_is_not_read(validated, tmp_path, monkeypatch):  # noqa: F811
    root = instance_copy(validated[0], tmp_path)
    kernels, ranked, running = tuned_off_workload(root, monkeypatch, lambda ranked: {ranked[-1].id: 1e-5})
    assert kernels.tuned[(PLAIN, 300, 4096, 4096)].candidate == ranked[-1].id
    signed = kernels_of(root, key=b"k" * 32)
    assert signed.pick(plain_class(signed), OFF, POINTERS).candidate == running.candidate


def test_the_instance_tunes_its_matrix_shapes_with_its_rows(validated, tmp_path, monkeypatch):  # noqa: F811
    root = instance_copy(validated[0], tmp_path)
    inst = aicg.load(root)
    assert inst.matrix.jit is not None and inst.tune() == []
    cls = plain_class(inst.matrix)
    inst.matrix.pick(cls, OFF, POINTERS)
    monkeypatch.setattr(validation, "validate_on_device", passing({}))
    assert inst.tune() == [("matmul", PLAIN, 300, 4096, 4096)]
    assert any("tried" in e for e in inst.jit_events)
    assert aicg.load(root, jit=False).matrix.jit is None


def test_a_choice_record_naming_files_outside_the_cache_or_another_kernel_is_not_run(validated, tmp_path,  # noqa: F811
                                                                                     monkeypatch):
    root = instance_copy(validated[0], tmp_path)
    kernels, _, running = tuned_off_workload(root, monkeypatch, lambda ranked: {ranked[-1].id: 1e-5})
    path = kernels.jit._choice_path(PLAIN, OFF, kernels.jit.gpu)
    record = json.loads(path.read_text())
    (tmp_path / "outside.cubin").write_bytes(b"x")
    for hostile in ({**record, "origin": "jit", "key": "../../../outside"},
                    {**record, "origin": "packaged", "candidate": "matmul.not.packaged"},
                    {**record, "origin": "jit", "candidate": running.candidate} if record["origin"] == "jit" else
                    {**record, "origin": "elsewhere"}):
        path.write_text(json.dumps(hostile))
        later = kernels_of(root)
        assert later.pick(plain_class(later), OFF, POINTERS).candidate == running.candidate, hostile
