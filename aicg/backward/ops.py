"""Backward operators: what each takes and gives, its float64 reference and error scales.

A backward operator gives the gradients of a forward operator's inputs from the gradient `g` of
its output and what the forward saved: softmax and log-softmax their output `y`, the norms their
input `x` and weight `w`. Its gradient of x is computed a row at a time (the "rows" part); a
norm's weight and bias gradients are sums down the columns over every row (the "columns" part),
from the row statistics the rows part writes (`stats_per_row` floats a row).

`reference` returns, for each output, (gradient, scale) in float64 on the given (already rounded)
inputs: the exact gradient, and the magnitude errors are measured against, |y - ref| <= atol +
rtol * scale, as aicg/ops.py's references do. A scale is the sum of the magnitudes each term is
computed from, so that a sum's error counts against the sum of |terms| (its condition), and the
cancellation of x - mu against |x| + |mu|.

`row_gain` is how much of the row sums' relative error reaches the input's gradient against its
scale (a norm's inverse root is cubed in its second term: 3/2 of its sum's error, beside the
gradient sum's own); `column_row_gain`, how much of it reaches the column sums through the row
statistics they multiply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..dtypes import DType
from ..ops import EPS, OPERATORS


@dataclass(frozen=True)
class BackwardOp:
    name: str
    forward: str                    # the operator in aicg/ops.py it differentiates
    saved: str                      # the matrix saved beside g: "y" (the forward's output) or "x" (its input)
    vectors: tuple[str, ...]        # per-column inputs, in argument order
    scalars: tuple[tuple[str, float], ...]
    column_outputs: tuple[str, ...]  # the vectors' gradients, sums down the columns ("dw", "db")
    reference: Callable
    row_gain: float = 1.0
    column_row_gain: float = 0.0

    @property
    def matrices(self) -> tuple[str, str]:
        """The input matrices, in argument order: the output's gradient, then what was saved."""
        return ("g", self.saved)

    @property
    def stats_per_row(self) -> int:
        """Floats a row the rows part writes for the columns part (its statistics), 0 without one."""
        return len(self.column_outputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        return ("dx", *self.column_outputs)

    def output_shape(self, name: str, rows: int, cols: int) -> tuple[int, ...]:
        return (rows, cols) if name == "dx" else (cols,)


def _softmax_backward(g, y, **_):
    gy = g * y
    dx = y * (g - gy.sum(axis=1, keepdims=True))
    return {"dx": (dx, np.abs(y) * (np.abs(g) + np.abs(gy).sum(axis=1, keepdims=True)))}


def _log_softmax_backward(g, y, **_):
    p = np.exp(y)
    dx = g - p * g.sum(axis=1, keepdims=True)
    return {"dx": (dx, np.abs(g) + p * np.abs(g).sum(axis=1, keepdims=True))}


def _rmsnorm_backward(g, x, w, eps, **_):
    n = x.shape[1]
    r = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
    gw = g * w
    dx = r * gw - x * r**3 * (gw * x).sum(axis=1, keepdims=True) / n
    dx_scale = r * np.abs(gw) + np.abs(x) * r**3 * np.abs(gw * x).sum(axis=1, keepdims=True) / n
    return {"dx": (dx, dx_scale), "dw": ((g * x * r).sum(axis=0), (np.abs(g * x) * r).sum(axis=0))}


def _layernorm_backward(g, x, w, eps, **_):
    n = x.shape[1]
    mu = x.mean(axis=1, keepdims=True)
    centred = x - mu
    r = 1.0 / np.sqrt((centred * centred).mean(axis=1, keepdims=True) + eps)
    gw = g * w
    dx = r * (gw - gw.mean(axis=1, keepdims=True)) - centred * r**3 * (gw * centred).sum(axis=1, keepdims=True) / n
    # x - mu rounds relative to |x| + |mu| (the forward's scale says the same)
    magnitude = np.abs(x) + np.abs(mu)
    dx_scale = (r * (np.abs(gw) + np.abs(gw).mean(axis=1, keepdims=True))
                + magnitude * r**3 * (np.abs(gw) * magnitude).sum(axis=1, keepdims=True) / n)
    return {"dx": (dx, dx_scale),
            "dw": ((g * centred * r).sum(axis=0), (np.abs(g) * magnitude * r).sum(axis=0)),
            "db": (g.sum(axis=0), np.abs(g).sum(axis=0))}


BACKWARD_OPS: dict[str, BackwardOp] = {
    "softmax_backward": BackwardOp("softmax_backward", "softmax", "y", (), (), (), _softmax_backward),
    "log_softmax_backward": BackwardOp("log_softmax_backward", "log_softmax", "y", (), (), (), _log_softmax_backward),
    # r's relative error is half its sum's; the second term carries r^3 (3/2) and the gradient sum (1)
    "rmsnorm_backward": BackwardOp("rmsnorm_backward", "rmsnorm", "x", ("w",), (("eps", EPS),), ("dw",),
                                   _rmsnorm_backward, row_gain=2.5, column_row_gain=0.5),
    # as rmsnorm's, and the mean's error whole in x - mu
    "layernorm_backward": BackwardOp("layernorm_backward", "layernorm", "x", ("w",), (("eps", EPS),), ("dw", "db"),
                                     _layernorm_backward, row_gain=2.5, column_row_gain=1.5),
}
BY_FORWARD: dict[str, BackwardOp] = {op.forward: op for op in BACKWARD_OPS.values()}


def draw(op: BackwardOp, dtype: DType, rows: int, cols: int, trial: int, rng) -> dict[str, np.ndarray]:
    """Stored (device-format) inputs; odd trials shift and scale x (or the logits y comes from) and
    scale g. A saved output is the forward's own: the float64 reference on drawn logits, rounded."""
    scale, shift = (1.0, 0.0) if trial % 2 == 0 else (4.0, 3.0)
    arrays = {"g": rng.standard_normal((rows, cols), dtype=np.float32) * scale}
    drawn = rng.standard_normal((rows, cols), dtype=np.float32) * scale + shift
    if op.saved == "y":
        y, _ = OPERATORS[op.forward].reference(dtype.decode(dtype.encode(drawn)).astype(np.float64))
        arrays["y"] = y.astype(np.float32)
    else:
        arrays["x"] = drawn
    if "w" in op.vectors:
        arrays["w"] = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    return {name: dtype.encode(a) for name, a in arrays.items()}


def reference(op: BackwardOp, dtype: DType, inputs: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The float64 gradients and scales of stored inputs."""
    wide = {n: dtype.decode(a).astype(np.float64).reshape(a.shape) for n, a in inputs.items()}
    return op.reference(**wide, **dict(op.scalars))
