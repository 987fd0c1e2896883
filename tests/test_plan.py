import dataclasses
import math

import pytest

from aicg import hw, plan, plan_inputs, profile
from aicg.dtypes import DTYPES
from aicg.semantics import legality


@pytest.fixture(scope="session")
def load_profile(repo, shipped_ruleset):
    def load(name):
        return profile.load(repo / "rulesets" / "profiles" / f"{name}.toml", shipped_ruleset, repo / "hwdb")
    return load


@pytest.fixture(scope="session")
def all_facts(repo):
    """The H200's plan inputs and every fact of its entry besides: the planner gets more than it should read."""
    h = hw.load_target(repo / "hwdb", "nvidia-h200")
    return {**{name: h.fact(name) for name in h.facts}, **plan_inputs.values(plan_inputs.resolve(h))}


def make_plan(rs, prof, facts, per_family=None):
    return [c for _, cands in plan.plan_workload(rs, prof, facts, per_family).values() for c in cands]


@pytest.fixture(scope="session", params=["default", "fast", "deterministic"])
def full_pool(request, shipped_ruleset, load_profile, all_facts):
    """Every candidate the planner would consider (no per-family cut)."""
    prof = load_profile(request.param)
    return prof, make_plan(shipped_ruleset, prof, all_facts, per_family=10_000)


def test_every_entry_gives_every_plan_input(repo):
    for path in sorted((repo / "hwdb").glob("*.toml")):
        entry = hw.load(path)
        for measured in (True, False):
            assert set(plan.PLAN_INPUTS) <= set(plan_inputs.resolve(entry, measured)), path


def test_the_plan_reads_only_plan_facts(shipped_ruleset, load_profile, all_facts):
    class OnlyPlanFacts(dict):
        def __getitem__(self, key):
            assert key in plan.PLAN_INPUTS, f"the plan read {key}, which is not in PLAN_INPUTS"
            return super().__getitem__(key)
    for name in ["default", "fast"]:
        assert make_plan(shipped_ruleset, load_profile(name), OnlyPlanFacts(all_facts))


def test_candidates_respect_the_hardware(full_pool, all_facts):
    _, pool = full_pool
    assert pool
    for c in pool:
        size = DTYPES[c.dtype].size
        assert c.params["threads"] <= all_facts["max_threads_per_block"]
        assert c.params["threads"] % all_facts["warp_size"] == 0
        assert c.params["vec_bytes"] >= size and c.params["vec_bytes"] % size == 0


def test_a_smaller_block_limit_is_obeyed(shipped_ruleset, load_profile, all_facts):
    pool = make_plan(shipped_ruleset, load_profile("default"), {**all_facts, "max_threads_per_block": 256}, 10_000)
    assert pool and max(c.params["threads"] for c in pool) <= 256


def test_parameters_the_hardware_or_the_dtype_cannot_take_are_dropped(shipped_ruleset, load_profile, all_facts):
    rs, prof = shipped_ruleset, load_profile("default")
    family = rs.families["row_sum_tree"]
    family = dataclasses.replace(family, params={**family.params, "threads": (16, 48, 64, 1024, 2048),
                                                 "vec_bytes": (2, 4, 8, 16)})
    legal = legality.decide_all("row_sum", ["float32", "bfloat16"], rs, prof.preservation, prof.choice)
    pool = plan.plan_op("row_sum", legal, [family], ["float32", "bfloat16"], [(1024, 1024)], all_facts, 10_000)
    for dtype, vec_bytes in [("float32", {4, 8, 16}), ("bfloat16", {2, 4, 8, 16})]:
        mine = [c for c in pool if c.dtype == dtype]
        assert {c.params["vec_bytes"] for c in mine} == vec_bytes
        assert {c.params["threads"] for c in mine} == {64, 1024}


def test_fast_exp_only_where_fast_intrinsics_is_legal(full_pool):
    prof, pool = full_pool
    fast_legal = prof.preservation.axes["math"] == "approximate" and "fast_intrinsics" not in prof.choice.forbid
    fast = [c for c in pool if c.params["fast_exp"]]
    assert bool(fast) == fast_legal
    for c in pool:
        assert ("fast_intrinsics" in c.rules) == c.params["fast_exp"]


