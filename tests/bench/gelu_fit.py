"""The fitted GELU(erf) of kernels/matrix/epilogue.cuh (gelu_fitted): its coefficients, and its error.

    python tests/bench/gelu_fit.py            # fit, print the literals, and the error of the header's
    python tests/bench/gelu_fit.py --check    # the header's coefficients only: their worst error

GELU(x) = x Phi(x), and Phi(x) = 1 / (1 + exp(-g(x))) with g = log(Phi / (1 - Phi)), an odd function that
grows like x^2 / 2. The kernel takes g(x) = x Q(|x|) with Q a polynomial in |x| (|x| clamped to CLAMP:
past it Phi is 0 or 1 to float's precision), folds -1/ln 2 into Q so that exp(-g) is one `ex2.approx`,
and divides with one `rcp.approx`: 8 FMAs, a clamp, two multiplies, an add and two hardware approximations,
against some 25 instructions for libdevice's erff and the products around it.

Q is fitted by iteratively reweighted least squares towards the smallest worst error in Phi (weights
Phi (1 - Phi) x, the error's sensitivity to Q). The error is judged as a kernel computes it: every FMA, add
and multiply rounded to float32, ex2.approx off by up to 2 ulp and rcp.approx by up to 1 ulp (each bound
taken both ways), against float64 GELU, relative to the 8 u (|x| + |GELU(x)|) that the matrix family's
error bound allows an activation's evaluation (aicg/matrix/reference.py).
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "kernels/matrix/epilogue.cuh"
DEGREE, CLAMP = 8, 6.0
U = 2.0**-24                   # float32's unit roundoff
ALLOWANCE = 8.0                # reference.py's 8 u (|pre| + |act(pre)|)
EX2_ULPS, RCP_ULPS = 2, 1      # the hardware approximations' error bounds assumed

_erfc = np.frompyfunc(math.erfc, 1, 1)


def fitted_source(source: str) -> str:
    """A realisation's generated source with its GELU(erf) evaluated by gelu_fitted instead of erff (no
    realisation names ACT_GELU_ERF_FITTED yet: the bench and the tests build it this way)."""
    erff, fitted = "aicg::matrix::ACT_GELU_ERF,", "aicg::matrix::ACT_GELU_ERF_FITTED,"
    if erff not in source:
        raise ValueError("not a GELU(erf) kernel's source")
    return source.replace(erff, fitted)


def exact_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * _erfc(-x / math.sqrt(2.0)).astype(np.float64)


def fit(degree: int = DEGREE, clamp: float = CLAMP) -> np.ndarray:
    """Q's float32 coefficients, constant term first, with -1/ln 2 folded in (the exponent of 2)."""
    xs = np.linspace(1e-4, clamp, 60001)
    upper, lower = _erfc(-xs / math.sqrt(2.0)).astype(float), _erfc(xs / math.sqrt(2.0)).astype(float)
    phi = 0.5 * upper
    target = (np.log(upper) - np.log(lower)) / xs           # g(x) / x, from erfc: no cancellation
    weight, reweight = phi * (1.0 - phi) * xs, np.ones_like(xs)
    for _ in range(40):
        rows = np.vander(xs, degree + 1, increasing=True) * (weight * reweight)[:, None]
        coefficients, *_ = np.linalg.lstsq(rows, target * weight * reweight, rcond=None)
        error = weight * np.abs(np.polynomial.polynomial.polyval(xs, coefficients) - target)
        reweight = reweight * np.sqrt(error / error.max() + 1e-3)
        reweight /= reweight.max()
    return (-coefficients / math.log(2.0)).astype(np.float32)


def header_coefficients(path: Path = HEADER) -> np.ndarray:
    """gelu_fitted's coefficients as the header spells them (highest degree first there), constant first."""
    body = path.read_text().split("float gelu_fitted(float x)", 1)[1].split("\n}", 1)[0]
    literals = re.findall(r"(-?0x[0-9a-f.]+p[-+]?\d+)f", body)
    if len(literals) != DEGREE + 1:
        raise ValueError(f"{path}: gelu_fitted spells {len(literals)} coefficients, not {DEGREE + 1}")
    if f"fminf(fabsf(x), {CLAMP}f)" not in body:
        raise ValueError(f"{path}: gelu_fitted does not clamp |x| to {CLAMP}, as the fit and its error assume")
    return np.array([float.fromhex(v) for v in reversed(literals)], dtype=np.float32)


def literals(coefficients: np.ndarray) -> list[str]:
    """C++ hex-float literals, highest degree first (as the header's Horner scheme takes them)."""
    return [float(c).hex().replace("0000000p", "p") + "f" for c in reversed(coefficients)]


def _f32(v) -> np.ndarray:
    return np.asarray(v, np.float64).astype(np.float32).astype(np.float64)


def evaluated(coefficients: np.ndarray, x: np.ndarray, ex2_ulps: int = 0, rcp_ulps: int = 0) -> np.ndarray:
    """The kernel's result at float32 inputs x, its approximations off by the given ulps."""
    a = np.minimum(np.abs(x), CLAMP)
    q = np.full_like(x, float(coefficients[-1]))
    for c in coefficients[-2::-1]:
        q = _f32(q * a + float(c))                            # an FMA: one rounding
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        e = _f32(np.exp2(_f32(x * q))) * (1.0 + ex2_ulps * 2.0**-23)
        r = _f32(1.0 / _f32(1.0 + e)) * (1.0 + rcp_ulps * 2.0**-23)
        return _f32(x * r)


def sample_inputs() -> np.ndarray:
    dense = np.linspace(-12.0, 12.0, 2_000_001)
    tiny = np.logspace(-30, 1.5, 20001)
    return _f32(np.concatenate([dense, tiny, -tiny]))


def worst_ratio(coefficients: np.ndarray, x: np.ndarray | None = None) -> tuple[float, float]:
    """(the largest |kernel - GELU| / (ALLOWANCE u (|x| + |GELU|)) over the samples and the approximations'
    error bounds both ways, the input where it is)."""
    x = sample_inputs() if x is None else x
    exact = exact_gelu(x)
    allowance = ALLOWANCE * U * (np.abs(x) + np.abs(exact))
    worst, where = 0.0, float("nan")
    for ex2 in (-EX2_ULPS, 0, EX2_ULPS):
        for rcp in (-RCP_ULPS, 0, RCP_ULPS):
            ratio = np.abs(evaluated(coefficients, x, ex2, rcp) - exact) / np.maximum(allowance, 1e-300)
            i = int(np.nanargmax(ratio))
            if ratio[i] > worst:
                worst, where = float(ratio[i]), float(x[i])
    return worst, where


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="judge the header's coefficients only")
    args = p.parse_args(argv)
    if not args.check:
        fitted = fit()
        print("fitted, highest degree first:", ", ".join(literals(fitted)))
        print("fitted: worst error %.3f of the allowance, at x = %g" % worst_ratio(fitted))
    print("header: worst error %.3f of the allowance, at x = %g" % worst_ratio(header_coefficients()))


if __name__ == "__main__":
    main()
