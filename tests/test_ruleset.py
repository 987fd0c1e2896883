import tomllib

import pytest

from aicg.dtypes import DTYPES
from aicg.ops import OPERATORS
from aicg.semantics import ruleset


def test_shipped_rule_sets_are_consistent(repo, shipped_ruleset):
    rs = shipped_ruleset
    assert set(OPERATORS) <= set(rs.ops)     # the atlas also holds operators without kernels yet
    for name, op in rs.ops.items():
        assert bool(rs.families_of(name)) == (name in OPERATORS), f"operator {name}: families and mechanics disagree"
        assert set(op.reductions) <= set(rs.reductions) and set(op.functions) <= set(rs.functions)
    for fam in rs.families.values():
        assert set(fam.params) == set(ruleset.TEMPLATE_PARAMS)
        assert set(fam.rules) <= set(rs.rules)
        header = repo / "kernels" / fam.header
        assert header.is_file()
        assert f" {fam.function.split('::')[-1]}(" in header.read_text(), fam.function
    for preset in rs.presets.values():
        assert set(preset.axes) == set(rs.axes)
        assert set(DTYPES) <= set(preset.tolerance)


def test_family_fields_override_defaults(repo, shipped_ruleset):
    raw = tomllib.loads((repo / "rulesets" / "families.toml").read_text())
    defaults = raw.get("defaults", {})
    for name, fam in shipped_ruleset.families.items():
        mine = raw["families"][name]
        params = {**defaults.get("params", {}), **mine.get("params", {})}
        assert fam.params == {k: tuple(v) for k, v in params.items()}, name
        param_rules = mine.get("param_rules", defaults.get("param_rules", []))
        assert [vars(p) for p in fam.param_rules] == param_rules, name


def test_families_of_partitions_the_families(shipped_ruleset):
    rs = shipped_ruleset
    listed = [f.name for op in rs.ops for f in rs.families_of(op)]
    assert sorted(listed) == sorted(rs.families)