def test_vector_loads_iff_wider_than_an_element(full_pool):
    _, pool = full_pool
    for c in pool:
        assert ("vector_loads" in c.rules) == (c.params["vec_bytes"] > DTYPES[c.dtype].size), c.id
    assert {"vector_loads" in c.rules for c in pool} == {True, False}      # both cases occur


def test_illegal_families_give_no_candidates(shipped_ruleset, load_profile, all_facts):
    prof = load_profile("bitwise")   # only the exact and the sequential families survive
    assert {c.family for c in make_plan(shipped_ruleset, prof, all_facts)} == {"row_max_tree", "row_sum_sequential"}


def test_the_best_few_are_kept_per_family_and_dtype(full_pool, shipped_ruleset, all_facts):
    """At most k per (family, dtype): the best overall first, then the predicted
    best at each workload shape, the best of each structure (topology, row held
    in registers or not, one row per SM or several) when k allows, and otherwise the best by predicted time."""
    prof, pool = full_pool
    def structure(c):
        return plan.structure(c, max(cols for _, cols in prof.workload[c.op].shapes), all_facts)
    for k in [1, 2, 3, 4]:
        kept = make_plan(shipped_ruleset, prof, all_facts, per_family=k)
        assert {(c.family, c.dtype) for c in kept} == {(c.family, c.dtype) for c in pool}
        for fam, dtype in {(c.family, c.dtype) for c in kept}:
            group = [c for c in pool if (c.family, c.dtype) == (fam, dtype)]
            mine = [c for c in kept if (c.family, c.dtype) == (fam, dtype)]
            dropped = [c for c in group if c not in mine]
            assert len(mine) == min(k, len(group))
            assert mine[0].score == min(c.score for c in group)
            structures = {structure(c) for c in group}
            shape_leaders = {min(group, key=lambda c: (c.predicted_seconds[i], c.id)).id
                             for i in range(len(group[0].predicted_seconds))}
            if k >= 1 + len(shape_leaders):
                assert shape_leaders <= {c.id for c in mine}
            leaders = [min((c for c in group if structure(c) == s), key=lambda c: (c.score, c.id))
                       for s in structures]
            leaders += [c for c in group if c.id in shape_leaders]
            if k >= 1 + len(shape_leaders) + len(structures):
                assert all(leader in mine for leader in leaders)
            assert all(c.score <= o.score for c in mine if c not in leaders for o in dropped)


def test_a_held_row_that_leaves_one_row_per_sm_is_its_own_structure(all_facts):
    """Rows of 16384 bfloat16 elements at 512 threads: eight packs per lane hold twice the row, and
    their registers leave room for one block per SM; four packs hold it exactly and two blocks fit.
    The device gets to compare both (measured on the H200: 87 against 55 us at 2048 rows), even
    where the prior ranks a second one-row-per-SM candidate ahead of it."""
    def candidate(threads, cache_packs, predicted):
        p = {"threads": threads, "vec_bytes": 16, "topology": "block", "fast_exp": False, "cache_packs": cache_packs}
        return plan.Candidate(plan.candidate_id("residual_rmsnorm_tree", "bfloat16", p), "residual_rmsnorm",
                              "residual_rmsnorm_tree", "bfloat16", p, (), (predicted,))
    eight, wide_four, unheld, four = (candidate(512, 8, 1.0), candidate(1024, 4, 1.2), candidate(1024, 0, 1.5),
                                      candidate(512, 4, 2.0))
    assert plan.residency("bfloat16", eight.params, 16384, all_facts).rows_per_sm == 1
    assert plan.residency("bfloat16", wide_four.params, 16384, all_facts).rows_per_sm == 1
    assert plan.residency("bfloat16", four.params, 16384, all_facts).rows_per_sm == 2
    assert plan.structure(eight, 16384, all_facts) == plan.structure(wide_four, 16384, all_facts)
    assert plan.structure(eight, 16384, all_facts) != plan.structure(four, 16384, all_facts)
    spread = plan._best_spread([eight, wide_four, unheld, four], 3, lambda c: plan.structure(c, 16384, all_facts))
    assert spread == [eight, unheld, four]


