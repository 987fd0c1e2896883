"""The realisation profile and the measured prior, on the recorded H200 profile (no GPU needed)."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from aicg import codegen, hw, plan, plan_inputs, profile
from aicg.errors import InputError
from aicg.primitives import lab, realisation
from doit_project import REPO, SMALL_PROFILE, doit, make_project, profile_text

# The GPU the recorded profile was measured on, as its hwdb entry names it
RECORDED_GPU = hw.load_target(REPO / "hwdb", "nvidia-h200").name


@pytest.fixture(scope="module")
def h200(repo, shipped_ruleset):
    target = hw.load_target(repo / "hwdb", "nvidia-h200")
    inputs = plan_inputs.values(plan_inputs.resolve(target))
    recorded = realisation.load(realisation.path_for(repo / "hwdb", "nvidia-h200"))
    assert recorded is not None, "the recorded H200 realisation profile is committed"
    return target, inputs, recorded, realisation.MeasuredPrior(recorded, inputs)


def test_the_recorded_profile_covers_every_runnable_realisation_of_its_families(h200, shipped_ruleset):
    _, inputs, recorded, _ = h200
    ids = {r["id"] for r in recorded.records}
    measured = {r["family"] for r in recorded.records}
    # a family the lab has not measured yet is ranked by its twin's measurements (families.toml timed_like)
    unmeasured = set(shipped_ruleset.families) - measured
    assert all(shipped_ruleset.families[f].timed_like in measured for f in unmeasured), unmeasured
    assert measured <= set(shipped_ruleset.families)
    assert {c.id for c in lab.configurations(shipped_ruleset, inputs) if c.family in measured} == ids
    assert recorded.provenance["device"] == RECORDED_GPU and recorded.provenance["date"]
    lengths: dict[str, set[int]] = {}
    for r in recorded.records:
        lengths.setdefault(r["id"], set()).add(r["cols"])
    assert lengths == {c.id: set(lab.row_lengths(c)) for c in lab.configurations(shipped_ruleset, inputs)
                       if c.family in measured}
    # what the next run needs to keep the realisations whose cubins are unchanged
    assert lab.same_method(recorded.provenance["lab"], lab.method(RECORDED_GPU, recorded.provenance["driver"]))
    assert set(recorded.provenance["cubins"]) == set(recorded.provenance["measured_on"]) == ids


def test_the_measured_prior_reproduces_what_it_measured(h200, shipped_ruleset):
    _, _, recorded, prior = h200
    seconds = {(r["id"], r["rows"], r["cols"]): r["seconds"] for r in recorded.records}
    most_few = max(lab.FEW_ROWS)
    for r in recorded.records[::97]:
        family = shipped_ruleset.families[r["family"]]
        expected = r["seconds"]
        if r["params"]["topology"] == "flat":   # no rows: the geometric mean of its launches of as many elements
            same = [q["seconds"] for q in recorded.records
                    if q["id"] == r["id"] and q["rows"] * q["cols"] == r["rows"] * r["cols"]]
            expected = math.exp(sum(map(math.log, same)) / len(same))
        elif r["rows"] > most_few:   # more rows are never predicted faster than the lab's most few rows
            expected = max(expected, seconds[(r["id"], most_few, r["cols"])])
        assert prior(family, r["dtype"], r["params"], (r["rows"], r["cols"])) == pytest.approx(expected, rel=1e-9)
    assert any(r["params"]["topology"] == "flat" for r in recorded.records[::97])


def test_between_measured_row_lengths_the_prediction_lies_between_the_calibrations(h200, shipped_ruleset):
    _, inputs, recorded, prior = h200
    family = shipped_ruleset.families["softmax_online"]
    p = next(r["params"] for r in recorded.records if r["family"] == "softmax_online" and r["dtype"] == "float32")
    shape = (8192, 1000)
    model = plan.predict_seconds(family, "float32", p, shape, inputs)
    ratios = [prior(family, "float32", p, (8192, c)) / plan.predict_seconds(family, "float32", p, (8192, c), inputs)
              for c in (512, 4096)]
    assert min(ratios) <= prior(family, "float32", p, shape) / model <= max(ratios)


def test_a_realisation_never_measured_is_ranked_by_the_model_calibrated_by_its_measured_kin(h200, shipped_ruleset):
    """Its own model, times the mean measured/modelled ratio of the measured realisations of its
    family, dtype size and topology nearest to it (realisation.KIN) at each launch they ran."""
    _, inputs, recorded, prior = h200
    family = shipped_ruleset.families["softmax_online"]
    p = {"threads": 64, "vec_bytes": 16, "topology": "warp", "fast_exp": False, "cache_packs": 0}  # not in the lab
    assert prior(family, "float32", p, (100, 100)) is None
    times, source = plan._predict(family, "float32", p, [(100, 100)], inputs, prior)
    assert source.startswith("datasheet model calibrated by its measured kin (the same topology, held or not, "
                             "access width and exp) in realisation profile nvidia-h200.realisation.json")
    assert times == (prior.borrowed(family, "float32", p, (100, 100)),)
    # at a launch the kin ran, exactly that: the kin here are every other thread count of the same kind
    launch = (lab.ROW_ELEMENTS // 4096, 4096)
    kin = [r for r in recorded.records if r["family"] == "softmax_online" and r["dtype"] == "float32"
           and (r["rows"], r["cols"]) == launch and {k: v for k, v in r["params"].items() if k != "threads"}
           == {k: v for k, v in p.items() if k != "threads"}]
    assert len(kin) == 4
    ratios = [math.log(r["seconds"] / plan.model_terms(family, "float32", r["params"], launch, inputs)[0]) for r in kin]
    expected = plan.model_terms(family, "float32", p, launch, inputs)[0] * math.exp(sum(ratios) / len(ratios))
    assert prior.borrowed(family, "float32", p, launch) == pytest.approx(expected, rel=1e-9)
    # with no measured kin of its topology, the model alone (another topology's calibration is not borrowed)
    alone = _prior_without(recorded, inputs, lambda r: r["family"] == "softmax_online" and r["params"]["topology"] == "warp")
    times, source = plan._predict(family, "float32", p, [(100, 100)], inputs, alone)
    assert source == "datasheet model" and times == (plan.predict_seconds(family, "float32", p, (100, 100), inputs),)


def test_a_realisation_measured_at_some_row_lengths_carries_them_over_as_its_kin_change(h200, shipped_ruleset):
    """A budget that ran out left a realisation measured at 512 and 4096 columns: at 32768 it is
    predicted by its own ratio at 4096 plus its kin's change in ratio from 4096 to 32768."""
    _, inputs, recorded, full = h200
    r = next(r for r in recorded.records if r["id"] == "softmax_twopass.bfloat16.t512.v16.block.c8")
    family, p = shipped_ruleset.families["softmax_twopass"], r["params"]
    prior = _prior_without(recorded, inputs, lambda q: q["id"] == r["id"] and q["cols"] in (64, 32768))
    assert prior.measured_as(family, "bfloat16", p) == ("softmax_twopass", "bfloat16")

    def ratio(q) -> float:
        return math.log(q["seconds"] / plan.model_terms(family, "bfloat16", q["params"], (q["rows"], q["cols"]), inputs)[0])

    def kin_mean(rows, cols) -> float:   # its nearest kin: the other thread counts holding c8 with 16-byte packs
        kin = [q for q in recorded.records if q["family"] == "softmax_twopass" and q["dtype"] == "bfloat16"
               and q["id"] != r["id"] and (q["rows"], q["cols"]) == (rows, cols) and q["params"]["topology"] == "block"
               and q["params"]["cache_packs"] > 0 and q["params"]["vec_bytes"] == 16 and not q["params"]["fast_exp"]]
        return sum(map(ratio, kin)) / len(kin)
    at_4096 = (lab.ROW_ELEMENTS // 4096, 4096)
    at_32768 = (lab.ROW_ELEMENTS // 32768, 32768)
    own = ratio(next(q for q in recorded.records if q["id"] == r["id"] and (q["rows"], q["cols"]) == at_4096))
    expected = (plan.model_terms(family, "bfloat16", p, at_32768, inputs)[0]
                * math.exp(own + kin_mean(*at_32768) - kin_mean(*at_4096)))
    assert prior(family, "bfloat16", p, at_32768) == pytest.approx(expected, rel=1e-9)
    # where it was measured, as measured; what it measured everywhere is unchanged by its kin
    assert prior(family, "bfloat16", p, at_4096) == pytest.approx(full(family, "bfloat16", p, at_4096), rel=1e-9)
    assert prior.drift(r["id"], 32768) == prior.drift(r["id"], 4096)   # drift is never carried over


def test_float16_is_timed_as_bfloat16_but_never_borrows_its_drift(h200, shipped_ruleset):
    """The lab measures float32 and bfloat16; a float16 realisation moves the bytes of a bfloat16 one."""
    _, inputs, recorded, prior = h200
    r = next(r for r in recorded.records if r["dtype"] == "bfloat16" and r["family"] == "rmsnorm_tree")
    family = shipped_ruleset.families["rmsnorm_tree"]
    shape = (4096, 1000)
    assert prior.measured_as(family, "float16", r["params"]) == ("rmsnorm_tree", "bfloat16")
    assert prior(family, "float16", r["params"], shape) == prior(family, "bfloat16", r["params"], shape)
    times, source = plan._predict(family, "float16", r["params"], [shape], inputs, prior)
    assert source.endswith("(float16 timed as bfloat16: the same element size)")
    assert prior.drift(plan.candidate_id(family.name, "float16", r["params"]), 4096) is None
    assert prior.measured_as(family, "bfloat16", r["params"]) == ("rmsnorm_tree", "bfloat16")


def _prior_without(recorded, inputs, unmeasured) -> realisation.MeasuredPrior:
    """The prior of the recorded profile less the records `unmeasured` picks: a lab run that
    predates a family or a realisation."""
    kept = tuple(r for r in recorded.records if not unmeasured(r))
    assert len(kept) < len(recorded.records)
    return realisation.MeasuredPrior(dataclasses.replace(recorded, records=kept), inputs)


def test_a_family_the_lab_has_not_measured_is_timed_like_its_declared_twin(h200, shipped_ruleset):
    _, inputs, recorded, _ = h200
    family = shipped_ruleset.families["log_softmax_twopass"]
    twin = shipped_ruleset.families[family.timed_like]
    assert twin.name == "softmax_twopass"
    prior = _prior_without(recorded, inputs, lambda r: r["family"] == family.name)
    r = next(r for r in recorded.records if r["family"] == twin.name and r["dtype"] == "float32")
    shape = (132, 4096)
    assert prior.measured_as(family, "float32", r["params"]) == (twin.name, "float32")
    assert prior(family, "float32", r["params"], shape) == prior(twin, "float32", r["params"], shape)
    times, source = plan._predict(family, "float32", r["params"], [shape], inputs, prior)
    assert source.endswith(f"(timed as {r['id']}: log_softmax_twopass is declared timed like it)")
    assert prior.drift(plan.candidate_id(family.name, "float32", r["params"]), 4096) is None
    # without the declaration, the datasheet model
    alone = dataclasses.replace(family, timed_like=None)
    assert prior(alone, "float32", r["params"], shape) is None


def test_a_flat_walk_is_predicted_by_its_element_count_not_its_row_length(h200, shipped_ruleset):
    """4194304 rows of one element are the lab's 128 rows of 32768 to a flat walk: the same
    elements in the same packs. Ranked by row length instead, 4-byte packs came ahead of 16-byte
    ones there (H200 bfloat16: 17.6 against 13.4 us)."""
    _, _, recorded, prior = h200
    family = shipped_ruleset.families["bias_gelu_residual_map"]
    timed = {r["id"]: r for r in recorded.records if r["params"]["topology"] == "flat" and r["dtype"] == "bfloat16"
             and (r["rows"], r["cols"]) == (128, 32768)}
    assert len(timed) >= 2
    predicted = {i: prior(family, "bfloat16", r["params"], (4194304, 1)) for i, r in timed.items()}
    assert all(math.isclose(predicted[i], r["seconds"]) for i, r in timed.items())
    narrow, wide = (next(i for i in timed if f".t128.v{v}.flat" in i) for v in (4, 16))
    assert predicted[wide] < predicted[narrow]
    # between the lab's counts, in between; beyond its largest, per element
    r = timed[wide]
    assert prior(family, "bfloat16", r["params"], (1, 1000)) < predicted[wide] < prior(family, "bfloat16", r["params"], (4096, 4096))
    largest = max((q for q in recorded.records if q["id"] == wide), key=lambda q: q["rows"] * q["cols"])
    twice = prior(family, "bfloat16", r["params"], (largest["rows"] * 2, largest["cols"]))
    assert math.isclose(twice, 2 * prior(family, "bfloat16", r["params"], (largest["rows"], largest["cols"])))


def test_on_recorded_h200_timings_the_measured_prior_ranks_better_than_the_datasheet(repo, bench_module, capsys):
    """tests/data/h200-accuracy.json: every legal candidate of the default workload timed on an H200,
    with the realisation profile of the same kernels (tests/data/h200-accuracy-realisation.json)."""
    found = bench_module("plan_accuracy").report(repo / "tests/data/h200-accuracy.json", repo / "tests/data/h200-accuracy-realisation.json")
    measured, datasheet = found["measured"], found["datasheet"]
    assert measured["benchmarked_share"] <= 0.25
    assert measured["within_5pct"] >= 0.9 and measured["worst_slowdown"] <= 1.15
    assert measured["median_rank_correlation"] > datasheet["median_rank_correlation"]


@pytest.mark.parametrize("per_family", [1, 2, 4])
def test_the_pruning_setting_bounds_what_is_benchmarked(repo, shipped_ruleset, h200, per_family):
    _, inputs, recorded, prior = h200
    measured = {r["family"] for r in recorded.records}
    prof = profile.load(repo / "rulesets/profiles/h200.toml", shipped_ruleset, repo / "hwdb")
    every = plan.plan_workload(shipped_ruleset, prof, inputs, per_family=10**6, measured=prior)
    some = plan.plan_workload(shipped_ruleset, prof, inputs, per_family=per_family, measured=prior)
    for op in prof.workload:
        for datasheet in (False, True):   # measured realisations, and those the lab has not measured
            limit = min(per_family, plan.UNMEASURED_PER_FAMILY) if datasheet else per_family
            planned = [c for c in every[op][1] if (c.prior == plan.DATASHEET) == datasheet]
            groups = {(c.family, c.dtype) for c in planned}
            assert sum(1 for c in some[op][1] if (c.prior == plan.DATASHEET) == datasheet) == sum(
                min(limit, sum(1 for c in planned if (c.family, c.dtype) == g)) for g in groups)
        for c in some[op][1]:   # a family the lab has not measured yet is ranked by its twin's measurements
            if c.prior == plan.DATASHEET:   # a staged row, or a topology its twin does not have
                assert c.params["topology"] in codegen.STAGED or c.family not in measured
                continue
            twin = shipped_ruleset.families[c.family].timed_like
            assert c.prior.startswith("realisation profile nvidia-h200.realisation.json")
            assert ("declared timed like" in c.prior) == (c.family not in measured)
            assert twin is not None or c.family in measured


def _least_drift(records, family: str, cols: int) -> float:
    return min(r["drift"] for r in records if r["family"] == family and r["dtype"] == "float32" and r["cols"] == cols)


def test_a_rule_whose_measured_drift_exceeds_the_bound_is_rejected_with_the_measurement(tmp_path):
    # No static bound forbids the online rescaling. On the H200 its least drift at 32768 columns
    # is the two-pass softmax's (both at the output's rounding), so the profile here is that one
    # with the online realisations drifting three times as far, as on a GPU where they do: a
    # bound between the two rejects the online rule and keeps the tree. So tight a bound is
    # beyond every order's rounding bound at these rows (semantics/accuracy.py); the atlas here
    # states the sum exact, which takes that bound out of the way.
    project = make_project(tmp_path / "proj", SMALL_PROFILE)
    atlas = project / "rulesets/atlas.toml"
    atlas.write_text(atlas.read_text().replace('identity = "0"\nproperties.associative = { holds = "real"',
                                               'identity = "0"\nproperties.associative = { holds = "exact"', 1))
    profile_path = project / "hwdb/nvidia-h200.realisation.json"
    data = json.loads(profile_path.read_text())
    for r in data["records"]:
        if r["family"] == "softmax_online":
            r["drift"] *= 3
    profile_path.write_text(json.dumps(data))
    online, twopass = (_least_drift(data["records"], f, 32768) for f in ("softmax_online", "softmax_twopass"))
    bound = (online + twopass) / 2
    (project / "rulesets/profiles/small.toml").write_text(profile_text(
        ops=("softmax",), shapes=((1024, 32768),), per_family=1,
        extra=f"[preservation]\ntolerance.float32 = {{ rtol = {bound!r}, atol = 1e-7 }}\n"))
    run = doit(project, "explain", "profile=rulesets/profiles/small.toml", "op=softmax")
    assert run.code == 0, run.output
    line = next(line for line in run.output.splitlines() if "rejected by measured drift: online_softmax" in line)
    assert f"rtol {bound:g}" in line and f"realisation profile nvidia-h200.realisation.json ({RECORDED_GPU}, " in line
    drift = float(line.split("the least, ")[1].split(" at")[0])
    assert drift == pytest.approx(online, rel=5e-3)  # printed to 3 digits
    assert not any("rejected by measured drift: tree_reduction" in line for line in run.output.splitlines())


def test_the_datasheet_prior_setting_ignores_the_profile(repo, shipped_ruleset, tmp_path):
    text = (repo / "rulesets/profiles/h200.toml").read_text().replace(
        "candidates_per_family = 4", 'candidates_per_family = 4\nprior = "datasheet"')
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert profile.load(path, shipped_ruleset, repo / "hwdb").prior == "datasheet"
    project = make_project(tmp_path / "proj", text.replace('name = "h200-tolerance"', 'name = "small"'))
    run = doit(project, "list", "--all", "plan", "profile=rulesets/profiles/small.toml")
    assert run.code == 0


def test_a_malformed_profile_is_a_clear_error(repo, tmp_path, raises_input_error):
    path = tmp_path / "x.realisation.json"
    data = json.loads((realisation.path_for(repo / "hwdb", "nvidia-h200")).read_text())
    data["records"][3]["seconds"] = "fast"
    path.write_text(json.dumps(data))
    with raises_input_error(path, "records[3].seconds", "float"):
        realisation.load(path)
    del data["provenance"]["driver"]
    path.write_text(json.dumps(data))
    with raises_input_error(path, "provenance.driver", "a value"):
        realisation.load(path)
    path.write_text("{")
    with pytest.raises(InputError, match="valid JSON"):
        realisation.load(path)


def test_the_lab_measures_on_every_runnable_realisation_and_names_them_as_the_plan_does(h200, shipped_ruleset):
    _, inputs, _, _ = h200
    configs = lab.configurations(shipped_ruleset, inputs)
    fams = {c.family for c in configs}
    assert fams == set(shipped_ruleset.families)
    c = next(c for c in configs if c.params["fast_exp"])
    assert c.id == plan.candidate_id(c.family, c.dtype, c.params) and ".fastexp" in c.id
    assert math.isclose(len(configs), len({c.id for c in configs}))
    assert dataclasses.asdict(c)["op"] == shipped_ruleset.families[c.family].op


def _profile_with_few_rows(tmp_path, family_name, dtype, p, full_seconds, few_seconds, few_rows=lab.FEW_ROWS,
                           lengths=lab.COLS):
    """A profile of one realisation: full launches at each of `lengths`, and few-row launches."""
    cid = plan.candidate_id(family_name, dtype, p)
    records = []
    for cols in lengths:
        full = lab.ROW_ELEMENTS // cols
        for rows, seconds in ((full, full_seconds(full, cols)), *((n, few_seconds(n, cols)) for n in few_rows)):
            records.append({"id": cid, "family": family_name, "dtype": dtype, "params": p, "rows": rows,
                            "cols": cols, "seconds": seconds, "bytes": 8 * rows * cols, "drift": 0.0,
                            "bit_stable": True})
    path = tmp_path / f"{len(few_rows)}-{len(lengths)}.realisation.json"
    realisation.save(path, {"date": "d", "driver": "v", "clocks": "c", "method": "m", "repetitions": 5,
                            "device": RECORDED_GPU, "arch": "sm_90"}, records)
    return realisation.load(path)


def test_launches_of_few_rows_are_predicted_from_the_few_row_measurements(h200, shipped_ruleset, tmp_path):
    """A realisation that is slow at the lab's full launches but fast on one row (a row split over a
    cluster, say) must not have its one-row time predicted from the full launches' calibration."""
    _, inputs, _, _ = h200
    family = shipped_ruleset.families["row_sum_tree"]
    p = {"threads": 1024, "vec_bytes": 16, "topology": "block", "fast_exp": False, "cache_packs": 0}
    slow = lambda rows, cols: 3 * plan.predict_seconds(family, "float32", p, (rows, cols), inputs)  # noqa: E731
    few = {1: 4e-6, 128: 8e-6}
    recorded = _profile_with_few_rows(tmp_path, "row_sum_tree", "float32", p, slow, lambda n, cols: few[n])
    prior = realisation.MeasuredPrior(recorded, inputs)
    for r in recorded.records:                       # what it measured, it reproduces
        assert prior(family, "float32", p, (r["rows"], r["cols"])) == pytest.approx(r["seconds"], rel=1e-9)
    assert few[1] < prior(family, "float32", p, (16, 4096)) < few[128]        # between the row counts measured
    assert prior(family, "float32", p, (256, 4096)) >= few[128]               # more rows never take less time
    assert prior(family, "float32", p, (1, 65536)) > few[1]                   # a longer row takes longer
    without = realisation.MeasuredPrior(
        _profile_with_few_rows(tmp_path, "row_sum_tree", "float32", p, slow, None, few_rows=()), inputs)
    assert prior(family, "float32", p, (1, 32768)) == pytest.approx(few[1], rel=1e-9)
    assert without(family, "float32", p, (1, 32768)) > 2 * few[1]     # the full launches' calibration alone
    assert without(family, "float32", p, (8192, 4096)) == prior(family, "float32", p, (8192, 4096))


def test_a_thread_serving_tiny_rows_is_predicted_from_tiny_rows_alone(h200, shipped_ruleset, tmp_path):
    """Rows of at most TINY_ROW elements take another code path when a thread serves eight of
    them: their measurements predict tiny rows, and the longer rows' predict the rest."""
    _, inputs, _, _ = h200
    family = shipped_ruleset.families["rmsnorm_tree"]
    p = {"threads": 128, "vec_bytes": 16, "topology": "thread_rows8", "fast_exp": False, "cache_packs": 0}
    c = lab.Config("rmsnorm", "rmsnorm_tree", "bfloat16", p)
    assert lab.row_lengths(c) == (*lab.TINY_COLS, *lab.COLS)
    model = lambda rows, cols: plan.predict_seconds(family, "bfloat16", p, (rows, cols), inputs)  # noqa: E731
    tiny_cost = lambda rows, cols: (5 if cols <= 4 else 1) * model(rows, cols)   # noqa: E731
    both = realisation.MeasuredPrior(_profile_with_few_rows(
        tmp_path, "rmsnorm_tree", "bfloat16", p, tiny_cost, tiny_cost, lengths=lab.row_lengths(c)), inputs)
    long_only = realisation.MeasuredPrior(_profile_with_few_rows(
        tmp_path, "rmsnorm_tree", "bfloat16", p, tiny_cost, tiny_cost), inputs)
    for shape in ((4194304, 1), (1048576, 3), (2097152, 2)):
        assert both(family, "bfloat16", p, shape) == pytest.approx(5 * model(*shape), rel=1e-6)
        assert long_only(family, "bfloat16", p, shape) == pytest.approx(model(*shape), rel=1e-6)
    for shape in ((1048576, 5), (8192, 1000), (4096, 32768)):   # the longer rows' path: unchanged
        assert both(family, "bfloat16", p, shape) == long_only(family, "bfloat16", p, shape)
    # a thread per row has no tiny path: its one-element rows calibrate the rows around them
    thread = dict(p, topology="thread")
    assert lab.row_lengths(lab.Config("rmsnorm", "rmsnorm_tree", "bfloat16", thread)) == (*lab.TINY_COLS, *lab.COLS)
    assert lab.row_lengths(lab.Config("rmsnorm", "rmsnorm_tree", "bfloat16", dict(p, topology="warp"))) == lab.COLS


def test_a_run_that_adds_row_lengths_keeps_the_records_of_the_others(tmp_path):
    method = lab.method(RECORDED_GPU, "580.159.04")
    earlier = {**method, "cols": list(lab.COLS)}      # a profile from before the row lengths left the method
    assert lab.same_method(earlier, method) and not lab.same_method({**earlier, "driver": "581.0"}, method)
    assert not lab.same_method(None, method)
    partial = tmp_path / "nvidia-h200.realisation.partial.json"
    kept = lab.Measured({"a": "digest of a"}, [{"id": "a", "cols": 1, "rows": 1, "seconds": 1e-6, "drift": 0.0}], {"a": "2026-12-02"})
    lab.checkpoint(partial, earlier, kept)
    assert lab.resume(partial, method) == kept
    # an interrupted run measured a's tiny rows; the profile, its long ones: both kept, each once
    profile = lab.Measured({"a": "digest of a"}, [{"id": "a", "cols": n, "rows": 1, "seconds": 2e-6, "drift": 0.0}
                                                  for n in (1, 64, 512)], {"a": "2026-11-30"})
    found = lab.reusable({"a": "digest of a"}, [kept, profile])
    assert sorted((r["cols"], r["seconds"]) for r in found.records) == [(1, 1e-6), (64, 2e-6), (512, 2e-6)]
    assert found.measured_on == {"a": "2026-12-02"}


def test_an_interrupted_lab_run_resumes_only_under_the_same_method(tmp_path):
    method = lab.method(RECORDED_GPU, "580.159.04")
    partial = tmp_path / "nvidia-h200.realisation.partial.json"
    assert lab.resume(partial, method) == lab.NOTHING            # nothing kept yet
    kept = lab.Measured({"a": "digest of a"}, [{"id": "a", "cols": 64, "rows": 1, "seconds": 1e-6}],
                        {"a": "2026-12-01"})
    lab.checkpoint(partial, method, kept)
    assert lab.resume(partial, method) == kept
    assert lab.resume(partial, {**method, "driver": "581.0"}) == lab.NOTHING
    assert lab.resume(partial, {**method, "repetitions": 7}) == lab.NOTHING
    partial.write_text("{ not json")
    assert lab.resume(partial, method) == lab.NOTHING


def test_only_realisations_whose_cubin_changed_are_measured_again():
    def measured(*ids, digest="old", date="2026-11-30"):
        return lab.Measured({i: f"{digest} {i}" for i in ids},
                            [{"id": i, "cols": c, "seconds": 1.0, "drift": 1e-6} for i in ids for c in (64, 512)],
                            {i: date for i in ids})
    profile = measured("a", "b", "c")
    interrupted = measured("c", "d", digest="new", date="2026-12-02")
    now = {"a": "old a", "b": "new b", "c": "new c", "d": "new d", "e": "new e"}
    kept = lab.reusable(now, [interrupted, profile])
    assert kept.cubins == {"a": "old a", "c": "new c", "d": "new d"}     # b changed, e never measured
    assert kept.measured_on == {"a": "2026-11-30", "c": "2026-12-02", "d": "2026-12-02"}
    assert sorted((r["id"], r["cols"]) for r in kept.records) == [(i, c) for i in "acd" for c in (64, 512)]
    assert lab.reusable(now, []) == lab.NOTHING


def test_a_record_of_infinite_drift_is_measured_again_at_its_row_length():
    records = [{"id": "a", "cols": c, "seconds": 1.0, "drift": d} for c, d in ((64, 1e-6), (32768, math.inf))]
    kept = lab.reusable({"a": "old a"}, [lab.Measured({"a": "old a"}, records, {"a": "2026-12-03"})])
    assert kept.cubins == {"a": "old a"} and [(r["cols"], r["drift"]) for r in kept.records] == [(64, 1e-6)]


def test_an_element_equal_to_its_reference_has_no_drift_even_at_zero_scale():
    # rmsnorm's scale is |ref|: an exact zero in the draw made 0 / 0 and an infinite drift
    ref = np.array([[0.0, 2.0, -4.0]])
    assert lab.largest_error(ref + [[0.0, 0.02, 0.0]], ref, np.abs(ref)) == pytest.approx(0.01)
    assert lab.largest_error(ref + [[1e-30, 0.0, 0.0]], ref, np.abs(ref)) == math.inf     # off a zero of no scale
    assert lab.largest_error(ref + [[0.0, np.nan, 0.0]], ref, np.abs(ref)) == math.inf    # an element left poisoned

def test_realisations_the_lab_has_not_measured_are_built_besides_the_measured_ones(shipped_ruleset, h200, repo):
    """Realisations added since the lab last ran (here: staged rows) are predicted by the model
    (here alone: no kin of their topology is measured), which is not comparable with the lab's
    calibrated predictions: they must not push a measured candidate out, and are built besides
    them only where they are predicted to lead some workload shape of their family and dtype."""
    _, inputs, recorded, _ = h200
    prior = _prior_without(recorded, inputs, lambda r: r["params"]["topology"] in codegen.STAGED)
    prof = profile.load(repo / "rulesets/profiles/h200.toml", shipped_ruleset, repo / "hwdb")
    unstaged = dataclasses.replace(shipped_ruleset, families={
        name: dataclasses.replace(f, params={**f.params, "topology": tuple(t for t in f.params["topology"]
                                                                            if t not in codegen.STAGED)})
        for name, f in shipped_ruleset.families.items()})
    with_staged = plan.plan_workload(shipped_ruleset, prof, inputs, measured=prior)
    without = plan.plan_workload(unstaged, prof, inputs, measured=prior)
    every = plan.plan_workload(shipped_ruleset, prof, inputs, per_family=10**6, measured=prior)
    for op in prof.workload:
        assert ([c.id for c in with_staged[op][1] if not c.modelled]
                == [c.id for c in without[op][1] if not c.modelled])
        for family, dtype in {(c.family, c.dtype) for c in every[op][1]}:
            group = [c for c in every[op][1] if (c.family, c.dtype) == (family, dtype)]
            best = [min(c.predicted_seconds[i] for c in group if not c.modelled) for i in range(len(prof.workload[op].shapes))]
            leading = {c.id for c in group if c.modelled and any(t < b for t, b in zip(c.predicted_seconds, best))}
            built = {c.id for c in with_staged[op][1] if c.modelled and (c.family, c.dtype) == (family, dtype)}
            assert built <= leading and len(built) == min(len(leading), plan.UNMEASURED_PER_FAMILY)
    staged = [c for op in prof.workload for c in with_staged[op][1] if c.params["topology"] in codegen.STAGED]
    assert {c.op for c in staged} == {"softmax", "log_softmax", "layernorm"}   # rmsnorm's are predicted slower everywhere
    assert all(c.prior == plan.DATASHEET for c in staged)
