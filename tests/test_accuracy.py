"""The rounding bound of a reduction order: how long a row a realisation keeps rtol on, and that
the planner, validation and the runtime keep to it."""
from __future__ import annotations

import math

import numpy as np
import pytest

from aicg import hw, plan, plan_inputs, validate
from aicg.runtime.instance import InstanceError, nearest_variant
from aicg.semantics import accuracy, legality
from aicg.semantics import ruleset as ruleset_loader

RTOL32 = 1e-5   # the tolerance preset's float32 rtol (rulesets/preservation.toml)


def params(topology: str, threads: int = 128, vec_bytes: int = 16) -> dict:
    return {"topology": topology, "threads": threads, "vec_bytes": vec_bytes, "fast_exp": False, "cache_packs": 0}


@pytest.mark.parametrize("topology, threads, vec, cols, steps", [
    ("thread", 128, 4, 4097, 4100),      # one lane: every element, in packs of 4 where the row allows
    ("thread", 128, 1, 4097, 4097),
    ("lanes4", 128, 1, 8, 2 + 2),        # 2 elements a lane, a butterfly over 4 lanes
    ("warp", 256, 1, 64, 2 + 5),
    ("block", 256, 4, 4096, 16 + 5 + 7),     # 4 packs a lane, the warp butterfly, 8 warp partials folded in order
    ("cluster4", 128, 1, 1000, 2 + 5 + 3 + 3),   # 512 lanes; 4 warps' partials, then 4 blocks', in order
])
def test_a_chain_counts_a_lane_elements_and_the_tree_levels_of_reduce_cuh(topology, threads, vec, cols, steps):
    assert accuracy.chain_steps(topology, threads, vec, cols) == steps


def test_the_probabilistic_bound_grows_as_the_root_of_the_chain():
    short, long = accuracy.chain_error(100, 1e-6), accuracy.chain_error(10_000, 1e-6)
    assert 10 < long / short < 12          # sqrt(100) times, and lambda grows with log n
    assert accuracy.chain_error(100, 1e-9) > short   # surer is wider


def test_where_validation_was_a_draw_the_bound_says_no(shipped_ruleset):
    """A float32 softmax row of 4097 summed by one thread in order broke rtol 1e-5 in about one row
    of forty (docs/performance.md, eleventh run): the order keeps the bound only on shorter rows."""
    longest = accuracy.longest_row(shipped_ruleset, "softmax", "float32", params("thread_rows8"), RTOL32)
    assert 256 < longest < 4097
    wider = accuracy.longest_row(shipped_ruleset, "softmax", "float32", params("block", 1024), RTOL32)
    assert wider > 65536    # a block's tree keeps it on every row length of the grid


def _softmax_errors(rows: np.ndarray) -> np.ndarray:
    """Each row's worst |y - ref| / |ref| of a float32 softmax summed in order, as one thread does."""
    z32 = np.exp(rows - rows.max(axis=1, keepdims=True)).astype(np.float32)
    total32 = np.add.accumulate(z32, axis=1, dtype=np.float32)[:, -1:]
    y = (z32 / total32).astype(np.float64)
    z = np.exp(rows.astype(np.float64) - rows.max(axis=1, keepdims=True))
    ref = z / z.sum(axis=1, keepdims=True)
    return (np.abs(y - ref) / ref).max(axis=1)


def test_the_sequential_order_keeps_rtol_up_to_its_longest_row_and_breaks_it_well_past(shipped_ruleset):
    """Emulated in float32 on the validation's shifted draw (N(3, 16)), the draw that made 4097 fail."""
    rng = np.random.default_rng(20261202)
    longest = accuracy.longest_row(shipped_ruleset, "softmax", "float32", params("thread"), RTOL32)
    at_edge = _softmax_errors(rng.standard_normal((400, longest), dtype=np.float32) * 4 + 3)
    past = _softmax_errors(rng.standard_normal((400, 4097), dtype=np.float32) * 4 + 3)
    assert at_edge.max() < RTOL32          # 3.5-5.1e-6 over six seeds: the bound is no wider than it must be
    assert (past > RTOL32).mean() > 0.01   # 3-4% of rows


def test_bf16_exact_and_bitwise_orders_are_unbounded(shipped_ruleset):
    thread = params("thread")
    assert accuracy.longest_row(shipped_ruleset, "softmax", "bfloat16", thread, 1.6e-2) > 1 << 24
    assert accuracy.longest_row(shipped_ruleset, "row_max", "float32", thread, RTOL32) is None   # max rounds nothing
    assert accuracy.longest_row(shipped_ruleset, "row_sum", "float32", thread, 0.0) is None     # bitwise: checked bit for bit
    assert accuracy.longest_row(shipped_ruleset, "bias_gelu_residual", "float32", params("flat"), RTOL32) is None


