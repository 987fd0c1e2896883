"""The matrix family in the build graph, on a machine without a GPU: `[[matmul]]` profile entries
and their errors, the legality of the matrix rules per preservation level (rulesets/matrix.toml,
decided by aicg/semantics/legality.py), the plan's prior and ranking, codegen and NVRTC of the
planned candidates, and a whole `doit build` of rulesets/profiles/matmul.toml: a manifest whose
matrix kernels are packaged and UNVALIDATED, a report that says so, and validations put in the
store (as a GPU node's build leaves them) making them valid."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from aicg import cas, digest, hw, profile
from aicg.matrix import accuracy, build, codegen, dispatch, plan, prior, semantics, space
from aicg.matrix.problem import Problem
from aicg.matrix.space import Epilogue
from aicg.matrix.templates import RULES, GpuLimits
from aicg.matrix.workload import MatmulClass
from aicg.semantics import legality
from aicg.semantics import ruleset as ruleset_loader
from aicg.tasks import graph, step
from doit_project import REPO, doit, make_project

MATMUL = "profile=rulesets/profiles/matmul.toml"
FUSED = Epilogue("gelu_erf", bias=True, residual=True)

PROFILE = """[instance]
name = "mm"
target = "h100-sxm"
preservation = "tolerance"

[plan]
candidates_per_family = 2

[[matmul]]
dtypes = ["bfloat16"]
shapes = [[1, 4096, 4096], [4096, 4096, 4096]]
"""


def write_profile(tmp_path, body: str, head: str = PROFILE.split("[[matmul]]")[0]):
    path = tmp_path / "mm.toml"
    path.write_text(head + body)
    return path


def load_profile(path):
    return profile.load(path, ruleset_loader.load(REPO / "rulesets"), REPO / "hwdb")


# --- the profile's [[matmul]] entries ---------------------------------------------------

def test_the_shipped_profile_has_the_llm_projections_and_the_fused_case(shipped_ruleset, repo):
    prof = profile.load(repo / "rulesets/profiles/matmul.toml", shipped_ruleset, repo / "hwdb")
    assert prof.workload == {} and prof.target == "h100-sxm"
    by_name = {c.name: c for c in prof.matmul}
    assert set(by_name) == {"matmul.bfloat16.kk.plain", "matmul.bfloat16.kk.bias+gelu_erf+residual"}
    plain = by_name["matmul.bfloat16.kk.plain"]
    assert {m for m, _, _ in plain.shapes} == {1, 16, 128, 4096}
    assert {(n, k) for _, n, k in plain.shapes} == {(6144, 4096), (28672, 4096), (4096, 14336)}
    assert by_name["matmul.bfloat16.kk.bias+gelu_erf+residual"].shapes == ((8192, 4096, 4096),)


def test_entries_of_one_class_merge_and_dtypes_make_classes(tmp_path):
    path = write_profile(tmp_path, """[[matmul]]
dtypes = ["bfloat16", "float16"]
shapes = [[1, 64, 64], [2, 64, 64]]

[[matmul]]
dtypes = ["bfloat16"]
a_major = "k"
shapes = [[2, 64, 64], [3, 64, 64]]

