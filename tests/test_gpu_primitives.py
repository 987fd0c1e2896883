"""GPU test of the primitive lab: a few realisations measured on the device, end to end, and a
budgeted run of `doit primitives`.

On this machine's GPU (its hwdb entry); skipped without a GPU that hwdb/ has an entry for. Run on a
GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import math
import shutil
import time

import pytest

from aicg import plan_inputs
from aicg.primitives import lab, realisation
from aicg.runtime import driver
from aicg.tasks import probe_tasks

pytestmark = pytest.mark.gpu


def test_the_lab_measures_time_drift_and_stability_of_real_kernels(repo, shipped_ruleset, device_target, monkeypatch,
                                                                   tmp_path):
    monkeypatch.setattr(lab, "COLS", (64, 4096))
    monkeypatch.setattr(lab, "ROW_ELEMENTS", 1 << 24)
    info = driver.probe_device()
    limits = plan_inputs.values(plan_inputs.resolve(device_target))
    configs = [c for c in lab.configurations(shipped_ruleset, limits, ("float32",))
               if c.family in ("row_sum_tree", "row_sum_sequential") and c.params["threads"] == 128]
    cubins = lab.compile_all(configs, shipped_ruleset, repo / "kernels", device_target.arch,
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
                            "device": info.name, "arch": device_target.arch}, records)
    prior = realisation.MeasuredPrior(realisation.load(path), limits)
    for r in [records[0]] + [r for r in records if r["rows"] in lab.FEW_ROWS]:   # few-row times are taken as measured
        family = shipped_ruleset.families[r["family"]]
        assert prior(family, "float32", r["params"], (r["rows"], r["cols"])) == pytest.approx(r["seconds"])


def test_a_budgeted_lab_run_measures_within_its_budget_and_the_next_run_resumes_it(repo, device_target, monkeypatch,
                                                                                   tmp_path):
    """doit primitives budget=40, twice, on this GPU, on a copy of the project whose hwdb has no
    realisation profile (a smaller grid than the lab's, for time)."""
    monkeypatch.setattr(lab, "COLS", (64, 4096))
    monkeypatch.setattr(lab, "ROW_ELEMENTS", 1 << 22)
    root = tmp_path / "project"
    for folder in ("rulesets", "kernels"):
        shutil.copytree(repo / folder, root / folder)
    (root / "hwdb").mkdir()
    for path in (repo / "hwdb").glob("*.toml"):
        shutil.copy(path, root / "hwdb" / path.name)
    profile_path = root / "hwdb" / f"{device_target.target}.realisation.json"

    def primitives() -> tuple[realisation.Profile, float]:
        started = time.monotonic()
        result = probe_tasks.run_primitives(root / "hwdb", root / "rulesets", root / "kernels", "40")
        assert result == {"profile": str(profile_path)}, result
        return realisation.load(profile_path), time.monotonic() - started
    first, spent = primitives()
    partial = first.provenance["partial"]
    assert 0 < partial["items_measured"] < partial["items"] and partial["budget_seconds"] == 40
    assert spent <= 40 + 20, partial["rounds"]   # it stops before a realisation past the budget, then writes
    assert all(r["seconds"] > 0 and math.isfinite(r["drift"]) for r in first.records)
    assert set(first.provenance["cubins"]) == {r["id"] for r in first.records}
    second, _ = primitives()
    before = {(r["id"], r["rows"], r["cols"]): r["seconds"] for r in first.records}
    after = {(r["id"], r["rows"], r["cols"]): r["seconds"] for r in second.records}
    assert set(before) < set(after) and all(after[k] == before[k] for k in before)   # kept, not measured again
    assert second.provenance["partial"]["items_measured"] > partial["items_measured"]