def test_candidates_are_well_formed(full_pool, all_facts):
    prof, pool = full_pool
    assert len({c.id for c in pool}) == len(pool)
    for c in pool:
        assert len(c.predicted_seconds) == len(prof.workload[c.op].shapes)
        shapes = prof.workload[c.op].shapes
        assert any(c.serves(s) for s in shapes)
        for t, s in zip(c.predicted_seconds, shapes):   # infinite exactly where its order may not serve the rows
            assert (math.isfinite(t) and t > all_facts["launch_seconds"]) if c.serves(s) else t == math.inf
        assert plan.Candidate.from_record(c.as_record()) == c
        assert None not in c.as_record()["predicted_seconds"] or not all(c.serves(s) for s in shapes)


def test_a_fact_the_plan_does_not_read_changes_nothing(shipped_ruleset, load_profile, all_facts):
    prof = load_profile("default")
    other = {k: (v * 3 if k not in plan.PLAN_INPUTS else v) for k, v in all_facts.items()}
    assert other != all_facts
    before = [c.as_record() for c in make_plan(shipped_ruleset, prof, all_facts)]
    assert [c.as_record() for c in make_plan(shipped_ruleset, prof, other)] == before


def _with(all_facts, **scaled):
    return {**all_facts, **{k: factor * all_facts[k] for k, factor in scaled.items()}}


def test_more_dram_bandwidth_predicts_shorter_times_where_bytes_bound_them(shipped_ruleset, load_profile, all_facts):
    """Doubling the bandwidth shortens every prediction that shorter latencies leave alone
    (bound by bytes), and lengthens none (a lane's chain of waits does not move faster)."""
    prof = load_profile("default")
    plans = {name: {c.id: c.predicted_seconds for c in make_plan(shipped_ruleset, prof, facts, 10_000)}
             for name, facts in (("base", all_facts), ("bandwidth", _with(all_facts, dram_bandwidth=2)),
                                 ("latency", _with(all_facts, dram_latency_seconds=0.5, l2_latency_seconds=0.5)))}
    assert plans["base"].keys() == plans["bandwidth"].keys() == plans["latency"].keys()
    bytes_bound = served = 0
    for cid, base in plans["base"].items():
        for b, f, quick in zip(base, plans["bandwidth"][cid], plans["latency"][cid]):
            if b == math.inf:          # a shape whose rows its order does not keep the bound on
                assert f == quick == math.inf, cid
                continue
            served += 1
            assert f <= b, cid
            if quick == b:
                assert f < b, cid
                bytes_bound += 1
    assert bytes_bound > 0.9 * served


def test_one_thread_does_not_walk_a_long_row_alone(shipped_ruleset, all_facts):
    """A single long row: one thread per row would wait on memory thousands of times in a
    row; the lanes of a block share the waits."""
    family = shipped_ruleset.families["row_sum_tree"]
    params = {"threads": 256, "vec_bytes": 16, "fast_exp": False, "cache_packs": 0}
    thread, block = (plan.predict_seconds(family, "float32", {**params, "topology": t}, (1, 65536), all_facts)
                     for t in ("thread", "block"))
    assert thread > 20 * block


def test_short_rows_go_to_one_thread_each_and_long_rows_to_many(shipped_ruleset, all_facts):
    """The datasheet model: rows within a 32-byte sector lie side by side, so a thread per row
    reads whole sectors; a long row read by one thread strides and pays the uncoalesced penalty."""
    family = shipped_ruleset.families["row_sum_tree"]
    params = {"threads": 256, "vec_bytes": 16, "fast_exp": False, "cache_packs": 0}

    def seconds(topology, shape):
        return plan.predict_seconds(family, "float32", {**params, "topology": topology}, shape, all_facts)
    for shape in [(1 << 22, 1), (1 << 20, 8)]:
        assert seconds("thread", shape) < seconds("lanes4", shape) < seconds("warp", shape)
    assert seconds("warp", (1 << 15, 1024)) < seconds("thread", (1 << 15, 1024))