[[matmul]]
dtypes = ["bfloat16"]
b_major = "mn"
epilogue = { activation = "silu" }
shapes = [[4, 64, 64]]
""")
    classes = {c.name: c for c in load_profile(path).matmul}
    assert classes["matmul.bfloat16.kk.plain"].shapes == ((1, 64, 64), (2, 64, 64), (3, 64, 64))
    assert classes["matmul.float16.kk.plain"].shapes == ((1, 64, 64), (2, 64, 64))
    assert classes["matmul.bfloat16.kmn.silu"].epilogue == Epilogue("silu")


@pytest.mark.parametrize("body, key, expected", [
    ('dtypes = ["float32"]\nshapes = [[1, 2, 3]]', "matmul[0].dtypes", "one of 'bfloat16', 'float16'"),
    ('dtypes = []\nshapes = [[1, 2, 3]]', "matmul[0].dtypes", "at least one of bfloat16, float16"),
    ('dtypes = ["bfloat16"]\na_major = "row"\nshapes = [[1, 2, 3]]', "matmul[0].a_major", "one of 'k', 'mn'"),
    ('dtypes = ["bfloat16"]\nshapes = [[1, 2]]', "matmul[0].shapes", "[M, N, K] triples of positive integers"),
    ('dtypes = ["bfloat16"]\nshapes = [[0, 2, 3]]', "matmul[0].shapes", "[M, N, K] triples of positive integers"),
    ('dtypes = ["bfloat16"]\nshapes = []', "matmul[0].shapes", "at least one [M, N, K] triple"),
    ('dtypes = ["bfloat16"]\nshapes = [[1, 2, 3]]\nepilogue = "gelu"', "matmul[0].epilogue", "a table"),
    ('dtypes = ["bfloat16"]\nshapes = [[1, 2, 3]]\nepilogue = { activation = "relu" }', "matmul[0].epilogue.activation",
     "one of 'gelu_erf', 'gelu_tanh', 'none', 'silu'"),
    ('dtypes = ["bfloat16"]\nshapes = [[1, 2, 3]]\nepilogue = { bias = "yes" }', "matmul[0].epilogue.bias",
     "true or false"),
    ('dtypes = ["bfloat16"]\nshapes = [[1, 2, 3]]\nepilogue = { gelu = true }', "matmul[0].epilogue.gelu", "a known key"),
    ('dtypes = ["bfloat16"]\nshapes = [[1, 2, 3]]\nlayout = "kk"', "matmul[0].layout", "a known key"),
    ('dtypes = ["bfloat16"]\nshapes = [[200000, 200000, 200000]]', "matmul[0].shapes",
     "shapes whose operands fit the memory of h100-sxm"),
    ('dtypes = ["bfloat16"]\nshapes = [' + ", ".join(f"[{m}, 8, 8]" for m in range(1, 66)) + "]",
     "matmul[0].shapes", "at most 64 distinct shapes per dtype, layouts and epilogue"),
])
def test_a_bad_matmul_entry_is_an_input_error_naming_file_and_key(tmp_path, raises_input_error, body, key, expected):
    path = write_profile(tmp_path, "[[matmul]]\n" + body + "\n")
    with raises_input_error(path, key, expected):
        load_profile(path)


def test_a_profile_with_neither_rows_nor_matrix_multiplies_is_an_error(tmp_path, raises_input_error):
    path = write_profile(tmp_path, "")
    with raises_input_error(path, "workload", "an array of [[workload]] entries (the key is missing; a profile of "
                                              "matrix multiplies alone has [[matmul]] entries instead)"):
        load_profile(path)


def test_a_matrix_dtype_without_a_tolerance_is_an_error(tmp_path, raises_input_error, rules_dir):
    preservation = rules_dir / "preservation.toml"
    text = preservation.read_text()
    preservation.write_text(text.replace("tolerance.float16 = { rtol = 1e-3, atol = 1e-5 }\n\n[presets.fast]",
                                         "\n[presets.fast]"))
    path = write_profile(tmp_path, '[[matmul]]\ndtypes = ["float16"]\nshapes = [[1, 8, 8]]\n')
    with raises_input_error(path, "preservation.tolerance.float16", "a tolerance for float16 (used by matmul)"):
        profile.load(path, ruleset_loader.load(rules_dir), REPO / "hwdb")


# --- legality -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sem():
    return semantics.load(REPO / "rulesets", ruleset_loader.load(REPO / "rulesets"))


def preset(sem, name):
    p = sem.ruleset.presets[name]
    return legality.Preservation(name, p.axes, p.tolerance)


EVERYTHING = legality.RuleChoice(frozenset(), None)


def test_under_tolerance_every_family_and_the_fused_epilogue_are_legal(sem):
    decided = semantics.decide(sem, "bfloat16", FUSED, preset(sem, "tolerance"), EVERYTHING)
    assert set(decided.usable) == {"matmul_wgmma", "matmul_mma", "matmul_gemv"} and not decided.blocked
    rules = decided.legality.rules
    assert rules["epilogue_fusion"].legal and rules["libdevice_math"].legal and rules["split_k"].legal
    # the class's decision names the functions its activation evaluates, and no others
    subjects = {f["subject"] for f in rules["libdevice_math"].facts if f.kind == "property"}
    assert subjects == {"function erf of matmul"}


def test_bitwise_rules_out_every_tensor_core_family_and_says_what_would_allow_them(sem):
    decided = semantics.decide(sem, "bfloat16", Epilogue(), preset(sem, "bitwise"), EVERYTHING)
    assert decided.usable == ()
    hint = decided.legality.hint
    assert "tensor_core_accumulation" in hint and "Set order = 'fixed'" in hint
    assert not decided.legality.rules["tensor_core_accumulation"].legal


def test_split_k_with_a_fixed_reduction_is_deterministic_and_by_atomics_is_not(sem):
    op = sem.ruleset.ops["matmul"]
    for name, legal in (("deterministic", False), ("tolerance", True)):
        d = legality.decide_rule(sem.ruleset.rules["split_k_atomic"], op, "bfloat16", sem.ruleset, preset(sem, name),
                                 EVERYTHING)
        assert d.legal is legal, name
        assert legality.decide_rule(sem.ruleset.rules["split_k"], op, "bfloat16", sem.ruleset, preset(sem, name),
                                    EVERYTHING).legal
    d = legality.decide_rule(sem.ruleset.rules["split_k_atomic"], op, "bfloat16", sem.ruleset,
                             preset(sem, "deterministic"), EVERYTHING)
    assert {f.kind for f in d.blocking()} == {"nondeterministic", "axis"}


def test_a_forbidden_fusion_blocks_only_the_fused_classes(sem):
    forbid = legality.RuleChoice(frozenset({"epilogue_fusion"}), None)
    fused = semantics.decide(sem, "bfloat16", FUSED, preset(sem, "tolerance"), forbid)
    plain = semantics.decide(sem, "bfloat16", Epilogue(), preset(sem, "tolerance"), forbid)
    assert fused.usable == () and all("forbids epilogue_fusion" in why for why in fused.blocked.values())
    assert set(plain.usable) == {"matmul_wgmma", "matmul_mma", "matmul_gemv"}


def test_a_split_k_knob_brings_its_rule_in(sem):
    tpl = space.templates()["wgmma"]
    family = sem.family_of("wgmma")
    base = dict(tpl.tried[0])
    one = space.realisation("wgmma", "bfloat16", "k", "k", FUSED, **base)
    assert "split_k" not in family.rules_of(one) and "epilogue_fusion" in family.rules_of(one)
    if "split_k" in tpl.knobs and max(tpl.knobs["split_k"]) > 1:
        split = space.realisation("wgmma", "bfloat16", "k", "k", Epilogue(), **dict(base, split_k=max(tpl.knobs["split_k"])))
        assert family.rules_of(split) == ("tensor_core_accumulation", "split_k")


def test_a_handoff_store_brings_its_rounding_in_and_only_the_reference_order_refuses_it(sem):
    family = sem.family_of("wgmma")
    base = dict(space.templates()["wgmma"].tried[0], stages=3)
    handoff = space.realisation("wgmma", "bfloat16", "k", "k", FUSED, **dict(base, store="handoff"))
    staged = space.realisation("wgmma", "bfloat16", "k", "k", FUSED, **dict(base, store="staged"))
    assert "rounded_handoff" in family.rules_of(handoff) and "rounded_handoff" not in family.rules_of(staged)
    op, rule = sem.ruleset.ops["matmul"], sem.ruleset.rules["rounded_handoff"]
    for name, legal in (("tolerance", True), ("deterministic", True), ("bitwise", False)):
        assert legality.decide_rule(rule, op, "bfloat16", sem.ruleset, preset(sem, name), EVERYTHING).legal is legal
    # one rounding to the output type more, times the activation's slope, in the bound the planner checks
    from aicg.matrix import accuracy
    extra = accuracy.relative_bound("bfloat16", 4096, 1, FUSED, True) - accuracy.relative_bound("bfloat16", 4096, 1, FUSED)
    assert extra == pytest.approx(2.0**-8 * 1.13)
    assert accuracy.longest_k("float16", 1, FUSED, 1e-3, True) < accuracy.longest_k("float16", 1, FUSED, 1e-3)


def test_the_row_families_read_the_rule_sets_they_always_read(sem):
    base = ruleset_loader.load(REPO / "rulesets")
    for op in ("softmax", "rmsnorm", "layernorm"):
        assert sem.ruleset.ops[op].as_record(sem.ruleset) == base.ops[op].as_record(base)
        assert [f.as_record() for f in sem.ruleset.families_of(op)] == [f.as_record() for f in base.families_of(op)]
    assert {n: r.as_record() for n, r in base.rules.items()} == \
        {n: r.as_record() for n, r in sem.ruleset.rules.items() if n in base.rules}


@pytest.mark.parametrize("old, new, key, expected", [
    ("[rules.epilogue_fusion]", "[rules.fusion]", "rules.fusion", "a rule name not already in rules.toml"),
    ('{ param = "split_k", when = "above_one"', '{ param = "tiles", when = "above_one"',
     "families.matmul_wgmma.param_rules[0].param", "one of"),
    ('template = "gemv"', 'template = "wgmma"', "families.matmul_gemv.template", "a template no other family realises"),
    ('[activations.silu]\nfunctions = ["exp", "div"]', '[activations.silu]\nfunctions = ["cosh"]',
     "activations.silu.functions", "one of"),
])
def test_a_bad_matrix_rule_file_is_an_input_error(rules_dir, edit, raises_input_error, old, new, key, expected):
    path = edit(rules_dir / "matrix.toml", old, new)
    with raises_input_error(path, key, expected):
        semantics.load(rules_dir, ruleset_loader.load(rules_dir))


# --- the prior and the plan -----------------------------------------------------------------

def hardware(target):
    return hw.load(REPO / "hwdb" / f"{target}.toml")


@pytest.mark.parametrize("target", sorted(p.stem for p in (REPO / "hwdb").glob("*.toml")))
def test_every_hwdb_entry_gives_the_matrix_prior_its_inputs(target):
    found = prior.inputs(hardware(target))
    assert all(i.value > 0 and i.source for i in found.values())
    measured = any(f.source == "measured" for f in hardware(target).facts.values())
    assert found["wgmma_flops.bfloat16"].source.startswith("measured" if measured else "datasheet")


def test_the_prior_counts_whole_waves_of_tiles():
    hw_values = prior.values(prior.inputs(hardware("h100-sxm")))
    real = space.realisation("wgmma", "bfloat16", "k", "k", Epilogue(), **space.templates()["wgmma"].tried[0])
    bm, bn = real.knob("block_m"), real.knob("block_n")
    one_wave = Problem(bm * 132, bn, 8192)
    two_waves = Problem(bm * 132 + 1, bn, 8192)
    a, b = prior.terms(real, one_wave, hw_values), prior.terms(real, two_waves, hw_values)
    assert 1.9 < b.compute / a.compute < 2.1


def test_the_prior_reads_the_decode_kernels_uneven_waves_and_the_even_spreads_full_one():
    """448 CTAs of 64 columns on 132 SMs leave the busiest SMs 4 where the average is 3.39: the splits'
    weight read is slowed by that share; the even spread's 396 CTAs (3 an SM) are not, and pay the
    partial sums of the blocks they share instead."""
    hw_values = prior.values(prior.inputs(hardware("h100-sxm")))
    even_knobs = next(k for k in space.templates()["gemv"].tried if k["spread"] == "even" and not k["ring"])
    even = space.realisation("gemv", "bfloat16", "k", "k", Epilogue(), **even_knobs)
    splits = space.realisation("gemv", "bfloat16", "k", "k", Epilogue(), **dict(even_knobs, spread="splits"))
    wide = Problem(16, 28672, 4096)
    ctas = RULES["gemv"].geometry(splits, wide, 132, None).grid
    assert ctas == (448, 1, 1)
    a, b = prior.terms(splits, wide, hw_values), prior.terms(even, wide, hw_values)
    assert b.dram == pytest.approx(a.dram * (448 / 132) / 4, rel=1e-9)
    assert a.reduction == 0 < b.reduction < 0.05 * b.dram
    assert b.seconds < a.seconds
    assert prior.modelled_key(even) != prior.modelled_key(splits)


def plan_for(target, cls, preset_name="tolerance", per_family=2):
    sem = semantics.load(REPO / "rulesets", ruleset_loader.load(REPO / "rulesets"))
    h = hardware(target)
    pres = preset(sem, preset_name)
    decided = semantics.decide(sem, cls.dtype, cls.epilogue, pres, EVERYTHING)
    return plan.plan_class(cls, sem, decided, prior.values(prior.inputs(h)), GpuLimits.of_hardware(h),
                           pres.tolerance[cls.dtype][0], per_family)


def test_on_the_h100_decode_is_planned_with_gemv_prefill_led_by_wgmma_and_mma_is_left_out():
    cls = MatmulClass("bfloat16", "k", "k", Epilogue(), ((1, 4096, 4096), (16, 4096, 14336), (4096, 6144, 4096)))
    planned = plan_for("h100-sxm", cls)
    prefill = min((c for c in planned.candidates if c.serves(2)), key=lambda c: c.predicted_seconds[2])
    assert prefill.template == "wgmma"
    # the decode kernel is sent to the device for the decode shapes beside wgmma's smaller tiles: the
    # model alone cannot tell them apart by more than its error, the device's timing does
    assert all(any(c.template == "gemv" and c.serves(i) for c in planned.candidates) for i in (0, 1))
    assert {c.template for c in planned.candidates} == {"gemv", "wgmma"}
    assert any(r["family"] == "matmul_mma" and r["by"] == "prior" for r in planned.rejected)
    limits = GpuLimits.of_hardware(hardware("h100-sxm"))
    for c in planned.candidates:
        assert not RULES[c.template].violations(c.real, limits)
        assert c.id == plan.candidate_id(c.real) and c.rules[0] == "tensor_core_accumulation"
    assert len([c for c in planned.candidates if c.template == "wgmma"]) == 2   # candidates_per_family


def test_on_an_a100_there_is_no_wgmma_and_mma_serves_the_prefill():
    cls = MatmulClass("float16", "k", "mn", FUSED, ((8192, 4096, 4096),))
    planned = plan_for("a100-sxm4-80gb", cls)
    assert {c.template for c in planned.candidates} == {"mma"}
    assert any(r["family"] == "matmul_wgmma" and r["by"] == "target" for r in planned.rejected)


def test_a_depth_past_the_accuracy_bound_is_served_by_no_realisation():
    rtol = 1e-3     # float16's under tolerance
    longest = accuracy.longest_k("float16", 1, Epilogue(), rtol)
    assert accuracy.keeps("float16", longest, 1, Epilogue(), rtol)
    assert not accuracy.keeps("float16", longest + 1, 1, Epilogue(), rtol)
    assert 60000 < longest < 70000
    cls = MatmulClass("float16", "k", "k", Epilogue(), ((256, 256, 1024), (256, 256, 4 * longest)))
    planned = plan_for("h100-sxm", cls)
    assert planned.candidates and not any(c.serves(1) for c in planned.candidates)
    assert [r["shape"] for r in planned.rejected if r["by"] == "coverage"] == [[256, 256, 4 * longest]]


def test_a_shape_only_the_element_wise_copies_take_is_still_served():
    cls = MatmulClass("bfloat16", "k", "k", Epilogue(), ((100, 100, 100), (101, 99, 97)))   # K odd: no 16-byte rows
    planned = plan_for("a100-sxm4-80gb", cls)
    serving = [c for c in planned.candidates if c.serves(1)]
    assert serving and all(c.template == "mma" and not c.real.knob("aligned") for c in serving)


# --- codegen and NVRTC of planned candidates ---------------------------------------------------

def test_the_planned_sm80_candidates_compile_with_their_report():
    cls = MatmulClass("bfloat16", "k", "k", FUSED, ((8, 1024, 1024), (2048, 1024, 1024)))
    planned = plan_for("a100-sxm4-80gb", cls, per_family=1)
    assert {c.template for c in planned.candidates} == {"mma", "gemv"}
    for cand in planned.candidates:
        arch = build.arch_for(cand.real, (8, 0))
        assert arch == "sm_80"
        built = build.compile_source(cand.real, codegen.source(cand.real), f"{cand.id}.cu",
                                     build.headers(cand.real), arch)
        assert built.cubin and built.report["registers"] > 0 and build.report_problems(built.report) == []


# --- the whole build, without a GPU ------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The matmul profile built without a GPU and without the H100's record of it: every kernel
    unvalidated (tests/test_default_record.py builds it with the record)."""
    project = make_project(tmp_path_factory.mktemp("matmul"))
    record = project / "hwdb" / "h100-sxm.validations.jsonl"
    record.write_text("".join(line for line in record.read_text().splitlines(keepends=True)
                              if '"instance":"h100-matmul"' not in line))
    run = doit(project, "build", MATMUL)
    assert run.code == 0, run.output
    return project, run