# (file, old text, new text, dotted key, what is expected)
BAD = [
    ("atlas.toml", "properties.associative = { holds = \"real\", ref = \"Goldberg (1991), What", "propertes.associative = { holds = \"real\", ref = \"Goldberg (1991), What",
     "reductions.sum.propertes", "a known key"),
    ("atlas.toml", "{ holds = \"real\", ref = \"Goldberg (1991), What", "{ holds = \"approx\", ref = \"Goldberg (1991), What",
     "reductions.sum.properties.associative.holds", "one of 'exact', 'real'"),
    ("atlas.toml", 'reductions = ["max"]', 'reductions = ["min"]', "ops.row_max.reductions", "one of 'max', 'sum'"),
    ("atlas.toml", "[ops.row_sum]", "[ops.row_sum", "(syntax)", "valid TOML"),
    ("families.toml", 'function = "aicg::softmax_online"\nrules = ["tree_reduction", "online_softmax", "libdevice_math"]',
     'function = "aicg::softmax_online"\nrules = ["tree_reduction", "online_sofmax"]',
     "families.softmax_online.rules", "one of 'atomics', 'fast_intrinsics'"),
    ("families.toml", 'function = "aicg::row_sum"\nrules = ["tree_reduction"]', 'function = "aicg::row_sum"\nrules = ["tree_reduction"]\nparams.block_size = [64]',
     "families.row_sum_tree.params.block_size", "a template parameter (threads, vec_bytes, topology, fast_exp, cache_packs)"),
    ("families.toml", 'dtypes = ["bfloat16", "float16"]', 'dtypes = ["bfloat16", "float8"]',
     "families.softmax_rounded_exps.dtypes", "one of 'bfloat16', 'float16', 'float32'"),
    ("families.toml", 'dtypes = ["bfloat16", "float16"]', 'dtypes = []',
     "families.softmax_rounded_exps.dtypes", "at least one element type"),
    ("families.toml", 'op = "row_max"', 'op = "row_min"', "families.row_max_tree.op", "one of 'add', 'attention'"),
    ("families.toml", 'function = "aicg::rmsnorm"\nrules = ["tree_reduction", "libdevice_math"]\nsweeps = 2',
     'function = "aicg::rmsnorm"\nrules = ["tree_reduction"]\nsweeps = "2"', "families.rmsnorm_tree.sweeps", "an integer"),
    ("families.toml", 'function = "aicg::rmsnorm"', 'function = "aicg::rmsnorm"\nthreads = [64]',
     "families.rmsnorm_tree.threads", "a known key"),
    ("families.toml", 'params.topology = ["warp", "block", "block_staged", "lanes4", "thread", "thread_rows8"]\n', "",
     "families.softmax_online.params.topology", "a list of values (here or in [defaults])"),
    ("families.toml", '{ param = "fast_exp", when = "true", rule = "fast_intrinsics" },\n  { param = "cache_packs", when = "true", rule = "register_staging" },\n  { param = "topology", when = "staged", rule = "shared_staging" },\n  { param = "topology", when = "prefetched", rule = "row_prefetch" },\n]\n\n[families.softmax_online]',
     '{ param = "fast_exp", when = "true", rule = "fast_intrinsic" },\n  { param = "cache_packs", when = "true", rule = "register_staging" },\n  { param = "topology", when = "staged", rule = "shared_staging" },\n  { param = "topology", when = "prefetched", rule = "row_prefetch" },\n]\n\n[families.softmax_online]',
     "families.softmax_twopass.param_rules[1].rule", "one of"),
    ("families.toml", '{ param = "fast_exp", when = "true", rule = "fast_intrinsics" },\n  { param = "cache_packs", when = "true", rule = "register_staging" },\n  { param = "topology", when = "staged", rule = "shared_staging" },\n  { param = "topology", when = "prefetched", rule = "row_prefetch" },\n]\n\n[families.softmax_online]',
     '{ param = "fast_exp", when = "always", rule = "fast_intrinsics" },\n  { param = "cache_packs", when = "true", rule = "register_staging" },\n  { param = "topology", when = "staged", rule = "shared_staging" },\n  { param = "topology", when = "prefetched", rule = "row_prefetch" },\n]\n\n[families.softmax_online]',
     "families.softmax_twopass.param_rules[1].when", "one of 'prefetched', 'staged', 'true', 'wider_than_element'"),
    ("families.toml", 'params.topology = ["warp", "block", "lanes4", "thread", "thread_rows8"]',
     'params.topology = ["warp", "block", "lanes4", "thread", "thread_rows8", "flat"]',
     "families.residual_rmsnorm_tree.params.topology",
     "a flat walk has no rows, so only an operator that atlas.toml states elementwise"),
    ("families.toml", 'timed_like = "softmax_twopass"\nparams.topology', 'timed_like = "softmax_online"\nparams.topology',
     "families.log_softmax_twopass.timed_like", "another family of 3 sweeps, itself timed by its own measurements"),
    ("families.toml", 'timed_like = "softmax_twopass"\nparams.topology', 'timed_like = "softmax_twopas"\nparams.topology',
     "families.log_softmax_twopass.timed_like", "another family of 3 sweeps"),
    ("families.toml", 'timed_like = "softmax_twopass"\nparams.topology', 'timed_like = "log_softmax_twopass"\nparams.topology',
     "families.log_softmax_twopass.timed_like", "another family of 3 sweeps"),
    ("families.toml", 'timed_like = "softmax_online"', 'timed_like = "log_softmax_twopass"',
     "families.log_softmax_online.timed_like", "another family of 2 sweeps"),
    ("rules.toml", 'requires.math = ["approximate"]', 'requires.maths = ["approximate"]',
     "rules.fast_intrinsics.requires.maths", "a preservation axis (order, deterministic, math, nan_inf, signed_zero, denormals)"),
    ("rules.toml", 'requires.math = ["approximate"]', 'requires.math = ["approx"]',
     "rules.fast_intrinsics.requires.math", "one of 'approximate', 'precise'"),
    ("rules.toml", 'acts_on = "op"\nneeds = ["welford_decomposable"]', 'acts_on = "ops"\nneeds = ["welford_decomposable"]',
     "rules.welford.acts_on", "one of 'functions', 'op', 'reductions'"),
    ("preservation.toml", 'order = "reference"\n', "", "presets.bitwise.order", "a string (the key is missing)"),
    ("preservation.toml", 'order = "reference"\n', 'order = "sorted"\n', "presets.bitwise.order", "one of"),
    ("preservation.toml", 'order = "reference"\n', 'order = "reference"\nspeed = "max"\n',
     "presets.bitwise.speed", "a known key"),
    ("preservation.toml", "tolerance.bfloat16 = { rtol = 0.0, atol = 0.0 }", "tolerance.bfloat16 = { rtol = 0.0 }",
     "presets.bitwise.tolerance.bfloat16.atol", "a number (the key is missing)"),
    ("preservation.toml", "failure_probability = 1e-6", "failure_probability = 1.5",
     "rounding.failure_probability", "a probability strictly between 0 and 1"),
    ("preservation.toml", "failure_probability = 1e-6", "", "rounding.failure_probability", "the key is missing"),
]


@pytest.mark.parametrize("file, old, new, key, expected", BAD, ids=[b[3] for b in BAD])
def test_bad_rule_sets(rules_dir, edit, raises_input_error, file, old, new, key, expected):
    edit(rules_dir / file, old, new)
    with raises_input_error(rules_dir / file, key, expected):
        ruleset.load(rules_dir)


def test_an_unknown_key_in_family_defaults(rules_dir, edit, raises_input_error):
    edit(rules_dir / "families.toml", "[defaults]\n", "[defaults]\nparam_rulez = []\n")
    with raises_input_error(rules_dir / "families.toml", "defaults.param_rulez", "a known key"):
        ruleset.load(rules_dir)


def test_a_family_param_of_the_wrong_element_type(rules_dir, edit, raises_input_error):
    edit(rules_dir / "families.toml", "params.threads = [128, 256, 512, 1024]", 'params.threads = ["128"]')
    with raises_input_error(rules_dir / "families.toml", "defaults.params.threads", "an array of"):
        ruleset.load(rules_dir)


def test_a_family_whose_rules_its_operator_cannot_meet_is_a_contradiction(rules_dir, edit, raises_input_error):
    edit(rules_dir / "families.toml", 'function = "aicg::row_sum"\nrules = ["tree_reduction"]',
         'function = "aicg::row_sum"\nrules = ["tree_reduction", "welford"]')
    with raises_input_error(rules_dir / "families.toml", "families.row_sum_tree.rules",
                            "welford needs operator row_sum to be welford_decomposable, which atlas.toml does not state"):
        ruleset.load(rules_dir)
