"""Operator mechanics: kernel signatures, float64 references and error scales.

The atlas (rulesets/atlas.toml) says what an operator means; this registry
says how aicg calls and checks it. Every operator works on rows of a
row-major matrix x of shape (rows, cols); a fused one may read further
matrices of the same shape (a residual) beside it.

`reference` returns (y, scale) in float64: the exact result on the given
(already rounded) inputs, and the magnitude errors are measured against,
|y - ref| <= atol + rtol * scale. For sums the natural scale is sum|x| (the
sum's condition), not |sum x|, which can be arbitrarily small.

`reduction_gain` is how much of the row reduction's relative error (against
sum|x| of what it sums) reaches the output, against that scale: the
semantics/accuracy.py bound of a reduction order is multiplied by it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

EPS = 1e-5


@dataclass(frozen=True)
class Operator:
    name: str
    vectors: tuple[str, ...]          # per-column inputs besides x, in argument order
    output: str                       # "matrix" (rows, cols) or "rows" (rows,)
    scalars: tuple[tuple[str, float], ...]
    reference: Callable
    # The reference evaluation order in float32, for bitwise checks: only
    # operators with an exact or sequential legal family need one.
    emulate: Callable | None = None
    matrices: tuple[str, ...] = ()    # inputs shaped like x besides it, in argument order (after x)
    # softmax divides by the sum, log-softmax subtracts its log (an absolute error, hence the scale's
    # 1): the sum's relative error, whole. A norm's sqrt halves it; layernorm's mean error comes
    # whole beside half its variance's.
    reduction_gain: float = 1.0

    def kernel_params(self, ctype: str) -> list[str]:
        """C++ parameter list of the generated kernel, in launch order."""
        params = [f"const {ctype}* __restrict__ x"]
        params += [f"const {ctype}* __restrict__ {m}" for m in self.matrices]
        params += [f"const {ctype}* __restrict__ {v}" for v in self.vectors]
        params += [f"{ctype}* __restrict__ y", "int rows", "int cols"]
        params += [f"int {name}" for name in self.stride_names()]
        params += [f"float {name}" for name, _ in self.scalars]
        return params

    def input_matrices(self) -> tuple[str, ...]:
        return ("x", *self.matrices)

    def stride_names(self) -> list[str]:
        """Row strides, in elements, of the input matrices: their rows may lie apart (a slice of
        a wider matrix); the output is written densely."""
        return [f"{m}_stride" for m in self.input_matrices()]

    def argument_names(self) -> list[str]:
        return ["x", *self.matrices, *self.vectors, "y", "rows", "cols", *self.stride_names(),
                *(n for n, _ in self.scalars)]

    def output_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        return (rows, cols) if self.output == "matrix" else (rows,)


def _softmax(x, **_):
    z = np.exp(x - x.max(axis=1, keepdims=True))
    y = z / z.sum(axis=1, keepdims=True)
    return y, np.abs(y)


def _log_softmax(x, **_):
    shifted = x - x.max(axis=1, keepdims=True)
    y = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    # |y| = |x - max| + log(sum): each rounds relative to itself; and log(sum) carries the sum's
    # relative error as an absolute one, hence the 1
    return y, np.abs(y) + 1.0


def _row_sum(x, **_):
    return x.sum(axis=1), np.abs(x).sum(axis=1)


def _row_max(x, **_):
    y = x.max(axis=1)
    return y, np.abs(y)


def _rmsnorm(x, w, eps, **_):
    r = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
    y = x * r * w
    return y, np.abs(y)


def _layernorm(x, w, b, eps, **_):
    mu = x.mean(axis=1, keepdims=True)
    r = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + eps)
    y = (x - mu) * r * w + b
    # x - mu cancels: its error scales with |x| + |mu|, not with |x - mu|.
    return y, (np.abs(x) + np.abs(mu)) * r * np.abs(w) + np.abs(b)


def _gelu(z):
    erf = np.frompyfunc(math.erf, 1, 1)   # numpy has no erf; validation shapes are small
    return z * (1.0 + erf(z / math.sqrt(2.0)).astype(np.float64)) / 2.0


def _bias_gelu_residual(x, r, b, **_):
    g = _gelu(x + b)
    # x + b rounds before gelu (slope at most 1.13) and the sum with r can cancel
    return g + r, np.abs(g) + np.abs(r) + np.abs(x) + np.abs(b)


def _residual_rmsnorm(x, r, w, eps, **_):
    h = x + r
    inv = 1.0 / np.sqrt((h * h).mean(axis=1, keepdims=True) + eps)
    # x + r can cancel: its rounding error scales with |x| + |r|, not with |h|
    return h * inv * w, (np.abs(x) + np.abs(r)) * inv * np.abs(w)


def _row_sum_sequential(x32):
    return np.add.accumulate(x32, axis=1, dtype=np.float32)[:, -1]


def _row_max_exact(x32):
    y = x32.max(axis=1)
    # +0 beats -0 (kernels/reduce.cuh): a zero maximum is +0 when any +0 is in the row.
    positive_zero = ((x32 == 0) & ~np.signbit(x32)).any(axis=1)
    return np.where((y == 0) & positive_zero, np.float32(0.0), y)


OPERATORS: dict[str, Operator] = {
    "softmax": Operator("softmax", (), "matrix", (), _softmax),
    "log_softmax": Operator("log_softmax", (), "matrix", (), _log_softmax),
    "row_sum": Operator("row_sum", (), "rows", (), _row_sum, _row_sum_sequential),
    "row_max": Operator("row_max", (), "rows", (), _row_max, _row_max_exact),
    "rmsnorm": Operator("rmsnorm", ("w",), "matrix", (("eps", EPS),), _rmsnorm, reduction_gain=0.5),
    "layernorm": Operator("layernorm", ("w", "b"), "matrix", (("eps", EPS),), _layernorm, reduction_gain=1.5),
    "bias_gelu_residual": Operator("bias_gelu_residual", ("b",), "matrix", (), _bias_gelu_residual,
                                   matrices=("r",)),
    "residual_rmsnorm": Operator("residual_rmsnorm", ("w",), "matrix", (("eps", EPS),), _residual_rmsnorm,
                                 matrices=("r",), reduction_gain=0.5),
}
