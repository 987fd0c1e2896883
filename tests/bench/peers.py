"""The peers aicg's memory-bound kernels are measured against, and float64 references.

A peer is what a user would otherwise call: PyTorch eager, `torch.compile` of
the same expression, and the Triton kernel a Triton user would write (one
program per row, the whole row in one block of BLOCK = next power of two of
the row length, fp32 arithmetic, best of a few warp counts). `copy` moves the
input's bytes once each way, the bandwidth ceiling.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

EPS = 1e-5
# The inputs after x, in call order: "matrix" (shaped like x) or "vector" (one value per column).
INPUTS = {"softmax": (), "log_softmax": (), "row_sum": (), "row_max": (), "rmsnorm": ("vector",), "layernorm": ("vector", "vector"),
          "bias_gelu_residual": ("matrix", "vector"), "residual_rmsnorm": ("matrix", "vector")}
ROW_OUTPUT = {"row_sum", "row_max"}

EAGER = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "row_sum": lambda x: x.sum(-1),
    "row_max": lambda x: x.amax(-1),
    "rmsnorm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
    "layernorm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS),
    "bias_gelu_residual": lambda x, r, b: F.gelu(x + b) + r,
    "residual_rmsnorm": lambda x, r, w: F.rms_norm(x + r, (x.shape[-1],), w, EPS),
}


def reference(op: str, x, *inputs):
    """(float64 result, error scale) on the given (already rounded) inputs, as aicg/ops.py defines them."""
    x = x.double()
    inputs = [v.double() for v in inputs]
    if op == "softmax":
        y = torch.softmax(x, -1)
        return y, y.abs()
    if op == "log_softmax":
        y = torch.log_softmax(x, -1)
        return y, y.abs() + 1.0
    if op == "row_sum":
        return x.sum(-1), x.abs().sum(-1)
    if op == "row_max":
        y = x.amax(-1)
        return y, y.abs()
    if op == "rmsnorm":
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * inputs[0]
        return y, y.abs()
    if op == "bias_gelu_residual":
        r, b = inputs
        z = x + b
        g = z * (1 + torch.erf(z / 2 ** 0.5)) / 2
        return g + r, g.abs() + r.abs() + x.abs() + b.abs()
    if op == "residual_rmsnorm":
        r, w = inputs
        inv = torch.rsqrt(((x + r) ** 2).mean(-1, keepdim=True) + EPS)
        return (x + r) * inv * w, (x.abs() + r.abs()) * inv * w.abs()
    mu = x.mean(-1, keepdim=True)
    r = torch.rsqrt(((x - mu) ** 2).mean(-1, keepdim=True) + EPS)
    w, b = inputs
    return (x - mu) * r * w + b, (x.abs() + mu.abs()) * r * w.abs() + b.abs()


@triton.jit
def _softmax(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * cols + offs, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _log_softmax(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
    shifted = x - tl.max(x, 0)
    y = shifted - tl.log(tl.sum(tl.exp(shifted), 0))
    tl.store(y_ptr + row * cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_sum(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=0.0).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(x, 0).to(y_ptr.dtype.element_ty))


@triton.jit
def _row_max(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=-float("inf")).to(tl.float32)
    tl.store(y_ptr + row, tl.max(x, 0).to(y_ptr.dtype.element_ty))


@triton.jit
def _rmsnorm(x_ptr, w_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, 0) / cols + eps)
    tl.store(y_ptr + row * cols + offs, (x * r * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm(x_ptr, w_ptr, b_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, 0) / cols
    d = tl.where(mask, x - mean, 0.0)
    r = 1.0 / tl.sqrt(tl.sum(d * d, 0) / cols + eps)
    tl.store(y_ptr + row * cols + offs, (d * r * w + b).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bias_gelu_residual(x_ptr, r_ptr, b_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
    z = x + tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476)) + r
    tl.store(y_ptr + row * cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _residual_rmsnorm(x_ptr, r_ptr, w_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    h = (tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
         + tl.load(r_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32))
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, 0) / cols + eps)
    tl.store(y_ptr + row * cols + offs, (h * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


_TRITON = {"softmax": _softmax, "log_softmax": _log_softmax, "row_sum": _row_sum, "row_max": _row_max, "rmsnorm": _rmsnorm, "layernorm": _layernorm,
           "bias_gelu_residual": _bias_gelu_residual, "residual_rmsnorm": _residual_rmsnorm}
_HAS_EPS = {"rmsnorm", "layernorm", "residual_rmsnorm"}


def triton_call(op: str, num_warps: int):
    """The hand-written Triton kernel for `op` at `num_warps`, called like EAGER[op]."""
    kernel = _TRITON[op]

    def call(x, *inputs):
        rows, cols = x.shape
        y = x.new_empty((rows,) if op in ROW_OUTPUT else (rows, cols))
        scalars = (EPS,) if op in _HAS_EPS else ()
        kernel[(rows,)](x, *inputs, y, cols, *scalars, BLOCK=triton.next_power_of_2(cols), num_warps=num_warps)
        return y
    return call


def triton_warp_counts(cols: int) -> tuple[int, ...]:
    """A few warp counts around the usual choice for the block size (Triton's softmax tutorial: 4, 8, 16)."""
    block = triton.next_power_of_2(cols)
    usual = 4 if block < 2048 else 8 if block < 4096 else 16
    return tuple(sorted({max(1, usual // 2), usual, min(32, usual * 2)}))


@functools.cache
def compiled(op: str, dynamic: bool):
    """torch.compile of the eager expression; static shapes where it is timed at one shape."""
    return torch.compile(EAGER[op], dynamic=dynamic)
