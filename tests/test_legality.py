"""The legality engine: for every rule a legal and an illegal case, checked by
the decision and the facts it cites (kind, outcome, fields), not by text."""
import pytest

from aicg.semantics import legality

PRESETS = ["bitwise", "deterministic", "tolerance", "fast"]


def preservation(rs, preset, rtol=None, **axes):
    p = rs.presets[preset]
    tolerance = dict(p.tolerance)
    if rtol is not None:
        tolerance = {d: (rtol, a) for d, (_, a) in tolerance.items()}
    return legality.Preservation(preset, {**p.axes, **axes}, tolerance)


def rule_decision(rs, rule, op, preset, dtype="float32", forbid=(), select=None, rtol=None, **axes):
    choice = legality.RuleChoice(frozenset(forbid), None if select is None else frozenset(select))
    return legality.decide_rule(rs.rules[rule], rs.ops[op], dtype, rs, preservation(rs, preset, rtol, **axes), choice)


def cited(decision, kind, **fields):
    """The facts of `kind` whose fields include `fields`."""
    return [f for f in decision.facts if f.kind == kind and all(f[k] == v for k, v in fields.items())]


# (rule, operator, preset, extra settings, expected legality, fact kind, fact fields, fact ok)
CASES = [
    ("sequential_reduction", "row_sum", "bitwise", {}, True, "no_needs", {}, True),
    ("sequential_reduction", "row_sum", "bitwise", {"forbid": ["sequential_reduction"]}, False, "forbidden", {}, False),
    ("tree_reduction", "row_sum", "tolerance", {}, True, "axis", {"axis": "order", "when": "inexact"}, True),
    ("tree_reduction", "row_sum", "bitwise", {}, False, "axis", {"axis": "order", "value": "reference"}, False),
    ("tree_reduction", "row_max", "bitwise", {}, True, "inexact_waived", {}, True),
    ("split_reduction", "row_sum", "deterministic", {}, True, "property", {"property": "associative", "holds": "real"}, True),
    ("split_reduction", "row_sum", "bitwise", {}, False, "axis", {"axis": "order"}, False),
    ("atomics", "row_sum", "tolerance", {}, True, "axis", {"axis": "deterministic", "value": False}, True),
    ("atomics", "row_sum", "deterministic", {}, False, "nondeterministic", {}, False),
    ("online_softmax", "softmax", "deterministic", {}, True, "property", {"property": "online_decomposable"}, True),
    ("online_softmax", "row_sum", "tolerance", {}, False, "property", {"property": "online_decomposable", "holds": "absent"}, False),
    ("welford", "layernorm", "tolerance", {}, True, "property", {"property": "welford_decomposable"}, True),
    ("welford", "layernorm", "bitwise", {}, False, "axis", {"axis": "order"}, False),
    ("libdevice_math", "rmsnorm", "bitwise", {}, True, "inexact_waived", {}, True),   # sqrt and division are exact
    ("libdevice_math", "softmax", "bitwise", {}, False, "property", {"subject": "function exp of softmax", "holds": "real"}, True),
    ("fast_intrinsics", "softmax", "fast", {}, True, "error_bound", {"dtype": "float32"}, True),
    ("fast_intrinsics", "softmax", "tolerance", {}, False, "axis", {"axis": "math", "value": "precise"}, False),
    ("fast_intrinsics", "softmax", "fast", {"rtol": 1e-6}, False, "error_bound", {"dtype": "float32"}, False),
    ("fma_contraction", "rmsnorm", "tolerance", {}, True, "axis", {"axis": "order", "when": "always"}, True),
    ("fma_contraction", "rmsnorm", "bitwise", {}, False, "axis", {"axis": "order", "when": "always"}, False),
    ("flush_to_zero", "softmax", "fast", {}, True, "axis", {"axis": "denormals", "value": "flush"}, True),
    ("flush_to_zero", "softmax", "tolerance", {}, False, "axis", {"axis": "denormals", "value": "preserve"}, False),
    ("vector_loads", "softmax", "bitwise", {}, True, "no_needs", {}, True),
    ("vector_loads", "softmax", "bitwise", {"forbid": ["vector_loads"]}, False, "forbidden", {}, False),
    ("register_staging", "softmax", "bitwise", {}, True, "no_needs", {}, True),
    ("register_staging", "softmax", "tolerance", {"forbid": ["register_staging"]}, False, "forbidden", {}, False),
    ("shared_staging", "softmax", "bitwise", {}, True, "no_needs", {}, True),
    ("shared_staging", "layernorm", "tolerance", {"forbid": ["shared_staging"]}, False, "forbidden", {}, False),
    ("row_prefetch", "rmsnorm", "bitwise", {}, True, "no_needs", {}, True),
    ("row_prefetch", "softmax", "tolerance", {"forbid": ["row_prefetch"]}, False, "forbidden", {}, False),
    ("fusion", "rmsnorm", "tolerance", {}, True, "axis", {"axis": "order"}, True),
    ("fusion", "rmsnorm", "bitwise", {}, False, "axis", {"axis": "order"}, False),
    ("rematerialisation", "layernorm", "bitwise", {}, True, "no_needs", {}, True),
    ("rematerialisation", "layernorm", "bitwise", {"select": ["tree_reduction"]}, False, "not_selected", {}, False),
    ("reduced_precision_operands", "matmul", "fast", {}, True, "error_bound", {"dtype": "float32", "added": 9.8e-4}, True),
    ("reduced_precision_operands", "matmul", "tolerance", {}, False, "error_bound", {"dtype": "float32"}, False),
    ("reduced_precision_operands", "matmul", "tolerance", {"dtype": "bfloat16"}, True, "error_bound", {"dtype": "bfloat16"}, True),
    ("rounded_intermediates", "softmax", "tolerance", {"dtype": "float16"}, True, "error_bound", {"dtype": "float16", "added": 4.89e-4}, True),
    ("rounded_intermediates", "softmax", "deterministic", {"dtype": "bfloat16"}, True, "axis", {"axis": "order"}, True),
    ("rounded_intermediates", "softmax", "bitwise", {"dtype": "bfloat16"}, False, "axis", {"axis": "order"}, False),
    ("rounded_intermediates", "softmax", "tolerance", {"dtype": "float16", "rtol": 4e-4}, False, "error_bound", {"dtype": "float16"}, False),
    ("split_k", "matmul", "deterministic", {}, True, "property", {"property": "split_k_decomposable"}, True),
    ("split_k", "matmul", "bitwise", {}, False, "axis", {"axis": "order"}, False),
]


