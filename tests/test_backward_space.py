"""The backward families (aicg/backward/families.toml): loaded strictly, decided by the legality
engine with the instance's rule sets (the reduction-order rules apply: no tree of a sum where the
profile asks for the reference order, only fixed orders where it asks for determinism), and the
candidates a shape takes. CPU only."""
from __future__ import annotations

import shutil

import pytest

from aicg import profile
from aicg.backward import space
from aicg.backward.ops import BACKWARD_OPS
from aicg.semantics import ruleset as ruleset_mod

OPS = tuple(BACKWARD_OPS)


@pytest.fixture(scope="module")
def shipped_space(shipped_ruleset):
    return space.load(space.SPACE_FILE, shipped_ruleset)


def _profile(repo, shipped_ruleset, name: str):
    return profile.load(repo / f"rulesets/profiles/{name}.toml", shipped_ruleset, repo / "hwdb")


def _decide(shipped_space, ruleset, prof, op, dtype="float32"):
    return space.decide(shipped_space, ruleset, prof.preservation, prof.choice, op, dtype)


def test_every_backward_operator_is_stated_with_its_parts(shipped_space):
    assert set(shipped_space.parts) == set(OPS)
    for op, parts in shipped_space.parts.items():
        assert parts == (("rows", "columns") if BACKWARD_OPS[op].column_outputs else ("rows",))
        with_columns = [f"{op}_rows_with_columns"] if BACKWARD_OPS[op].column_outputs else []
        assert [f.name for f in shipped_space.families_of(op)] == [*with_columns, f"{op}_rows"]
    columns = shipped_space.families_of(space.COLUMN_OP)
    assert [f.totals for f in columns] == ["aicg::column_totals"] * 2
    assert [f.name for f in columns if f.partials_from_rows] == ["column_sum_from_rows"]
    for family in shipped_space.families.values():
        assert family.ladder[-1].cols is None          # the last entry serves every longer row
        limits = [r.cols for r in family.ladder if r.cols is not None]
        assert limits == sorted(limits) and [r.cols for r in family.ladder[len(limits):]] == [None] * (
            len(family.ladder) - len(limits))


@pytest.mark.parametrize("preset", ["default", "deterministic", "fast"])
def test_every_backward_is_legal_where_fixed_orders_are_and_every_legal_family_is_deterministic(
        repo, shipped_ruleset, shipped_space, preset):
    prof = _profile(repo, shipped_ruleset, preset)
    for op in OPS:
        for dtype in ("float32", "bfloat16", "float16"):
            decision = _decide(shipped_space, shipped_ruleset, prof, op, dtype)
            assert decision.legal, decision.why_not()
            for part in decision.parts.values():
                for family in part.legal_families():
                    assert all(shipped_ruleset.rules[r].deterministic for r in shipped_space.families[family].rules)


def test_under_the_reference_order_no_tree_is_legal_and_the_engine_says_why(repo, shipped_ruleset, shipped_space):
    prof = _profile(repo, shipped_ruleset, "bitwise")
    for op in OPS:
        decision = _decide(shipped_space, shipped_ruleset, prof, op)
        assert not decision.legal
        facts = decision.parts["rows"].rules["tree_reduction"].blocking()
        assert [(f.kind, f["axis"], f["value"]) for f in facts] == [("axis", "order", "reference")]
        assert "tree_reduction" in decision.why_not() and "associative in real arithmetic only" in decision.why_not()
        if "columns" in decision.parts:
            assert not decision.parts["columns"].rules["split_reduction"].legal


def test_a_forbidden_rule_takes_away_exactly_the_families_and_candidates_using_it(rules_dir, repo, edit):
    profile_path = rules_dir / "profiles/default.toml"
    edit(profile_path, "forbid = []", 'forbid = ["split_reduction", "register_staging"]')
    ruleset = ruleset_mod.load(rules_dir)
    prof = profile.load(profile_path, ruleset, repo / "hwdb")
    backward = space.load(space.SPACE_FILE, ruleset)
    norm = _decide(backward, ruleset, prof, "rmsnorm_backward")
    assert not norm.legal and "split_reduction" in norm.why_not()       # its weight's gradient: no column family
    softmax = _decide(backward, ruleset, prof, "softmax_backward")
    assert softmax.legal
    found, passed_over = space.candidates(backward, softmax, 1e-5, 1e-6, 64, 1000)
    assert [c.rows["cache_packs"] for c in found] == [0]           # only the streaming rung is left
    assert passed_over and all("not legal" in why for why in passed_over)


