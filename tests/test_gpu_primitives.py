"""GPU test of the primitive lab: a few realisations measured on the device, end to end.

Skipped without a GPU; run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import pytest

from aicg import hw, plan_inputs
from aicg.primitives import lab, realisation
from aicg.runtime import driver

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(driver.probe_device() is None, reason="needs a CUDA GPU")]


def test_the_lab_measures_time_drift_and_stability_of_real_kernels(repo, shipped_ruleset, monkeypatch, tmp_path):
    monkeypatch.setattr(lab, "COLS", (64, 4096))
    monkeypatch.setattr(lab, "ROW_ELEMENTS", 1 << 24)
    info = driver.probe_device()
    limits = plan_inputs.values(plan_inputs.resolve(hw.load_target(repo / "hwdb", "nvidia-h200")))
    configs = [c for c in lab.configurations(shipped_ruleset, limits, ("float32",))
               if c.family in ("row_sum_tree", "row_sum_sequential") and c.params["threads"] == 128]
    cubins = lab.compile_all(configs, shipped_ruleset, repo / "kernels", "sm_%d%d" % info.compute_capability,
                             limits["registers_per_sm"], 4)
    records = lab.measure(configs, cubins, info.l2_bytes, progress=lambda line: None)
    # a full launch and the few-row ones at each row length, tiny rows too where a row has one thread
    assert len(records) == sum(len(lab.row_lengths(c)) for c in configs) * (1 + len(lab.FEW_ROWS))
    assert {r["cols"] for r in records if r["params"]["topology"] == "thread"} == {*lab.TINY_COLS, 64, 4096}
    assert {r["rows"] for r in records if r["cols"] == 4096} == {*lab.FEW_ROWS, (1 << 24) // 4096}
    for r in records:
        assert r["seconds"] > 0 and r["bytes"] >= 4 * r["rows"] * r["cols"]
        assert r["bit_stable"], r["id"]           # a fixed order gives the same bits every run
        assert r["drift"] < 1e-5, r["id"]         # a float32 row sum, against float64
    path = tmp_path / "x.realisation.json"
    realisation.save(path, {"date": "d", "driver": "v", "clocks": "c", "method": "m", "repetitions": 7,
                            "device": info.name, "arch": "sm_90"}, records)
    prior = realisation.MeasuredPrior(realisation.load(path), limits)
    for r in [records[0]] + [r for r in records if r["rows"] in lab.FEW_ROWS]:   # few-row times are taken as measured
        family = shipped_ruleset.families[r["family"]]
        assert prior(family, "float32", r["params"], (r["rows"], r["cols"])) == pytest.approx(r["seconds"])
