"""The JIT path for shapes an instance was not tuned for: planning from the
instance's own snapshot, NVRTC, and its cache. No GPU needed: validation is
a function handed in (the runtime passes the device check)."""
from __future__ import annotations

import dataclasses
import logging
import types

import pytest

from aicg import nvrtc, plan, planning
from aicg.runtime import jit as jit_mod
from aicg.runtime.instance import Instance

from doit_project import REPO, doit, make_project, profile_text

NEW_SHAPE = (1 << 20, 8)     # far from the workload's 64x1000: short rows, many of them
# the workload's rows, more of them: the prior's best there is not carried, the carried kernel runs it
CARRIED_SHAPE = (4096, 1000)


@pytest.fixture(scope="module")
def instance_dir(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("jit"), profile_text(ops=("softmax",), per_family=1))
    assert doit(project, "build", "profile=rulesets/profiles/small.toml").code == 0
    return project / "build" / "small"


def fresh_jit(instance_dir, tmp_path) -> jit_mod.Jit:
    """A JIT over a copy of the instance (its own cache), as a new process would see it."""
    import shutil
    copy = tmp_path / "instance"
    if not copy.exists():
        shutil.copytree(instance_dir, copy)
    return Instance(copy, allow_unvalidated=True).jit


def test_an_instance_carries_the_planning_inputs_it_was_built_from(instance_dir):
    source = instance_dir / "source"
    assert (source / "profile.toml").read_text() == (instance_dir.parents[1] / "rulesets/profiles/small.toml").read_text()
    for name in ("atlas.toml", "preservation.toml", "rules.toml", "families.toml"):
        assert (source / "rulesets" / name).read_bytes() == (REPO / "rulesets" / name).read_bytes()
    assert (source / "hwdb/nvidia-h200.toml").read_bytes() == (REPO / "hwdb/nvidia-h200.toml").read_bytes()
    assert (source / "hwdb/nvidia-h200.realisation.json").is_file()
    assert {p.name for p in (source / "kernels").glob("*.cuh")} == {p.name for p in (REPO / "kernels").glob("*.cuh")}


def test_a_new_shape_is_planned_compiled_once_and_then_read_from_the_cache(instance_dir, tmp_path, caplog):
    jit = fresh_jit(instance_dir, tmp_path)
    planned = jit.planning().best_for_shape("softmax", "float32", (jit_mod.rows_class(NEW_SHAPE[0]), NEW_SHAPE[1]))
    assert planned[0].id not in jit.packaged, "the test needs a shape whose predicted best is not packaged"
    before = nvrtc.compilations
    with caplog.at_level(logging.INFO, logger="aicg.jit"):
        made = jit.kernel_for("softmax", "float32", *NEW_SHAPE)
    assert made.origin == "compiled" and made.candidate == planned[0].id and made.validation == "unvalidated"
    assert nvrtc.compilations == before + 1
    compiled = [e for e in jit.events if e.get("compiled")]
    assert compiled and compiled[0]["candidate"] == made.candidate and compiled[0]["seconds"] > 0
    assert f"compiled {made.candidate}" in caplog.text

    again = jit.kernel_for("softmax", "float32", NEW_SHAPE[0] + 1000, NEW_SHAPE[1])   # same row class
    assert (again.origin, again.cubin) == ("jit cache", made.cubin) and nvrtc.compilations == before + 1

    later = fresh_jit(instance_dir, tmp_path)       # another process, the same instance folder
    assert later.kernel_for("softmax", "float32", *NEW_SHAPE).origin == "jit cache"
    assert nvrtc.compilations == before + 1 and later.events == []


def test_the_jit_compiles_what_the_build_compiles(instance_dir, tmp_path):
    """The same candidate gives the same source and so the same cubin, byte for byte."""
    jit = fresh_jit(instance_dir, tmp_path)
    made = jit.kernel_for("softmax", "float32", *NEW_SHAPE)
    planned = jit.planning()
    family = planned.rules.families[made.candidate.split(".")[0]]
    from aicg import codegen, occupancy
    source = codegen.source(made.candidate, family, "float32", made.params)
    cubin, _, _ = occupancy.compile_candidate(source, f"src/{made.candidate}.cu",
                                              nvrtc.include_closure(family.header, REPO / "kernels"), "sm_90",
                                              made.params, planned.hardware.fact("registers_per_sm"))
    assert cubin == made.cubin