def test_candidates_follow_the_ladder_and_the_bound(repo, shipped_ruleset, shipped_space):
    prof = _profile(repo, shipped_ruleset, "default")
    decision = _decide(shipped_space, shipped_ruleset, prof, "layernorm_backward")
    found, passed_over = space.candidates(shipped_space, decision, 1e-5, 1e-6, 4096, 1000)
    assert not passed_over
    assert [c.rows["topology"] for c in found][:1] == ["block"]
    assert all(c.columns_family == "column_sum_two_pass" and c.columns for c in found)
    assert len({c.id for c in found}) == len(found)
    short, _ = space.candidates(shipped_space, decision, 1e-5, 1e-6, 4096, 7)
    assert short[0].rows["topology"] == "lanes4" and short[0].columns["col_lanes"] == 8
    # float32 rows of 65536: the ladder's block keeps rtol 1e-5 on rmsnorm's gradient only to 47104
    rms = _decide(shipped_space, shipped_ruleset, prof, "rmsnorm_backward")
    found, passed_over = space.candidates(shipped_space, rms, 1e-5, 1e-6, 64, 65536)
    assert found == [] and any("rows of at most" in why for why in passed_over)
    found, _ = space.candidates(shipped_space, _decide(shipped_space, shipped_ruleset, prof, "rmsnorm_backward",
                                                       "bfloat16"), 1.6e-2, 1e-6, 64, 65536)
    assert found
    record = found[0].as_record()
    assert space.Candidate.from_record(record) == found[0]


def test_chunking_keeps_at_most_max_chunks(shipped_space):
    family = shipped_space.families["column_sum_two_pass"]
    params = family.ladder[-1].params
    assert space.chunking(family, params, 1) == (params["chunk_rows"], 1)
    assert space.chunking(family, params, 10 * params["chunk_rows"] + 1) == (params["chunk_rows"], 11)
    chunk, chunks = space.chunking(family, params, 10**7)
    assert chunks <= family.max_chunks and chunk * chunks >= 10**7


@pytest.mark.parametrize("old, new, key, expected", [
    ('topology = "lanes4"', 'topology = "cluster8"', "ladders.rows.entries[0].topology", "one of warp, block"),
    ('{ threads = 512, topology = "block", vec_bytes = 16, cache_packs = 0 }',
     '{ cols = 9999, threads = 512, topology = "block", vec_bytes = 16, cache_packs = 0 }',
     "ladders.rows.entries[6].cols", "no key in the last entry"),
    ('rules = ["split_reduction"]\nsweeps = 1\nladder = "columns"\n',
     'rules = ["split_reductions"]\nsweeps = 1\nladder = "columns"\n', "families.column_sum_two_pass.rules", "one of"),
    ('reductions = ["sum"]\nfunctions = ["exp"]', 'reductions = ["sums"]\nfunctions = ["exp"]',
     "ops.log_softmax_backward.reductions", "one of"),
    ('max_chunks = 1024\n\n[families.column_sum_from_rows]', 'max_chunks = 70000\n\n[families.column_sum_from_rows]',
     "families.column_sum_two_pass.max_chunks", "an integer from 1 to 65535"),
    ('function = "aicg::rmsnorm_backward_columns"\ncolumns = "column_sum_from_rows"',
     'function = "aicg::rmsnorm_backward_columns"\ncolumns = "column_sum_two_pass"',
     "families.rmsnorm_backward_rows_with_columns.columns",
     "a column family without `function`"),
    ('{ min_cols = 2048, cols = 4096, threads = 512', '{ min_cols = 8192, cols = 4096, threads = 512',
     "ladders.rows_with_columns.entries[0].min_cols", "a row length from 1 to 4096"),
    ('{ cols = 16, threads = 128, topology = "lanes4"', '{ cols = 16, threads = 128, topology = "cluster4"',
     "families.softmax_backward_rows.ladder", "topologies keeping a row in one block"),
    ('col_lanes = 8, vec_bytes = 16', 'col_lanes = 12, vec_bytes = 16', "ladders.columns.entries[0].col_lanes",
     "one of 8, 16, 32"),
    ('parts = ["rows", "columns"]\n\n[ops.layernorm_backward]', 'parts = ["rows"]\n\n[ops.layernorm_backward]',
     "ops.rmsnorm_backward.parts", "'columns' exactly where"),
])
def test_a_wrong_space_file_names_its_key(tmp_path, shipped_ruleset, edit, raises_input_error, old, new, key, expected):
    path = shutil.copy(space.SPACE_FILE, tmp_path / "families.toml")
    edit(path, old, new)
    with raises_input_error(path, key, expected):
        space.load(path, shipped_ruleset)


