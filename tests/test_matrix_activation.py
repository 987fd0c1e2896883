"""The fitted GELU(erf) of kernels/matrix/epilogue.cuh (no GPU): its error as a kernel computes it, its
edge values, and what ptxas makes of it (tests/bench/gelu_fit.py does the arithmetic)."""
from __future__ import annotations

import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def fit(bench_module):
    return bench_module("gelu_fit")


def test_the_headers_coefficients_keep_a_third_of_the_evaluation_allowance(fit):
    """Every float32 rounding of the evaluation, ex2.approx 2 ulp and rcp.approx 1 ulp off either way:
    the error stays under 0.4 of the 8 u (|x| + |GELU(x)|) the matrix family's bound allows."""
    worst, where = fit.worst_ratio(fit.header_coefficients())
    assert worst < 0.4, (worst, where)


def test_a_refit_reproduces_the_headers_coefficients(fit):
    assert np.array_equal(fit.fit(), fit.header_coefficients())


@pytest.mark.parametrize("index, factor", [(0, 1 + 1e-5), (2, 1.001), (8, 1.01)])
def test_a_coefficient_off_by_little_is_caught(fit, index, factor):
    """The check can fail: the constant term off by 1e-5, the quadratic one by 0.1% or the highest by 1%
    each break the allowance somewhere."""
    wrong = fit.header_coefficients().copy()
    wrong[index] *= np.float32(factor)
    assert fit.worst_ratio(wrong)[0] > 1.0


def test_edge_values_match_float64(fit):
    q = fit.header_coefficients()
    x = np.array([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 1e4, -1e4, np.inf, np.nan], dtype=np.float32).astype(float)
    got = fit.evaluated(q, x)
    assert got[0] == 0.0 and got[1] == 0.0
    assert got[2] == pytest.approx(0.5e-30, rel=1e-6) and got[3] == pytest.approx(-0.5e-30, rel=1e-6)
    assert got[4] == 30.0 and got[6] == 1e4 and got[7] == 0.0 and math.copysign(1.0, got[7]) == -1.0
    assert abs(got[5]) < 1e-30
    assert got[8] == np.inf and np.isnan(got[9])


def test_the_fitted_evaluation_compiles_to_half_the_instructions(sass, fit):
    """The staged cooperative 128 x 256 kernel with bias + GELU(erf) + residual: no FSEL (erff selects
    its coefficients), two hardware approximations a result, no spills."""
    from collections import Counter
    from aicg.matrix import build, codegen, space
    from aicg.matrix.space import Epilogue
    knobs = dict(space.templates()["wgmma"].tried[0], stages=3, store="staged")
    real = space.realisation("wgmma", "bfloat16", "k", "k", Epilogue("gelu_erf", bias=True, residual=True), **knobs)
    counts = {}
    for name, source in (("erff", codegen.source(real)),
                         ("fitted", fit.fitted_source(codegen.source(real)))):
        built = build.compile_source(real, source, f"{name}.cu", build.headers(real), "sm_90a")
        assert build.healthy(built) == []
        counts[name] = Counter(i.opcode.split(".")[0] for i in sass.parse(sass.disassemble(built.cubin))[0])
    assert counts["fitted"]["FSEL"] == 0 < counts["erff"]["FSEL"]
    assert sum(counts["fitted"].values()) < 0.8 * sum(counts["erff"].values())


@pytest.fixture(scope="module")
def sass(bench_module):
    return bench_module("sass")