def test_a_damaged_cache_entry_is_compiled_again(instance_dir, tmp_path, caplog):
    jit = fresh_jit(instance_dir, tmp_path)
    made = jit.kernel_for("softmax", "float32", *NEW_SHAPE)
    [cubin_path] = [p for p in jit.cache_dir.glob("*.cubin")
                    if p.read_bytes() == made.cubin]
    cubin_path.write_bytes(made.cubin[:-7] + b"garbage")
    before = nvrtc.compilations
    with caplog.at_level(logging.WARNING, logger="aicg.jit"):
        again = fresh_jit(instance_dir, tmp_path).kernel_for("softmax", "float32", *NEW_SHAPE)
    assert again.origin == "compiled" and again.cubin == made.cubin and nvrtc.compilations == before + 1
    assert "does not match its digest" in caplog.text
    assert cubin_path.read_bytes() == made.cubin


def test_validation_runs_once_per_gpu_and_a_failed_kernel_is_passed_over(instance_dir, tmp_path):
    jit = fresh_jit(instance_dir, tmp_path)
    calls = []

    def failing_first(cubin, params, shape):
        calls.append(shape)
        return {"status": "failed" if len(calls) == 1 else "passed", "reason": ""}

    made = jit.kernel_for("softmax", "float32", *NEW_SHAPE, validate=failing_first)
    ranked = jit.planning().best_for_shape("softmax", "float32", (jit_mod.rows_class(NEW_SHAPE[0]), NEW_SHAPE[1]))
    assert made.candidate != ranked[0].id and made.validation == "passed"
    assert calls[0] == jit_mod.validation_shape(ranked[0].params, *NEW_SHAPE)
    n = len(calls)
    later = fresh_jit(instance_dir, tmp_path).kernel_for("softmax", "float32", *NEW_SHAPE, validate=failing_first)
    assert later.candidate == made.candidate and len(calls) == n    # outcomes recorded per GPU, not re-run


def test_without_a_snapshot_the_jit_says_what_to_do(tmp_path):
    empty = jit_mod.Jit(tmp_path, {})
    assert not empty.available()
    with pytest.raises(jit_mod.JitError, match="no planning snapshot; rebuild the instance"):
        empty.kernel_for("softmax", "float32", 10, 10)


def test_an_unvalidated_outcome_is_not_kept(instance_dir, tmp_path):
    """On a machine without the target GPU the validation says "unvalidated"; the target must still check it."""
    calls = []

    def elsewhere(cubin, params, shape):
        calls.append(shape)
        return {"status": "unvalidated", "reason": "no GPU on this machine"}

    made = fresh_jit(instance_dir, tmp_path).kernel_for("softmax", "float32", *NEW_SHAPE, validate=elsewhere)
    assert made.validation == "unvalidated"
    fresh_jit(instance_dir, tmp_path).kernel_for("softmax", "float32", *NEW_SHAPE, validate=elsewhere)
    assert len(calls) == 2


def passing(cubin, params, shape):
    return {"status": "passed", "reason": ""}


def test_the_device_decides_among_the_first_usable_candidates_and_the_choice_is_kept(instance_dir, tmp_path):
    """The prior ranks; timing at the shape picks. Here the third-ranked is made the fastest."""
    timed_calls = []

    def third_fastest(kernels, shape):   # the last timed is the fastest
        timed_calls.append((len(kernels), shape))
        return [(len(kernels) - i) * 1e-6 for i in range(len(kernels))]

    jit = fresh_jit(instance_dir, tmp_path)
    ranked = jit_mod.timing_order(
        jit.planning().best_for_shape("softmax", "float32", (jit_mod.rows_class(NEW_SHAPE[0]), NEW_SHAPE[1])))
    timed = jit_mod.TIMED_CANDIDATES + jit_mod.unmeasured_besides(ranked)
    assert len(ranked) >= timed
    made = jit.kernel_for("softmax", "float32", *NEW_SHAPE, validate=passing, timer=third_fastest)
    assert timed_calls == [(timed, NEW_SHAPE)]
    assert made.candidate == ranked[timed - 1].id
    [event] = [e for e in jit.events if "timed" in e]
    assert event["chosen"] == made.candidate and len(event["timed"]) == timed

    huge = (1 << 22, 1 << 12)                       # 2^34 elements: timed on a slice of the rows it may hold
    fresh_jit(instance_dir, tmp_path / "huge").kernel_for("softmax", "float32", *huge, validate=passing,
                                                          timer=third_fastest)
    assert timed_calls[-1][1] == (jit_mod.TIMED_ELEMENTS >> 12, 1 << 12)
    del timed_calls[-1]

    later = fresh_jit(instance_dir, tmp_path)      # another process: the kept choice, no timing
    again = later.kernel_for("softmax", "float32", *NEW_SHAPE, validate=passing, timer=third_fastest)
    assert again.candidate == made.candidate and len(timed_calls) == 1