def test_rows_held_whole_take_their_column_sums_in_the_same_pass_first(repo, shipped_ruleset, shipped_space):
    """From 2048 columns, where a block holds the rows whole in its dtype's packs, the norms' first
    candidates sum the weight's gradient in the rows' own pass (one read of g and x), with the
    two-pass candidates after them; the two kinds of column family never mix."""
    prof = _profile(repo, shipped_ruleset, "default")
    for dtype, first in (("bfloat16", (512, 1)), ("float32", (512, 2))):
        decision = _decide(shipped_space, shipped_ruleset, prof, "layernorm_backward", dtype)
        found, passed_over = space.candidates(shipped_space, decision, 1.6e-2, 1e-6, 32768, 4096)
        fused = [c for c in found if c.partials_in_rows]
        assert found[:len(fused)] == fused and len(fused) < len(found)
        assert (fused[0].rows["threads"], fused[0].rows["cache_packs"]) == first
        assert all(c.columns_family == "column_sum_from_rows" for c in fused)
        assert all(c.columns_family == "column_sum_two_pass" for c in found[len(fused):])
        if dtype == "float32":   # a 512-thread block of 4-float packs, one a lane, holds 2048
            assert any("does not hold rows of 4096 elements whole" in why for why in passed_over)
    narrow, _ = space.candidates(shipped_space, _decide(shipped_space, shipped_ruleset, prof, "rmsnorm_backward",
                                                        "bfloat16"), 1.6e-2, 1e-6, 32768, 1024)
    assert narrow and not any(c.partials_in_rows for c in narrow)     # below min_cols: the two passes


def test_a_chunk_summed_row_by_row_counts_its_rows_in_the_bound(shipped_space):
    from aicg.backward.ops import BACKWARD_OPS
    op = BACKWARD_OPS["rmsnorm_backward"]
    rows_params = {"threads": 512, "topology": "block", "vec_bytes": 16, "cache_packs": 1}
    columns = {"threads": 256, "col_lanes": 32, "vec_bytes": 16, "chunk_rows": 64}
    from_rows = space.column_error(op, shipped_space.families["column_sum_from_rows"], "bfloat16", rows_params,
                                   columns, 65536, 4096, 1e-6)
    two_pass = space.column_error(op, shipped_space.families["column_sum_two_pass"], "bfloat16", rows_params,
                                  columns, 65536, 4096, 1e-6)
    assert from_rows > two_pass     # 64 rows in one chain, against 8 a row lane


def test_rows_split_over_a_cluster_are_offered_only_where_the_gpu_has_clusters(repo, shipped_ruleset, shipped_space):
    prof = _profile(repo, shipped_ruleset, "default")
    decision = _decide(shipped_space, shipped_ruleset, prof, "rmsnorm_backward", "bfloat16")
    found, _ = space.candidates(shipped_space, decision, 1.6e-2, 1e-6, 4096, 32768, max_cluster_blocks=8)
    assert found[0].partials_in_rows and found[0].rows["topology"] == "cluster4"
    found, passed_over = space.candidates(shipped_space, decision, 1.6e-2, 1e-6, 4096, 32768, max_cluster_blocks=1)
    assert not any(c.rows["topology"].startswith("cluster") for c in found)
    assert any("a cluster of 4 blocks, the GPU's hold at most 1" in why for why in passed_over)
    assert found and not found[0].partials_in_rows        # the two passes serve it there
