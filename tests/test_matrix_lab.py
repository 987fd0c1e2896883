"""The matrix lab (aicg/matrix/lab.py) without a GPU: what it measures and in what order, what becomes
a record, budgets and resumption; the runner and compiler stand in for the GPU node's."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from aicg import hw
from aicg.errors import InputError
from aicg.matrix import calibration, lab, space
from aicg.matrix.problem import Problem
from aicg.matrix.space import Epilogue
from aicg.matrix.templates import RULES, GpuLimits
from aicg.tasks import probe_tasks

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "kernels"
H100 = GpuLimits.of_hardware(hw.load_target(REPO / "hwdb", "h100-sxm"))
A100 = GpuLimits.of_hardware(hw.load_target(REPO / "hwdb", "a100-sxm4-80gb"))
SMALL = replace(lab.settings(), shapes=((128, 256, 512), (1, 256, 512)), fused_shapes=((128, 256, 512),))


def node(driver="580", limits=H100, cc=(9, 0)):
    return lab.Node("A GPU", cc, limits, driver, lambda: "sm 1980 MHz")


class Runner:
    """Passes every case, timed at one microsecond per M row plus 1 us, except what it is told."""

    def __init__(self, fails_tile=(), faults=()):
        self.fails_tile, self.faults, self.calls = set(fails_tile), set(faults), []

    def run(self, real, cubin, problem, validate=True, repetitions=0):
        self.calls.append((real.name, (problem.m, problem.n, problem.k), repetitions))
        assert validate and cubin == b"cubin of " + real.name.encode()
        if repetitions == 0 and real.name in self.fails_tile:
            return {"validation": {"status": "failed"}}
        if real.name in self.faults:
            return {"fault": "an illegal address", "validation": {"status": "failed"}}
        result = {"validation": {"status": "passed"}}
        if repetitions:
            result["timing"] = {"median_seconds": 1e-6 * (problem.m + 1)}
        return result


def compiler(reals, arch, kernels_dir):
    assert arch == "sm_90a"
    return {r.name: {"cubin": b"cubin of " + r.name.encode(), "problems": []} for r in reals}


def test_the_lab_file_reads_and_a_bad_one_is_an_input_error(tmp_path, raises_input_error):
    found = lab.settings()
    assert found.repetitions > 0 and found.shapes and found.fused_shapes
    path = tmp_path / "lab.toml"
    path.write_text("schema = 1\nrepetitions = 5\nshapes = [[1, 2]]\nfused_shapes = []\n")
    with raises_input_error(path, "shapes", "an array of [M, N, K]"):
        lab.settings(path)
    path.write_text("schema = 1\nrepetitions = 0\nshapes = []\nfused_shapes = []\n")
    with raises_input_error(path, "repetitions", "a positive integer"):
        lab.settings(path)


def test_every_tried_setting_the_gpu_runs_is_measured_plain_and_fused():
    hopper = lab.realisations((9, 0), H100)
    assert {r.template for r in hopper} == {"wgmma", "mma", "gemv"}
    assert {r.epilogue for r in hopper} == {Epilogue(), lab.FUSED}
    assert all(not RULES[r.template].violations(r, H100) for r in hopper)
    ampere = lab.realisations((8, 0), A100)
    assert {r.template for r in ampere} == {"mma", "gemv"}


def test_cases_go_shape_by_shape_and_each_realisation_only_where_it_computes():
    reals = lab.realisations((9, 0), H100)
    found = lab.cases(reals, SMALL)
    shapes = [(p.m, p.n, p.k, p.epilogue) for _, p in found]
    assert shapes == sorted(shapes, key=lambda s: [(128, 256, 512, Epilogue()), (1, 256, 512, Epilogue()),
                                                   (128, 256, 512, lab.FUSED)].index(s))
    assert all(r.epilogue == p.epilogue for r, p in found)
    assert not any(RULES[r.template].unsupported(r, p) for r, p in found)


def test_a_run_writes_validated_times_only_and_says_what_failed(tmp_path):
    reals = lab.realisations((9, 0), H100)
    bad_tile, faulting = reals[0].name, reals[1].name
    runner = Runner(fails_tile=[bad_tile], faults=[faulting])
    path = tmp_path / "gpu.matrix.json"
    result = lab.measure(node(), path, KERNELS, None, runner, say=lambda line: None, compiler=compiler, lab=SMALL)
    profile = calibration.load(path)
    names = {calibration.Realisation.from_dict(r["realisation"]).name for r in profile.records}
    assert bad_tile not in names and faulting not in names
    assert not any(name == bad_tile and reps for name, _, reps in runner.calls)   # a failed tile is never timed
    assert set(result["failed"]) == {bad_tile, faulting} and "fault" in result["failed"][faulting]
    timed = [c for c in runner.calls if c[2]]
    assert len(profile.records) == result["measured"] == len(timed) - sum(c[0] == faulting for c in timed)
    assert all(c[2] == SMALL.repetitions for c in timed)
    p = profile.provenance
    assert (p["device"], p["driver"], p["arch"], p["lab"]) == ("A GPU", "580", "sm_90a", SMALL.digest)
    assert "matrix/gemm_wgmma.cuh" in p["kernels"] and not p["method"].startswith("partial")


def test_a_second_run_keeps_what_the_first_measured_unless_the_driver_changed(tmp_path):
    path = tmp_path / "gpu.matrix.json"
    first = lab.measure(node(), path, KERNELS, None, Runner(), say=lambda line: None, compiler=compiler, lab=SMALL)
    again = Runner()
    second = lab.measure(node(), path, KERNELS, None, again, say=lambda line: None, compiler=compiler, lab=SMALL)
    assert second["measured"] == 0 and not again.calls and second["records"] == first["records"]
    newer = Runner()
    third = lab.measure(node(driver="590"), path, KERNELS, None, newer, say=lambda line: None, compiler=compiler,
                        lab=SMALL)
    assert third["measured"] == first["measured"] and calibration.load(path).provenance["driver"] == "590"


def test_a_budget_stops_it_between_cases_and_the_next_run_measures_what_is_left(tmp_path, monkeypatch):
    clock = iter(range(10**6))
    monkeypatch.setattr(lab.time, "monotonic", lambda: float(next(clock)))
    path = tmp_path / "gpu.matrix.json"
    cut = lab.measure(node(), path, KERNELS, 12.0, Runner(), say=lambda line: None, compiler=compiler, lab=SMALL)
    assert cut["left"] > 0 and cut["measured"] > 0
    profile = calibration.load(path)
    assert profile.provenance["method"].startswith(f"partial: {cut['left']} cases left")
    rest = lab.measure(node(), path, KERNELS, None, Runner(), say=lambda line: None, compiler=compiler, lab=SMALL)
    assert rest["measured"] == cut["left"] and rest["left"] == 0
    whole = lab.measure(node(), tmp_path / "whole.json", KERNELS, None, Runner(), say=lambda line: None,
                        compiler=compiler, lab=SMALL)
    assert rest["records"] == whole["records"]


def test_a_profile_the_lab_wrote_calibrates_the_plan(tmp_path):
    from aicg.matrix import prior
    path = tmp_path / "gpu.matrix.json"
    lab.measure(node(), path, KERNELS, None, Runner(), say=lambda line: None, compiler=compiler, lab=SMALL)
    values = prior.values(prior.inputs(hw.load_target(REPO / "hwdb", "h100-sxm")))
    fit = calibration.Calibration(calibration.load(path), lambda r, p: prior.predict_seconds(r, p, values))
    assert set(fit.spread) == {"plain", "fused"} and all(math.isfinite(v) and v >= 0 for v in fit.spread.values())
    # what the lab measured is what the calibrated prior now says of it, near enough to rank by
    profile = calibration.load(path)
    assert profile.records
    for r in profile.records:
        real = space.Realisation.from_dict(r["realisation"])
        problem = Problem(r["m"], r["n"], r["k"], real.dtype, real.a_major, real.b_major, real.epilogue)
        predicted = fit.seconds(real, problem, prior.predict_seconds(real, problem, values))
        assert abs(math.log(predicted / r["seconds"])) < math.log(1.5), (real.name, predicted, r["seconds"])


def test_doit_primitives_family_must_be_rows_matrix_or_all(tmp_path):
    with pytest.raises(InputError, match="doit primitives: family: expected rows, matrix or all"):
        probe_tasks.run_lab("tensor", tmp_path, tmp_path, tmp_path)


def test_one_budget_covers_both_labs(monkeypatch, tmp_path):
    given = {}
    monkeypatch.setattr(probe_tasks, "run_primitives", lambda *a: given.setdefault("rows", a[3]) and {"profile": "r"})
    monkeypatch.setattr(probe_tasks, "run_matrix_lab", lambda *a: given.setdefault("matrix", a[2]) and
                        {"matrix_profile": "m"})
    assert probe_tasks.run_lab(None, tmp_path, tmp_path, tmp_path, "100") == {"profile": "r", "matrix_profile": "m"}
    # the row lab's share first; the matrix lab what is left when it is done (here: at once)
    assert float(given["rows"]) == pytest.approx(100 * probe_tasks.ROWS_SHARE) and 90 < float(given["matrix"]) <= 100
    given.clear()
    probe_tasks.run_lab("matrix", tmp_path, tmp_path, tmp_path, "100")
    assert given == {"matrix": "100"}
    given.clear()
    probe_tasks.run_lab("rows", tmp_path, tmp_path, tmp_path, None)
    assert given == {"rows": None}


def test_a_run_where_nothing_passes_writes_no_profile(tmp_path):
    reals = lab.realisations((9, 0), H100)
    path = tmp_path / "gpu.matrix.json"
    result = lab.measure(node(), path, KERNELS, None, Runner(fails_tile=[r.name for r in reals]),
                         say=lambda line: None, compiler=compiler, lab=SMALL)
    assert result["profile"] is None and result["records"] == 0 and not path.exists()
    assert set(result["failed"]) == {r.name for r, _ in lab.cases(reals, SMALL)}   # each one measured would be


def test_a_gpu_no_matrix_template_runs_on_has_nothing_to_measure_and_that_is_no_failure(monkeypatch, tmp_path):
    class Turing:
        name, compute_capability, driver_version = "A GPU", (7, 5), "580"

        @staticmethod
        def clocks():
            return "sm 1590 MHz"
    from aicg.matrix import device
    monkeypatch.setattr(probe_tasks, "_gpu", lambda: Turing)
    monkeypatch.setattr(device, "limits", lambda hwdb_dir: (replace(A100, compute_capability=(7, 5)), None))
    assert lab.realisations((7, 5), replace(A100, compute_capability=(7, 5))) == []
    assert probe_tasks.run_matrix_lab(tmp_path, KERNELS) == {"matrix_profile": None}