def test_a_spill_the_lab_measured_is_run_and_one_the_model_alone_ranks_is_passed_over(instance_dir, tmp_path,
                                                                                     monkeypatch):
    """The lab timed the cubin the JIT compiles, so a measured candidate's prediction holds its spill's
    cost; a spilling candidate ranked by the model alone could run untimed, and is passed over."""
    compile_cubin = nvrtc.compile_cubin

    def spilling(*args, **kwargs):
        cubin, resources, log = compile_cubin(*args, **kwargs)
        return cubin, {**resources, "reported": True, "spill_store_bytes": 8, "spill_load_bytes": 8}, log
    monkeypatch.setattr(jit_mod.nvrtc, "compile_cubin", spilling)
    shape_class = (jit_mod.rows_class(NEW_SHAPE[0]), NEW_SHAPE[1])

    jit = fresh_jit(instance_dir, tmp_path / "measured")
    ranked = jit.planning().best_for_shape("softmax", "float32", shape_class)
    assert not ranked[0].modelled and ranked[0].id not in jit.packaged
    made = jit.kernel_for("softmax", "float32", *NEW_SHAPE, validate=passing)
    assert made.candidate == ranked[0].id and made.origin == "compiled"
    assert [e["spilled"] for e in jit.events if e.get("compiled")] == [True]

    modelled = [dataclasses.replace(c, prior=plan.DATASHEET) for c in ranked]
    monkeypatch.setattr(planning.Planning, "best_for_shape", lambda self, *args: modelled)
    jit = fresh_jit(instance_dir, tmp_path / "modelled")
    with pytest.raises(jit_mod.JitError, match="every legal candidate was rejected"):
        jit.kernel_for("softmax", "float32", *NEW_SHAPE, validate=passing)


def test_without_the_target_gpu_the_prior_order_stands(instance_dir, tmp_path):
    jit = fresh_jit(instance_dir, tmp_path)
    ranked = jit.planning().best_for_shape("softmax", "float32", (jit_mod.rows_class(NEW_SHAPE[0]), NEW_SHAPE[1]))
    made = jit.kernel_for("softmax", "float32", *NEW_SHAPE, validate=passing, timer=lambda kernels, shape: None)
    assert made.candidate == ranked[0].id and not [e for e in jit.events if "timed" in e]
    assert not list(jit.cache_dir.glob("choice-*.json"))


def test_a_candidate_the_lab_has_not_measured_is_timed_besides_the_measured_ones_not_instead():
    def cand(name, prior):
        return types.SimpleNamespace(id=name, prior=prior, modelled=prior == plan.DATASHEET)
    lab, model = "realisation profile x.json", plan.DATASHEET
    ranked = [cand("u1", model), cand("m1", lab), cand("u2", model), cand("m2", lab), cand("m3", lab), cand("m4", lab)]
    assert [c.id for c in jit_mod.timing_order(ranked)] == ["m1", "m2", "m3", "u1", "u2", "m4"]
    assert jit_mod.unmeasured_besides(ranked)
    alone = [cand("u1", model), cand("u2", model)]   # the datasheet prior ranks everything: its order stands
    assert jit_mod.timing_order(alone) == alone and not jit_mod.unmeasured_besides(alone)


