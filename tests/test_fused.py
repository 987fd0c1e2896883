"""Fused chains as operators: a residual matrix beside x, planned, generated and compiled like the rest."""
from __future__ import annotations

import json

from aicg.ops import OPERATORS

from doit_project import doit, make_project, profile_text


def test_a_fused_profile_builds_with_the_residual_in_every_signature(tmp_path):
    project = make_project(tmp_path / "proj", profile_text(ops=("bias_gelu_residual", "residual_rmsnorm"),
                                                           dtypes=("float32", "bfloat16"), shapes=((64, 1000),),
                                                           per_family=2))
    run = doit(project, "build", "profile=rulesets/profiles/small.toml")
    assert run.code == 0, run.output
    manifest = json.loads((project / "build/small/manifest.json").read_text())
    assert set(manifest["kernels"]) == {f"{op}.{d}" for op in ("bias_gelu_residual", "residual_rmsnorm")
                                        for d in ("float32", "bfloat16")}
    for name, entry in manifest["kernels"].items():
        assert entry["arguments"][:2] == ["x", "r"]
        assert (project / "build/small" / entry["cubin"]).read_bytes().startswith(b"\x7fELF")
    source = next((project / "build/small/src").glob("residual_rmsnorm_tree.float32.*.cu")).read_text()
    assert "const float* __restrict__ r,\n    const float* __restrict__ w," in source
    assert "aicg::residual_rmsnorm<" in source and "(x, r, w, y, rows, cols, x_stride, r_stride, eps);" in source


def test_a_fused_operator_reads_every_input_once_in_the_plan_model(shipped_ruleset, repo):
    """The residual is a whole matrix of bytes: the model counts it like x."""
    from aicg import plan
    from aicg import planning as planning_inputs
    planning = planning_inputs.load(repo / "rulesets", repo / "rulesets/profiles/h200.toml", repo / "hwdb")
    params = {"threads": 256, "vec_bytes": 16, "topology": "block", "fast_exp": False, "cache_packs": 0}
    fused = plan.predict_seconds(shipped_ruleset.families["residual_rmsnorm_tree"], "float32", params,
                                 (32768, 4096), planning.hw_facts)
    alone = plan.predict_seconds(shipped_ruleset.families["rmsnorm_tree"], "float32", params,
                                 (32768, 4096), planning.hw_facts)
    assert 1.3 < fused / alone < 1.7       # three matrices of bytes instead of two
    assert OPERATORS["bias_gelu_residual"].argument_names() == ["x", "r", "b", "y", "rows", "cols", "x_stride", "r_stride"]