def test_a_norm_halves_the_sum_error_and_layernorm_adds_its_mean(shipped_ruleset):
    longest = {op: accuracy.longest_row(shipped_ruleset, op, "float32", params("thread"), RTOL32)
               for op in ("softmax", "rmsnorm", "layernorm")}
    assert longest["layernorm"] < longest["softmax"] < longest["rmsnorm"]


def test_check_shapes_are_cut_to_the_longest_row_with_their_padding():
    shapes = ((3, 1), (9, 4097), (37, 1000, 1024), (9, 4096, 4099), (37, 1000))
    assert accuracy.clip_shapes(shapes, None) == shapes
    assert accuracy.clip_shapes(shapes, 660) == ((3, 1), (9, 660), (37, 660, 684), (9, 660, 663), (37, 660))
    assert accuracy.clip_shapes(((9, 700), (9, 800)), 660) == ((9, 660),)


def test_validation_settings_check_a_kernel_only_where_it_may_run(load_small_profile):
    prof = load_small_profile
    full = validate.settings(prof, "float32", ((64, 1000),))["check_shapes"]
    cut = validate.settings(prof, "float32", ((64, 600),), longest_row=660)["check_shapes"]
    assert (9, 4097) in full and max(s[1] for s in cut) == 660 and (64, 600) in cut


@pytest.fixture(scope="module")
def load_small_profile(repo, shipped_ruleset, tmp_path_factory):
    from aicg import profile
    from doit_project import profile_text
    path = tmp_path_factory.mktemp("profile") / "small.toml"
    path.write_text(profile_text())
    return profile.load(path, shipped_ruleset, repo / "hwdb")


@pytest.fixture(scope="module")
def h200_facts(repo):
    return plan_inputs.values(plan_inputs.resolve(hw.load_target(repo / "hwdb", "nvidia-h200")))


def _plan(shipped_ruleset, op, dtype, shapes, facts, rtol):
    pres = legality.Preservation("tolerance", shipped_ruleset.presets["tolerance"].axes, {dtype: (rtol, 0.0)})
    decided = legality.decide_all(op, (dtype,), shipped_ruleset, pres, legality.RuleChoice(frozenset(), None))
    rejected = []
    pool = plan.plan_op(op, decided, shipped_ruleset.families_of(op), (dtype,), shapes, facts, 10_000,
                        bounds={dtype: rtol}, rejected=rejected, ruleset=shipped_ruleset)
    return pool, rejected


def test_the_planner_keeps_a_thread_per_row_only_where_its_order_keeps_the_bound(shipped_ruleset, h200_facts):
    short, _ = _plan(shipped_ruleset, "softmax", "float32", ((4096, 64),), h200_facts, RTOL32)
    long, _ = _plan(shipped_ruleset, "softmax", "float32", ((4096, 4096),), h200_facts, RTOL32)
    threads = {"thread", "thread_rows8"}
    assert any(c.params["topology"] in threads for c in short)
    assert not any(c.params["topology"] in threads for c in long)
    for cols, pool in ((64, short), (4096, long)):
        for c in pool:
            assert c.longest_row is None or c.longest_row >= cols
            assert c.longest_row == accuracy.longest_row(shipped_ruleset, "softmax", "float32", c.params, RTOL32)
    bf16, _ = _plan(shipped_ruleset, "softmax", "bfloat16", ((4096, 4096),), h200_facts, 1.6e-2)
    assert any(c.params["topology"] in threads for c in bf16)


def test_a_rule_every_realisation_of_which_is_too_long_is_rejected_with_the_bound(shipped_ruleset, h200_facts):
    pool, rejected = _plan(shipped_ruleset, "row_sum", "float32", ((4096, 4096),), h200_facts, RTOL32)
    assert {c.family for c in pool} == {"row_sum_tree"}
    (why,) = [r for r in rejected if r["rule"] == "sequential_reduction"]
    assert why["by"] == "rounding bound" and why["cols"] == 4096 and why["longest_row"] < 4096
    assert why["family"] == "row_sum_sequential" and "Higham" in why["source"]


def test_the_runtime_runs_a_packaged_kernel_only_on_rows_its_order_keeps_the_bound_on():
    entry = {"op": "softmax", "dtype": "float32", "cubin": "k", "params": {},
             "dispatch": [{"rows": 65536, "cols": 8, "cubin": "tiny", "params": {}, "longest_row": 660},
                          {"rows": 64, "cols": 32768, "cubin": "long", "params": {}, "longest_row": None}]}
    assert nearest_variant(entry, 65536, 8)["cubin"] == "tiny"
    assert nearest_variant(entry, 65536, 1000)["cubin"] == "long"   # nearer the tiny rows, past their bound
    only_tiny = {**entry, "dispatch": entry["dispatch"][:1]}
    with pytest.raises(InstanceError, match="on rows of 1000 elements .* at most 660"):
        nearest_variant(only_tiny, 65536, 1000)


