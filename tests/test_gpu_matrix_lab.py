"""GPU test of the matrix lab: `doit primitives family=matrix` on this machine's GPU with a small
grid, twice (the second keeps the first's records), and the plan calibrated by what it wrote.

Skipped without a GPU that hwdb/ has an entry for. Run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import replace

import pytest

from aicg.matrix import calibration, lab, prior
from aicg.matrix.templates import GpuLimits
from aicg.tasks import probe_tasks

pytestmark = pytest.mark.gpu


def test_the_matrix_lab_writes_a_profile_the_prior_is_calibrated_by(repo, device_target, monkeypatch, tmp_path):
    small = replace(lab.settings(), repetitions=5, shapes=((1024, 1024, 1024), (16, 1024, 1024)),
                    fused_shapes=((256, 512, 1024),))
    monkeypatch.setattr(lab, "settings", lambda path=None: small)
    root = tmp_path / "project"
    shutil.copytree(repo / "kernels", root / "kernels")
    (root / "hwdb").mkdir()
    for path in (repo / "hwdb").glob("*.toml"):
        shutil.copy(path, root / "hwdb" / path.name)
    path = calibration.path_for(root / "hwdb", device_target.target)
    result = probe_tasks.run_matrix_lab(root / "hwdb", root / "kernels")
    assert result == {"matrix_profile": str(path)}, result
    profile = calibration.load(path)
    reals = lab.realisations(tuple(device_target.compute_capability), GpuLimits.of_hardware(device_target))
    assert len(profile.records) >= len(lab.cases(reals, small)) // 2      # most realisations pass and are timed
    assert all(r["seconds"] > 0 and math.isfinite(r["seconds"]) for r in profile.records)
    assert profile.provenance["device"] == device_target.name
    values = prior.values(prior.inputs(device_target))
    fit = calibration.Calibration(profile, lambda r, p: prior.predict_seconds(r, p, values))
    assert math.isfinite(fit.spread)
    again = probe_tasks.run_matrix_lab(root / "hwdb", root / "kernels")
    assert again == result and calibration.load(path).records == profile.records   # kept, not measured again
