import pytest

from aicg import profile
from aicg.ops import OPERATORS

WORKLOAD = """[[workload]]
ops = ["softmax", "log_softmax", "row_sum", "row_max", "rmsnorm", "layernorm"]
dtypes = ["float32", "bfloat16", "float16"]
shapes = [[32768, 4096], [4096, 32768], [8192, 1000], [65536, 128]]
"""


@pytest.fixture
def default_profile(rules_dir):
    """An editable copy of rulesets/profiles/h200.toml."""
    path = rules_dir / "profiles" / "h200.toml"
    assert WORKLOAD in path.read_text()
    return path


@pytest.mark.parametrize("name", ["default", "bitwise", "deterministic", "fast"])
def test_shipped_profiles_load(repo, shipped_ruleset, name):
    p = profile.load(repo / "rulesets" / "profiles" / f"{name}.toml", shipped_ruleset, repo / "hwdb")
    assert (repo / "hwdb" / f"{p.target}.toml").is_file()
    assert p.preservation.axes == shipped_ruleset.presets[p.preservation.preset].axes
    assert p.workload and set(p.workload) <= set(OPERATORS)
    for w in p.workload.values():
        assert w.dtypes and w.shapes and set(w.dtypes) <= set(p.preservation.tolerance)


def test_the_files_settings_arrive(repo, shipped_ruleset):
    def load(name):
        return profile.load(repo / "rulesets" / "profiles" / f"{name}.toml", shipped_ruleset, repo / "hwdb")
    deterministic = load("deterministic")
    assert deterministic.name == "h200-deterministic" and deterministic.target == "nvidia-h200"
    assert deterministic.choice.forbid == {"fast_intrinsics"} and deterministic.choice.select is None
    assert deterministic.candidates_per_family == 4
    fast = load("fast")
    assert fast.preservation.axes["math"] == "approximate"
    assert set(fast.workload) == {"softmax", "rmsnorm", "layernorm"}
    assert fast.workload["softmax"].shapes == ((32768, 4096), (4096, 32768), (8192, 1000))


def test_overrides_and_defaults(default_profile, edit, shipped_ruleset, repo):
    edit(default_profile, 'name = "h200-tolerance"\n', "")
    edit(default_profile, "[rules]\nforbid = []\n",
         '[rules]\nforbid = ["welford"]\nselect = ["tree_reduction", "welford"]\n\n'
         '[preservation]\norder = "fixed"\ntolerance.float32 = { rtol = 1e-3, atol = 0.0 }\n')
    p = profile.load(default_profile, shipped_ruleset, repo / "hwdb")
    assert p.name == "h200"                                      # the file's stem
    assert p.preservation.preset == "tolerance"
    assert p.preservation.axes == {**shipped_ruleset.presets["tolerance"].axes, "order": "fixed"}
    assert p.preservation.tolerance["float32"] == (1e-3, 0.0)
    assert p.preservation.tolerance["bfloat16"] == shipped_ruleset.presets["tolerance"].tolerance["bfloat16"]
    assert p.choice.forbid == {"welford"} and p.choice.select == {"tree_reduction", "welford"}
    assert (p.validation_trials, p.timing_repetitions) == (2, 20)


def test_workload_entries_merge_per_operator(default_profile, edit, shipped_ruleset, repo):
    edit(default_profile, WORKLOAD, WORKLOAD + '\n[[workload]]\nops = ["softmax"]\ndtypes = ["float32"]\n'
         'shapes = [[8192, 1000], [7, 9]]\n')
    softmax = profile.load(default_profile, shipped_ruleset, repo / "hwdb").workload["softmax"]
    assert softmax.dtypes == ("float32", "bfloat16", "float16")
    assert softmax.shapes == ((32768, 4096), (4096, 32768), (8192, 1000), (65536, 128), (7, 9))