def test_a_cpu_build_packages_every_class_unvalidated_and_says_so(built):
    project, run = built
    kinds = {name.split(":")[0] for name in run.executed}
    assert kinds == {"hw", "legality", "plan", "codegen", "compile", "validate", "select", "package"}
    compiled = [n for n in run.executed if n.startswith("compile:")]
    assert compiled and all(n.startswith("compile:matmul.") for n in compiled)
    root = project / "build/h100-matmul"
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["kernels"] == {} and manifest["matrix"]["arch"] == "sm_90a"
    classes = manifest["matrix"]["classes"]
    assert set(classes) == {"matmul.bfloat16.kk.plain", "matmul.bfloat16.kk.bias+gelu_erf+residual"}
    for entry in classes.values():
        assert len(entry["dispatch"]) == len(entry["shapes"])
        assert {d["status"] for d in entry["dispatch"]} == {"unvalidated"}
        for cand, k in entry["kernels"].items():
            assert k["validation"] == "unvalidated"
            cubin = (root / k["cubin"]).read_bytes()
            assert digest.of_bytes(cubin) == k["cubin_digest"]
            assert k["resources"]["registers"] > 0 and not k["resources"]["warnings"]
    # unvalidated, each shape goes to the candidate the (calibrated) prior predicts fastest there
    planned = {c["name"]: c for c in json.loads((root / "plan/matmul.json").read_text())["classes"]}
    for name, entry in classes.items():
        for d in entry["dispatch"]:
            i = entry["shapes"].index([d["m"], d["n"], d["k"]])
            serving = [c for c in planned[name]["candidates"] if c["predicted_seconds"][i] is not None]
            assert d["candidate"] == min(serving, key=lambda c: c["predicted_seconds"][i])["id"]
    report = (root / "report.md").read_text()
    assert "## Matrix multiplies" in report and "UNVALIDATED" in report and "epilogue_fusion" in report
    outcome = json.loads(next((root / "validation").glob("*.json")).read_text())
    assert outcome == {"status": "unvalidated", "reason": "no GPU on this machine"}


