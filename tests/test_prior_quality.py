"""tests/bench/prior_quality.py: the loss of building only the prior's first few, from recorded runs."""
from __future__ import annotations

import json

import pytest

from aicg.matrix import space
from aicg.report import bench as recorded


@pytest.fixture(scope="module")
def quality(bench_module):
    return bench_module("prior_quality")


def _case(problem: str, realisation: str, seconds: float, flush: str = "read", status: str = "passed") -> dict:
    return {"stage": "grid", "problem": problem, "realisation": realisation, "validation": {"status": status},
            "timing": {"median_seconds": seconds, "l2_flush": flush}}


def test_the_loss_is_the_best_of_the_priors_first_over_the_best_timed(quality, tmp_path):
    tried = [space.realisation("wgmma", "bfloat16", "k", "k", **k).name for k in space.templates()["wgmma"].tried[:3]]
    problem = "128x4096x4096 bfloat16 kk plain"
    cases = [_case(problem, tried[0], 3e-5), _case(problem, tried[1], 2e-5), _case(problem, tried[2], 1e-5),
             _case(problem, tried[2], 5e-6, flush="write"),          # timed after a memset: left out
             _case(problem, tried[1], 1e-6, status="failed"),         # not validated: left out
             _case(problem, "wgmma.bf16.kk.gone.plain", 1e-7)]       # no longer in the space: counted apart
    (tmp_path / "2026-01-01-g-matmul.json").write_text(json.dumps(
        {"device": {"name": "GPU G"}, "table": [], "cases": cases, "args": {"flush": "read"}}))
    measured = quality.measured_grid(recorded.runs(tmp_path), "GPU G")
    assert measured == {problem: {tried[0]: 3e-5, tried[1]: 2e-5, tried[2]: 1e-5, "wgmma.bf16.kk.gone.plain": 1e-7}}
    order = {name: i for i, name in enumerate(tried)}      # a prior that ranks the slowest first

    def seconds(real, _problem):
        return order[real.name]
    rows, unknown = quality.losses(measured, seconds, top=1)
    assert unknown == 1 and rows[0]["prior_first"] == tried[0] and rows[0]["loss"] == pytest.approx(3.0)
    assert rows[0]["best"] == tried[2] and quality.losses(measured, seconds, top=3)[0][0]["loss"] == 1.0


def test_the_recorded_h100_grid_reads(quality, repo):
    measured = quality.measured_grid(recorded.runs(repo / "docs" / "bench"), "NVIDIA H100 80GB HBM3")
    assert "128x6144x4096 bfloat16 kk plain" in measured and len(measured) >= 20


def test_a_builds_choice_loses_its_best_timed_over_the_best_of_all(quality):
    a, b, c = "wgmma.bf16.kk.a.plain", "wgmma.bf16.kk.b.plain", "gemv.bf16.kk.c.plain"
    measured = {"16x4096x4096 bfloat16 kk plain": {a: 2e-5, b: 3e-5, c: 1e-5},
                "128x4096x4096 bfloat16 kk plain": {c: 4e-5}}
    rows = quality.planned_losses(measured, [([(16, 4096, 4096), (128, 4096, 4096), (1, 64, 64)], [a, b])])
    assert [r["problem"] for r in rows] == ["16x4096x4096", "128x4096x4096"]   # a shape the grid never timed: left out
    assert rows[0]["loss"] == 2.0 and rows[0]["pick"] == a and rows[0]["chosen_timed"] == 2
    assert rows[1]["loss"] is None and rows[1]["pick"] is None                 # none of the chosen timed there


def test_the_matmul_profile_is_planned_as_a_build_plans_it(quality, repo):
    record = quality.device.hardware_entry("NVIDIA H100 80GB HBM3")
    profile = repo / "rulesets" / "profiles" / "matmul.toml"
    (shapes, chosen), = quality.planned(profile, record, per_family=2)
    assert (16, 28672, 4096) in shapes
    assert 0 < len(chosen) <= 2 * 3 and all(not name.startswith("matmul.") for name in chosen)   # 3 families at most
    (_, more), = quality.planned(profile, record, per_family=4)
    assert set(chosen) <= set(more) and len(more) > len(chosen)     # greedy: the first two a family stay