def test_a_realisation_serves_the_workload_shapes_its_order_keeps_the_bound_on(shipped_ruleset, h200_facts):
    shapes = ((65536, 64), (4096, 4096))
    pool, rejected = _plan(shipped_ruleset, "softmax", "float32", shapes, h200_facts, RTOL32)
    threads = [c for c in pool if c.params["topology"] in ("thread", "thread_rows8")]
    assert threads and not rejected
    for c in threads:
        assert c.serves(shapes[0]) and not c.serves(shapes[1])
        assert c.predicted_seconds[1] == math.inf and math.isfinite(c.predicted_seconds[0])
        assert c.as_record()["predicted_seconds"][1] is None and plan.Candidate.from_record(c.as_record()) == c


def test_the_operator_kernel_is_one_timed_at_every_shape_and_a_partial_one_is_a_variant():
    from aicg.tasks import package

    def cand(name, longest):
        return plan.Candidate(name, "softmax", "f", "float32", {}, (), (1e-5, 1e-5 if longest is None else math.inf),
                              "lab", longest)

    whole, tiny = cand("whole", None), cand("tiny", 660)
    checks = [{"trial": 0, "passed": True}]
    results = {"whole": {"status": "passed", "checks": checks, "timings": [{"shape": [65536, 64], "median_seconds": 9e-6},
                                                         {"shape": [4096, 4096], "median_seconds": 40e-6}]},
               "tiny": {"status": "passed", "checks": checks, "timings": [{"shape": [65536, 64], "median_seconds": 3e-6}]}}
    reports = {name: {"resources": {}} for name in results}
    picked = package.select("softmax", ("float32",), [whole, tiny], results, reports)["dtypes"]["float32"]
    assert picked["chosen"] == "whole"     # tiny's geometric mean, over one short shape, is not comparable
    assert {(s["cols"], s["candidate"]) for s in picked["by_shape"]} == {(64, "tiny"), (4096, "whole")}
    unvalidated = {name: {"status": "unvalidated"} for name in results}
    assert package.select("softmax", ("float32",), [tiny, whole], unvalidated, reports)["dtypes"]["float32"]["chosen"] == "whole"


def test_explain_says_which_rule_the_rounding_bound_rejected_and_by_how_much(tmp_path):
    from doit_project import doit, make_project, profile_text
    project = make_project(tmp_path / "proj", profile_text(ops=("row_sum",), shapes=((4096, 4096),), per_family=1))
    run = doit(project, "explain", "profile=rulesets/profiles/small.toml", "op=row_sum")
    assert run.code == 0, run.output
    line = next(line for line in run.output.splitlines() if "rejected by its rounding bound" in line)
    assert "sequential_reduction in row_sum_sequential (float32)" in line and "rtol 1e-05" in line
    rules = ruleset_loader.load(project / "rulesets")
    family = rules.families["row_sum_sequential"]
    best = max(accuracy.longest_row(rules, "row_sum", "float32", p, RTOL32)
               for p in plan.runnable_params(family, "float32", plan_inputs.values(plan_inputs.resolve(
                   hw.load_target(project / "hwdb", "nvidia-h200")))))
    assert f"at most {best} elements" in line and 600 < best < 700
    assert "shortest rows have 4096" in line and "Higham & Mary" in line


def test_the_report_says_which_shapes_a_bounded_variant_serves():
    from aicg.tasks import summary
    kernel = {"op": "softmax", "dtype": "float32", "candidate": "whole", "family": "f", "basis": "fastest",
              "params": {"threads": 128, "vec_bytes": 16, "topology": "block"}, "validation": "passed",
              "resources": {"registers": 32, "shared_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0},
              "legal_families": ["f"], "considered": 2, "longest_row": None, "why": {"family": [], "rules": {}},
              "dispatch": [{"rows": 65536, "cols": 64, "candidate": "tiny", "longest_row": 660},
                           {"rows": 4096, "cols": 4096, "candidate": "whole", "longest_row": None}]}
    manifest = {"instance": "i", "target": {"name": "NVIDIA H200", "arch": "sm_90"},
                "preservation": {"preset": "tolerance", "axes": {}}, "toolchain": {}, "unavailable": {},
                "kernels": {"softmax.float32": kernel}}
    text = summary.report(manifest)
    assert "- 65536x64: tiny (its order keeps the bound on rows of at most 660 elements)" in text
    assert "- 4096x4096: whole\n" in text