def test_a_second_matmul_build_runs_nothing(built):
    project, _ = built
    run = doit(project, "build", MATMUL)
    assert run.code == 0 and run.executed == [] and run.compilations == 0


def test_explain_decides_the_matrix_families(built):
    project, _ = built
    run = doit(project, "explain", "op=matmul", "dtype=bfloat16", MATMUL)
    assert run.code == 0, run.output
    for text in ("+ matmul_wgmma", "+ matmul_gemv", "+ epilogue_fusion", "+ tensor_core_accumulation",
                 "wgmma_flops.bfloat16"):
        assert text in run.output, text


def test_a_bitwise_matmul_profile_fails_in_its_legality_step_with_the_hint(tmp_path):
    project = make_project(tmp_path / "p")
    text = (REPO / "rulesets/profiles/matmul.toml").read_text().replace('preservation = "tolerance"',
                                                                        'preservation = "bitwise"')
    (project / "rulesets/profiles/bitwise_mm.toml").write_text(text)
    run = doit(project, "build", "profile=rulesets/profiles/bitwise_mm.toml")
    assert run.code != 0
    assert "matmul[0]: expected a dtype and epilogue some matrix family may compute" in run.output
    assert "Set order = 'fixed'" in run.output and run.compilations == 0


@pytest.fixture(scope="module")
def validated(built, tmp_path_factory):
    """A copy of the CPU build whose store holds a passing validation of every matrix candidate, as a GPU
    node's build leaves them (invented checks and times: the tests are about where they go), rebuilt:
    (project, the run, shape -> the least time put there)."""
    project = shutil.copytree(built[0], tmp_path_factory.mktemp("validated") / "p")
    instance = graph.load_instance(graph.Layout(project), project / "rulesets/profiles/matmul.toml", project / "build")
    local = instance.env.store.local
    fastest = {}
    for s in (x for x in instance.steps if x.kind == "validate"):
        cand = s.name.split(":", 1)[1]
        shapes = s.reads["shapes"]
        times = [1e-3 / (1 + ("gemv" in cand) * (m <= 16) + ("s3" in cand)) for m, _, _ in shapes]
        outcome = {"status": "passed", "reason": None, "device": instance.hardware.name,
                   "checks": [{"problem": "p", "shape": list(shapes[0]), "passed": True}],
                   "timings": [{"shape": list(sh), "median_seconds": t} for sh, t in zip(shapes, times)]}
        for sh, t in zip(shapes, times):
            fastest[tuple(sh)] = min(t, fastest.get(tuple(sh), math.inf))
        local.put_action(cas.ActionEntry(step.key(s, instance.env), "validate",
                                         {s.targets[0]: local.put_blob(graph.to_json(outcome))}))
    shutil.rmtree(project / "build")
    run = doit(project, "build", MATMUL)
    assert run.code == 0, run.output
    return project, run, fastest, instance.hardware.name