def test_the_device_check_of_a_jit_kernel_keeps_to_the_rows_its_order_keeps_the_bound_on(instance_dir, tmp_path,
                                                                                         monkeypatch):
    """A thread per row planned for rows of 8 is checked on the awkward shapes cut to its longest row
    (float32 softmax: 660), not on rows of 4097 it will never serve."""
    from aicg import validate
    from aicg.semantics import accuracy
    instance = Instance(instance_dir, allow_unvalidated=True)
    seen = {}

    def record(cubin, hardware, op, dtype, params, **settings):
        seen.update(settings)
        return {"status": "passed"}

    monkeypatch.setattr(validate, "validate_on_device", record)
    thread = next(c for c in instance.jit.planning().best_for_shape("softmax", "float32", (1 << 20, 8), per_family=50)
                  if c.params["topology"] == "thread")
    assert thread.longest_row == accuracy.longest_row(instance.jit.planning().rules, "softmax", "float32",
                                                      thread.params, 1e-5) == 660
    instance.softmax._validator("float32")(b"", thread.params, (256, 8))
    assert max(s[1] for s in seen["check_shapes"]) == 660 and (256, 8) in seen["check_shapes"]
    block = dict(thread.params, topology="block", threads=1024)
    instance.softmax._validator("float32")(b"", block, (256, 8))
    assert (9, 4097) in seen["check_shapes"]


