import dataclasses

import pytest

from aicg.semantics import legality

PRESETS = ["bitwise", "deterministic", "tolerance", "fast"]


def decide(rs, preset, forbid=(), select=None, **axes):
    """Legality of every operator under a preset (with axis overrides) and a rule choice."""
    p = rs.presets[preset]
    pres = legality.Preservation(preset, {**p.axes, **axes}, dict(p.tolerance))
    choice = legality.RuleChoice(frozenset(forbid), None if select is None else frozenset(select))
    return {op: legality.decide(op, rs, pres, choice) for op in rs.ops}


@pytest.mark.parametrize("op", ["softmax", "row_sum", "rmsnorm", "layernorm"])
def test_bitwise_leaves_sum_based_operators_without_a_family(shipped_ruleset, op):
    result = decide(shipped_ruleset, "bitwise")[op]
    assert result.legal_families() == []
    assert "order = 'fixed'" in result.hint
    assert "preset 'deterministic'" in result.hint     # the only preset with order = "fixed"
    assert not result.rules["tree_reduction"].legal
    assert ("order", "fixed") in result.rules["tree_reduction"].relax


def test_row_max_stays_legal_under_bitwise(shipped_ruleset):
    result = decide(shipped_ruleset, "bitwise")["row_max"]
    assert result.legal_families() == ["row_max_tree"]
    assert result.hint is None
    assert any("does not apply" in f for f in result.rules["tree_reduction"].facts)


@pytest.mark.parametrize("preset", ["deterministic", "tolerance", "fast"])
def test_every_family_is_legal_once_order_may_change(shipped_ruleset, preset):
    for op, result in decide(shipped_ruleset, preset).items():
        assert sorted(result.legal_families()) == sorted(f.name for f in shipped_ruleset.families_of(op))
        assert result.hint is None


def test_forbidding_online_softmax(shipped_ruleset):
    softmax = decide(shipped_ruleset, "tolerance", forbid=["online_softmax"])["softmax"]
    assert softmax.legal_families() == ["softmax_twopass"]
    assert not softmax.families["softmax_online"].legal
    assert "rules.forbid" in softmax.rules["online_softmax"].facts[0]


@pytest.mark.parametrize("preset", PRESETS)
def test_fast_intrinsics_needs_approximate_math(shipped_ruleset, preset):
    approximate = shipped_ruleset.presets[preset].axes["math"] == "approximate"
    assert approximate == (preset == "fast")
    softmax = decide(shipped_ruleset, preset)["softmax"]
    assert softmax.rules["fast_intrinsics"].legal == approximate
    # Overriding the axis alone decides it.
    assert decide(shipped_ruleset, preset, math="approximate")["softmax"].rules["fast_intrinsics"].legal
    assert not decide(shipped_ruleset, preset, math="precise")["softmax"].rules["fast_intrinsics"].legal


@pytest.mark.parametrize("preset", PRESETS)
def test_every_decision_carries_facts(shipped_ruleset, preset):
    for choice in [{}, {"forbid": ["online_softmax", "welford"]}, {"select": ["tree_reduction"]}]:
        for result in decide(shipped_ruleset, preset, **choice).values():
            for decision in [*result.rules.values(), *result.families.values()]:
                assert decision.facts and all(isinstance(f, str) and f for f in decision.facts)


def test_select_restricts_the_rules(shipped_ruleset):
    results = decide(shipped_ruleset, "fast", select=["tree_reduction"])
    softmax = results["softmax"]
    assert softmax.rules["tree_reduction"].legal
    for rule in ["online_softmax", "vector_loads", "fast_intrinsics"]:
        assert not softmax.rules[rule].legal
        assert "rules.select" in softmax.rules[rule].facts[0]
    assert softmax.legal_families() == ["softmax_twopass"]
    assert results["layernorm"].legal_families() == ["layernorm_twopass"]


def test_forbidding_the_tree_leaves_nothing_a_preset_could_fix(shipped_ruleset):
    for op, result in decide(shipped_ruleset, "tolerance", forbid=["tree_reduction"]).items():
        assert result.legal_families() == []
        assert f"no family of {op} can be made legal by a preservation setting; unforbid" in result.hint


def test_a_nondeterministic_rule_is_illegal_when_determinism_is_demanded(shipped_ruleset):
    rs = shipped_ruleset
    tree = dataclasses.replace(rs.rules["tree_reduction"], deterministic=False)
    rs = dataclasses.replace(rs, rules={**rs.rules, "tree_reduction": tree})
    strict = decide(rs, "deterministic")["row_max"]
    assert not strict.rules["tree_reduction"].legal
    assert ("deterministic", False) in strict.rules["tree_reduction"].relax
    assert "deterministic = False" in strict.hint
    assert decide(rs, "tolerance")["row_max"].rules["tree_reduction"].legal


def test_a_missing_property_makes_a_rule_illegal(shipped_ruleset):
    # welford needs welford_decomposable, which the atlas gives layernorm only.
    rs = shipped_ruleset
    decision = legality.decide_rule(rs.rules["welford"], rs.ops["rmsnorm"], rs,
                                    legality.Preservation("fast", rs.presets["fast"].axes, {}),
                                    legality.RuleChoice(frozenset(), None))
    assert not decision.legal
    assert "the atlas does not say it is" in decision.facts[0]