def check_valid(project, fastest, gpu):
    manifest = json.loads((project / "build/h100-matmul/manifest.json").read_text())
    for entry in manifest["matrix"]["classes"].values():
        assert entry["status"] == "passed"
        for d in entry["dispatch"]:
            assert d["status"] == "passed" and d["measured_seconds"] == fastest[(d["m"], d["n"], d["k"])]
            assert entry["kernels"][d["candidate"]]["validated_on"] == gpu
    assert "UNVALIDATED" not in (project / "build/h100-matmul/report.md").read_text()
    return manifest


def test_validations_in_the_store_make_the_matrix_kernels_valid_and_the_fastest_wins(validated):
    project, run, fastest, gpu = validated
    assert run.compilations == 0
    manifest = check_valid(project, fastest, gpu)
    # the report's rate against the tensor cores' (the H100's measured wgmma rate)
    peak = manifest["matrix"]["tensor_peak_flops"]["bfloat16"]
    assert peak["value"] == hardware("h100-sxm").fact("wgmma_bf16_flops") and peak["source"].startswith("measured")
    report = (project / "build/h100-matmul/report.md").read_text()
    assert "of peak" in report and f"{peak['value'] / 1e12:.1f} TFLOP/s" in report
    d = manifest["matrix"]["classes"]["matmul.bfloat16.kk.plain"]["dispatch"][-1]
    share = 2 * d["m"] * d["n"] * d["k"] / d["measured_seconds"] / peak["value"]
    assert f" {share:.0%}" in report
    # what the runtime needs at shapes the build did not time: the class's rtol and the prior's inputs
    prof = profile.load(project / "rulesets/profiles/matmul.toml", ruleset_loader.load(project / "rulesets"),
                        project / "hwdb")
    kernels = dispatch.MatrixKernels(project / "build/h100-matmul", manifest["matrix"], allow_unvalidated=False)
    plain = kernels.classes[("bfloat16", "k", "k", Epilogue())]
    assert plain.rtol == prof.preservation.tolerance["bfloat16"][0]
    assert manifest["matrix"]["model_inputs"] == prior.values(prior.inputs(hardware("h100-sxm")))
    pointers = {"a": 1 << 20, "b": 1 << 20, "c": 1 << 30}
    kernel, why = plain.choose(Problem(300, 4096, 4096), pointers)
    ranked = plain.ranked(Problem(300, 4096, 4096))
    passed_over = ranked[:ranked.index(kernel.candidate)]   # estimated faster, but unable to take 300 rows
    assert kernel.candidate in plain.usable and kernel.realisation.template == "wgmma"
    assert all(c.startswith("matmul.gemv.") for c in passed_over) and len(why) == len(passed_over)