@pytest.mark.parametrize("rule, op, preset, extra, legal, kind, fields, ok", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{'legal' if c[4] else 'illegal'}" for c in CASES])
def test_rule_decision_and_the_facts_it_cites(shipped_ruleset, rule, op, preset, extra, legal, kind, fields, ok):
    decision = rule_decision(shipped_ruleset, rule, op, preset, **extra)
    assert decision.legal == legal
    facts = cited(decision, kind, **fields)
    assert facts, [f.as_record() for f in decision.facts]
    assert all(f.ok == ok for f in facts)
    assert all(f.text() for f in decision.facts)   # every fact renders


def test_every_rule_has_a_legal_and_an_illegal_case(shipped_ruleset):
    covered = {(c[0], c[4]) for c in CASES}
    for rule in shipped_ruleset.rules:
        assert (rule, True) in covered and (rule, False) in covered, rule


def test_an_illegal_rule_says_which_axis_value_would_allow_it(shipped_ruleset):
    assert rule_decision(shipped_ruleset, "tree_reduction", "row_sum", "bitwise").relax == (("order", "fixed"),)
    assert ("deterministic", False) in rule_decision(shipped_ruleset, "atomics", "row_sum", "deterministic").relax


def decide(rs, op, preset, dtype="float32", forbid=(), select=None, **axes):
    choice = legality.RuleChoice(frozenset(forbid), None if select is None else frozenset(select))
    return legality.decide(op, dtype, rs, preservation(rs, preset, **axes), choice)


def test_bitwise_softmax_is_unreachable_and_the_hint_says_why(shipped_ruleset):
    result = decide(shipped_ruleset, "softmax", "bitwise")
    assert result.legal_families() == []
    assert "function exp of softmax is correctly_rounded in real arithmetic only" in result.hint
    assert "expf has a maximum error of 2 ulp" in result.hint
    assert "order = 'fixed'" in result.hint and "preset 'deterministic'" in result.hint


@pytest.mark.parametrize("op, families", [("row_max", ["row_max_tree"]), ("row_sum", ["row_sum_sequential"])])
def test_bitwise_keeps_the_exact_and_the_sequential_families(shipped_ruleset, op, families):
    result = decide(shipped_ruleset, op, "bitwise")
    assert result.legal_families() == families and result.hint is None


@pytest.mark.parametrize("preset", ["deterministic", "tolerance", "fast"])
def test_every_family_is_legal_once_order_may_change(shipped_ruleset, preset):
    for op in ["softmax", "row_sum", "row_max", "rmsnorm", "layernorm"]:
        for dtype in ["float32", "bfloat16"]:
            result = decide(shipped_ruleset, op, preset, dtype=dtype)
            assert sorted(result.legal_families()) == sorted(f.name for f in shipped_ruleset.families_of(op, dtype))


def test_a_family_is_decided_only_in_the_dtypes_it_realises(shipped_ruleset):
    assert "softmax_rounded_exps" not in decide(shipped_ruleset, "softmax", "tolerance", dtype="float32").families
    assert decide(shipped_ruleset, "softmax", "tolerance", dtype="bfloat16").families["softmax_rounded_exps"].legal


def test_a_family_cites_each_rule_it_uses(shipped_ruleset):
    result = decide(shipped_ruleset, "softmax", "tolerance", forbid=["online_softmax"])
    assert result.legal_families() == ["softmax_twopass"]
    online = result.families["softmax_online"]
    assert [(f["rule"], f.ok) for f in online.facts] == [("tree_reduction", True), ("online_softmax", False),
                                                         ("libdevice_math", True)]


def test_an_operator_without_a_family_is_explained(shipped_ruleset):
    result = decide(shipped_ruleset, "gelu", "tolerance")
    assert result.families == {} and "no kernel family implements gelu" in result.hint


def test_a_selected_rule_the_preservation_level_rules_out_is_a_conflict(shipped_ruleset):
    choice = legality.RuleChoice(frozenset(), frozenset({"fast_intrinsics", "tree_reduction"}))
    conflicts = legality.selection_conflicts(shipped_ruleset, preservation(shipped_ruleset, "tolerance"), choice,
                                             ["float32"])
    assert len(conflicts) == 1 and "fast_intrinsics" in conflicts[0] and "math" in conflicts[0]
    assert legality.selection_conflicts(shipped_ruleset, preservation(shipped_ruleset, "fast"), choice, ["float32"]) == []


def test_legality_depends_on_the_dtype_through_the_error_bound(shipped_ruleset):
    f32 = rule_decision(shipped_ruleset, "reduced_precision_operands", "matmul", "tolerance", dtype="float32")
    bf16 = rule_decision(shipped_ruleset, "reduced_precision_operands", "matmul", "tolerance", dtype="bfloat16")
    assert not f32.legal and bf16.legal