# (old text, new text, dotted key, what is expected)
BAD = [
    ('preservation = "tolerance"\n', 'preservation = "tolerance"\ntargte = "h200"\n', "instance.targte", "a known key"),
    ('"softmax", "log_softmax"', '"sofmax", "log_softmax"', "workload[0].ops", "one of 'bias_gelu_residual', 'layernorm'"),
    ("forbid = []", 'forbid = ["tree_reductoin"]', "rules.forbid", "one of 'atomics', 'fast_intrinsics'"),
    ("forbid = []", 'select = ["onlinesoftmax"]', "rules.select", "one of 'atomics', 'fast_intrinsics'"),
    ("forbid = []", 'forbid = "welford"', "rules.forbid", "an array"),
    ('dtypes = ["float32", "bfloat16", "float16"]', 'dtypes = ["float32", "float64"]', "workload[0].dtypes",
     "one of 'bfloat16', 'float16', 'float32'"),
    ('target = "nvidia-h200"', 'target = "h300"', "instance.target", "a hwdb entry in"),
    ('preservation = "tolerance"', 'preservation = "strict"', "instance.preservation", "one of 'bitwise'"),
    ('name = "h200-tolerance"', 'name = "../escape"', "instance.name", "a plain folder name"),
    ("[65536, 128]", "[0, 5]", "workload[0].shapes", "[rows, cols] pairs of positive integers"),
    ("[65536, 128]", "[3]", "workload[0].shapes", "[rows, cols] pairs of positive integers"),
    ("[65536, 128]", "[-1, 4]", "workload[0].shapes", "[rows, cols] pairs of positive integers"),
    ("[65536, 128]", "[4, true]", "workload[0].shapes", "[rows, cols] pairs of positive integers"),
    ("[65536, 128]", "[4, 2.5]", "workload[0].shapes", "[rows, cols] pairs of positive integers"),
    ("[65536, 128]", "5", "workload[0].shapes", "an array of"),
    ("candidates_per_family = 4", "candidates_per_family = 0", "plan.candidates_per_family", "an integer >= 1"),
    ("candidates_per_family = 4", "candidate_per_family = 4", "plan.candidate_per_family", "a known key"),
    ('dtypes = ["float32", "bfloat16", "float16"]\n', 'dtypes = ["float32", "bfloat16", "float16"]\nshape = [[1, 2]]\n',
     "workload[0].shape", "a known key"),
    ("[rules]\n", '[preservation]\norder = "sorted"\n\n[rules]\n', "preservation.order", "one of 'any'"),
    ("[rules]\n", '[preservation]\nspeed = "max"\n\n[rules]\n', "preservation.speed", "a known key"),
    ("[rules]\n", "[planner]\nx = 1\n\n[rules]\n", "planner", "a known key"),
    (WORKLOAD, "", "workload", "an array of [[workload]] entries (the key is missing; a profile of matrix "
                               "multiplies alone has [[matmul]] entries instead)"),
    ("[plan]", "[plan", "(syntax)", "valid TOML"),
]


@pytest.mark.parametrize("old, new, key, expected", BAD, ids=[f"{b[2]}:{b[1][:20]}" for b in BAD])
def test_bad_profiles(default_profile, edit, raises_input_error, shipped_ruleset, hwdb_dir, old, new, key, expected):
    edit(default_profile, old, new)
    with raises_input_error(default_profile, key, expected):
        profile.load(default_profile, shipped_ruleset, hwdb_dir)


def test_an_empty_workload(default_profile, edit, raises_input_error, shipped_ruleset, hwdb_dir):
    edit(default_profile, WORKLOAD, "")
    edit(default_profile, "[instance]\n", "workload = []\n\n[instance]\n")
    with raises_input_error(default_profile, "workload", "at least one [[workload]] entry"):
        profile.load(default_profile, shipped_ruleset, hwdb_dir)


def test_a_target_missing_from_this_hwdb(default_profile, raises_input_error, shipped_ruleset, hwdb_dir):
    (hwdb_dir / "nvidia-h200.toml").unlink()
    others = ", ".join(sorted(p.stem for p in hwdb_dir.glob("*.toml")))
    with raises_input_error(default_profile, "instance.target", f"(one of: {others})"):
        profile.load(default_profile, shipped_ruleset, hwdb_dir)


def test_an_empty_shapes_list(default_profile, edit, raises_input_error, shipped_ruleset, hwdb_dir):
    edit(default_profile, "shapes = [[32768, 4096], [4096, 32768], [8192, 1000], [65536, 128]]", "shapes = []")
    with raises_input_error(default_profile, "workload[0].shapes", "at least one"):
        profile.load(default_profile, shipped_ruleset, hwdb_dir)