def test_a_machine_without_a_gpu_takes_the_matrix_validations_from_the_record(validated, tmp_path):
    project, _, fastest, gpu = validated
    run = doit(project, "record", MATMUL)
    assert run.code == 0, run.output
    record_file = project / "hwdb/h100-sxm.validations.jsonl"
    lines = [json.loads(line) for line in record_file.read_text().splitlines()]
    mine = [line for line in lines if line["instance"] == "h100-matmul"]
    assert mine and all(line["step"].startswith("validate:matmul.") and line["gpu"] == gpu for line in mine)
    clone = make_project(tmp_path / "clone")
    shutil.copy(record_file, clone / "hwdb")
    run = doit(clone, "build", MATMUL)
    assert run.code == 0, run.output
    assert f"{len(mine)} validations from the record" in run.output
    assert json.loads((clone / "build/h100-matmul/manifest.json").read_bytes()) == \
        json.loads((project / "build/h100-matmul/manifest.json").read_bytes())
    check_valid(clone, fastest, gpu)


def test_the_default_instance_carries_no_matrix_section(tmp_path):
    project = make_project(tmp_path / "p")
    instance = graph.load_instance(graph.Layout(project), project / "rulesets/profiles/small.toml", project / "build")
    assert instance.matrix is None and instance.ruleset.families_of("matmul") == []
    assert not any(s.name.endswith(":matmul") for s in instance.steps)
    package = next(s for s in instance.steps if s.kind == "package")
    assert "matmul" not in package.reads and "source/rulesets/matrix.toml" not in package.reads["source"]


def test_a_matrix_validation_is_keyed_by_its_own_templates_rules_only(repo):
    """An edit of one template's rules (the decode kernel's, say) leaves the other templates'
    validations, and the records of them, valid: a validate step's code holds the rules of its
    kernel's template and of no other."""
    instance = graph.load_instance(graph.Layout(repo), repo / "rulesets/profiles/matmul.toml", repo / "build")
    steps = [s for s in instance.steps if s.kind == "validate" and s.name.startswith("validate:matmul.")]
    assert {s.name.split(":")[1].split(".")[1] for s in steps} >= {"wgmma", "gemv"}
    for s in steps:
        template = s.name.split(":")[1].split(".")[1]
        rules = {m for m in s.code if m.startswith("matrix/templates/") and m not in
                 ("matrix/templates/__init__.py", "matrix/templates/base.py")}
        assert rules == {f"matrix/templates/{template}.py"}, s.name