def test_a_new_shape_is_validated_on_its_whole_rows_and_as_many_rows_as_a_full_and_a_ragged_block_need():
    block = {"topology": "block", "threads": 1024}
    assert jit_mod.validation_shape(block, 512, 50257) == (jit_mod.VALIDATION_ELEMENTS // 50257, 50257)
    assert jit_mod.validation_shape(block, 3, 50257) == (3, 50257)             # never more rows than asked
    assert jit_mod.validation_shape(block, 1 << 20, 8) == (jit_mod.VALIDATION_ROWS, 8)
    assert jit_mod.validation_shape(block, 512, 1 << 22) == (2, 1 << 22)       # a full block and a ragged one
    warps = {"topology": "warp", "threads": 512}                              # 16 rows a block
    assert jit_mod.validation_shape(warps, 512, 1 << 22) == (17, 1 << 22)
    rows8 = {"topology": "thread_rows8", "threads": 128}                      # 1024 rows a block
    assert jit_mod.validation_shape(rows8, 4096, 3) == (1025, 3)
    for params in (block, warps, {"topology": "cluster4", "threads": 256}, {"topology": "block_prefetch", "threads": 256}):
        rows, _ = jit_mod.validation_shape(params, 4096, 12288)
        assert rows * 12288 <= jit_mod.VALIDATION_ELEMENTS


def test_the_validator_is_readied_before_a_compile_and_not_for_a_cached_kernel(instance_dir, tmp_path):
    readied = []

    def passing(cubin, params, shape):
        return {"status": "passed", "reason": ""}
    passing.prepare = lambda: readied.append(len(readied))
    made = fresh_jit(instance_dir, tmp_path).kernel_for("softmax", "float32", *NEW_SHAPE, validate=passing)
    assert made.origin == "compiled" and readied == [0]
    again = fresh_jit(instance_dir, tmp_path).kernel_for("softmax", "float32", *NEW_SHAPE, validate=passing)
    assert again.origin == "jit cache" and readied == [0]


def test_the_validation_worker_is_started_ahead_once_and_only_where_a_gpu_is(monkeypatch):
    from aicg.runtime import instance as instance_mod
    from aicg.validate import isolated
    calls = []
    monkeypatch.setattr(instance_mod, "_worker_started", [])
    monkeypatch.setattr(isolated.worker, "call", lambda target, *a, **k: calls.append(target))
    monkeypatch.setattr(instance_mod.driver, "probe_device", lambda ordinal=0: None)
    instance_mod._start_validation_worker()
    assert instance_mod._worker_started == [] and calls == []
    monkeypatch.setattr(instance_mod.driver, "probe_device", lambda ordinal=0: types.SimpleNamespace(name="gpu"))
    instance_mod._start_validation_worker()
    instance_mod._start_validation_worker()
    instance_mod._worker_started[0].join(5)
    assert calls == ["aicg.validate:local_device_state"]


def test_a_first_call_runs_a_carried_kernel_while_the_predicted_fastest_compiles(instance_dir, tmp_path):
    """Asked to answer at once, the JIT answers with the first carried kernel where the predicted
    fastest must be compiled, compiles that one on a thread, and once it has finished answers with
    it (validated first, as any kernel it compiled)."""
    jit = fresh_jit(instance_dir, tmp_path)
    shape = (jit_mod.rows_class(CARRIED_SHAPE[0]), CARRIED_SHAPE[1])
    ranked = jit.planning().best_for_shape("softmax", "float32", shape)
    carried = [c for c in ranked if c.id in jit.packaged]
    assert ranked[0].id not in jit.packaged and carried, "the test needs a compiled best and a carried runner-up"
    validated = []

    def validate(cubin, params, at):
        validated.append(params)
        return {"status": "passed", "reason": ""}

    before = nvrtc.compilations
    first = jit.kernel_for("softmax", "float32", *CARRIED_SHAPE, validate=validate, background=True)
    assert (first.candidate, first.origin, first.validation) == (carried[0].id, "packaged", "passed")
    assert first.pending is not None and first.timed is False and validated == []
    event = next(e for e in jit.events if "compiling" in e)
    assert (event["answered_with"], event["compiling"]) == (carried[0].id, ranked[0].id)
    # asked again while it compiles: the same answer, and no second compilation of it
    first.pending.join(timeout=300)
    assert not first.pending.is_alive() and nvrtc.compilations > before
    compiled = nvrtc.compilations
    then = jit.kernel_for("softmax", "float32", *CARRIED_SHAPE, validate=validate, background=True)
    assert (then.candidate, then.origin, then.validation) == (ranked[0].id, "jit cache", "passed")
    assert then.pending is None and len(validated) == 1 and nvrtc.compilations == compiled


def test_nothing_runs_in_the_background_where_the_best_is_carried_or_cached_or_no_carried_kernel_runs(
        instance_dir, tmp_path):
    jit = fresh_jit(instance_dir, tmp_path)
    shape = (jit_mod.rows_class(CARRIED_SHAPE[0]), CARRIED_SHAPE[1])
    ranked = jit.planning().best_for_shape("softmax", "float32", shape)
    planned = jit.planning()
    # nothing carried among the candidates: the caller compiles, as without `background`
    assert jit._answer_while_compiling([c for c in ranked if c.id not in jit.packaged], planned,
                                       "softmax", "float32", *CARRIED_SHAPE) is None
    made = jit.kernel_for("softmax", "float32", *CARRIED_SHAPE)               # compiled in the caller
    assert made.candidate == ranked[0].id and made.pending is None
    # compiled before: no thread, the cached kernel answers
    cached = jit.kernel_for("softmax", "float32", *CARRIED_SHAPE, background=True)
    assert (cached.candidate, cached.origin, cached.pending) == (ranked[0].id, "jit cache", None)
    assert not any("compiling" in e for e in jit.events)


def test_where_the_prior_ranks_no_carried_kernel_the_nearest_tuned_shapes_answers_while_the_best_compiles(
        instance_dir, tmp_path):
    """A first call whose ranked candidates are none of them carried is answered by the kernel the
    instance carries for its nearest tuned shape (given by the caller, which checked its bound), the
    predicted fastest compiling on a thread; without one, the caller compiles as before."""
    jit = fresh_jit(instance_dir, tmp_path)
    planned = jit.planning()
    shape = (jit_mod.rows_class(CARRIED_SHAPE[0]), CARRIED_SHAPE[1])
    ranked = [c for c in planned.best_for_shape("softmax", "float32", shape) if c.id not in jit.packaged]
    nearest = next(v for v in jit.packaged.values() if v["candidate"].startswith("softmax") and
                   ".float32." in v["candidate"])
    before = nvrtc.compilations
    made = jit._answer_while_compiling(ranked, planned, "softmax", "float32", *CARRIED_SHAPE, nearest)
    assert (made.candidate, made.origin, made.validation, made.timed) == (nearest["candidate"], "packaged",
                                                                          "passed", False)
    event = next(e for e in jit.events if "compiling" in e)
    assert (event["answered_with"], event["compiling"]) == (nearest["candidate"], ranked[0].id)
    made.pending.join(timeout=300)
    assert not made.pending.is_alive() and nvrtc.compilations > before
    # compiled since: nothing to answer for, the caller's path takes the cached kernel
    assert jit._answer_while_compiling(ranked, planned, "softmax", "float32", *CARRIED_SHAPE, nearest) is None
