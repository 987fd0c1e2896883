"""A matrix call's arguments, worked out on the host before any kernel is chosen: each array's
pointer, shape, strides, dtype and device (`operand`), the layouts its strides allow, and the
problems `inst.matmul(a, b, bias, residual, activation)` and `inst.linear(x, weight, bias)` may
be (`matmul_call`, `linear_call`), each argument checked with an error naming it. No GPU is needed.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from ..runtime import arrays
from .problem import MAX_DIMENSION, Problem
from .space import ACTIVATIONS, DTYPES, Epilogue


class Operand(NamedTuple):
    """An array as the matrix kernels see it: where it is, its shape and strides (in elements)."""
    obj: object
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int


def operand(obj, what: str) -> Operand:
    """A CUDA array of PyTorch, CuPy or any DLPack / __cuda_array_interface__ framework."""
    if arrays.framework(obj) == "torch":
        if not obj.is_cuda:
            raise TypeError(f"{what}: expected an array in GPU memory, got one on {obj.device}")
        return Operand(obj, obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), str(obj.dtype).rsplit(".", 1)[-1],
                       obj.get_device())
    from cuda.core.utils import StridedMemoryView
    try:
        v = StridedMemoryView.from_any_interface(obj, stream_ptr=-1)
    except Exception as err:
        raise TypeError(f"{what}: expected a CUDA array (DLPack or __cuda_array_interface__), got "
                        f"{type(obj).__name__}: {err}") from None
    if not v.is_device_accessible or v.device_id < 0:
        raise TypeError(f"{what}: expected an array in GPU memory, got one in host memory")
    shape = tuple(v.shape)
    strides = tuple(v.strides) if v.strides is not None else dense_strides(shape)
    return Operand(obj, int(v.ptr), shape, strides, arrays._dtype_name(v, obj), v.device_id)


def dense_strides(shape) -> tuple[int, ...]:
    found, step = [], 1
    for n in reversed(shape):
        found.append(step)
        step *= n
    return tuple(reversed(found))


def layouts_2d(op: Operand, what: str) -> list[tuple[str, int]]:
    """How a 2-D array lies: ("row", elements between row starts) and / or ("col", between column
    starts); both where a single row or column makes either true. ValueError where neither."""
    if len(op.shape) != 2:
        raise ValueError(f"{what}: expected a matrix (2 dimensions), got shape {op.shape}")
    (rows, cols), (s0, s1) = op.shape, op.strides
    found = []
    if (cols == 1 or s1 == 1) and (rows == 1 or s0 >= cols):
        found.append(("row", s0 if rows > 1 else cols))
    if (rows == 1 or s0 == 1) and (cols == 1 or s1 >= rows):
        found.append(("col", s1 if cols > 1 else rows))
    if not found:
        raise ValueError(f"{what}: expected a row-major matrix or the transpose of one (one stride 1, the other at "
                         f"least its row length), got strides {op.strides} for shape {op.shape}")
    return found


def rows_of(op: Operand, what: str) -> tuple[int, int, int]:
    """(rows, row length, row stride) of an array of rows of its last dimension (rows evenly apart)."""
    if not op.shape:
        raise ValueError(f"{what}: expected at least one dimension")
    stride = arrays.row_stride(what, op.shape, op.strides)
    return math.prod(op.shape[:-1]), op.shape[-1], stride


class Call(NamedTuple):
    """One call, worked out on the host: the problem, its possible layouts, and the output's shape."""
    problems: list[Problem]      # one per layout reading of the operands, the first the instance has wins
    out_shape: tuple[int, ...]
    pointers: dict[str, int]
    dtype: str
    device: int


def _check_common(dtype: str, operands: dict[str, Operand]) -> tuple[str, int]:
    if dtype not in DTYPES:
        first = next(iter(operands))
        raise ValueError(f"{first}: expected {' or '.join(DTYPES)} (the matrix kernels' operand types), got {dtype}")
    device = next(iter(operands.values())).device
    for name, op in operands.items():
        if op.dtype != dtype:
            raise ValueError(f"{name}: expected dtype {dtype} (as the first operand), got {op.dtype}")
        if op.device != device:
            raise ValueError(f"{name}: expected an array on GPU {device} (as the first operand), got GPU {op.device}")
    return dtype, device


def _epilogue_operands(bias: Operand | None, residual: Operand | None, out_shape, n: int) -> dict:
    found = {}
    if bias is not None:
        if bias.shape != (n,) or (n > 1 and bias.strides[0] != 1):
            raise ValueError(f"bias: expected a contiguous vector of shape ({n},), got shape {bias.shape} "
                             f"strides {bias.strides}")
        found["bias"] = bias.ptr
    if residual is not None:
        if residual.shape != tuple(out_shape):
            raise ValueError(f"residual: expected the output's shape {tuple(out_shape)}, got {residual.shape}")
        found["residual"] = residual.ptr
    return found


def _check_dimensions(m: int, n: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k = {k}: expected at least one term in each sum (the kernels do not compute empty products)")
    for name, value in (("m", m), ("n", n), ("k", k)):
        if value > MAX_DIMENSION:
            raise ValueError(f"{name} = {value}: expected at most {MAX_DIMENSION} (the kernels index with int)")


def activation_of(activation) -> str:
    name = "none" if activation is None else activation
    if name not in ACTIVATIONS:
        raise ValueError(f"activation: expected None or one of {', '.join(repr(a) for a in ACTIVATIONS if a != 'none')}, "
                         f"got {activation!r}")
    return name


def matmul_call(a: Operand, b: Operand, bias: Operand | None, residual: Operand | None, activation) -> Call:
    """The problems `act(a @ b + bias) + residual` may be, from its operands (no GPU needed)."""
    epilogue = Epilogue(activation_of(activation), bias is not None, residual is not None)
    given = {"a": a, "b": b, **({"bias": bias} if bias else {}), **({"residual": residual} if residual else {})}
    dtype, device = _check_common(a.dtype, given)
    if len(a.shape) == 2:
        a_readings = [("k" if lay == "row" else "mn", ld) for lay, ld in layouts_2d(a, "a")]
        m, k = a.shape
    else:    # (K,) or (..., M, K): rows of K
        m, k, ld = rows_of(a, "a")
        a_readings = [("k", ld)]
    if len(b.shape) != 2 or b.shape[0] != k:
        raise ValueError(f"b: expected shape ({k}, N) for a of shape {a.shape}, got {b.shape}")
    n = b.shape[1]
    b_readings = [("mn" if lay == "row" else "k", ld) for lay, ld in layouts_2d(b, "b")]
    out_shape = (*a.shape[:-1], n)
    return _call(m, n, k, dtype, device, a_readings, b_readings, epilogue, out_shape, given, bias, residual)


def linear_call(x: Operand, weight: Operand, bias: Operand | None) -> Call:
    """The problems `x @ weight.T + bias` may be (F.linear's arguments)."""
    given = {"x": x, "weight": weight, **({"bias": bias} if bias else {})}
    dtype, device = _check_common(x.dtype, given)
    m, k, lda = rows_of(x, "x")
    if len(weight.shape) != 2 or weight.shape[1] != k:
        raise ValueError(f"weight: expected shape (N, {k}) for x of shape {x.shape}, got {weight.shape}")
    n = weight.shape[0]
    b_readings = [("k" if lay == "row" else "mn", ld) for lay, ld in layouts_2d(weight, "weight")]
    out_shape = (*x.shape[:-1], n)
    return _call(m, n, k, dtype, device, [("k", lda)], b_readings, Epilogue(bias=bias is not None), out_shape,
                 {"a": x, "b": weight, **({"bias": bias} if bias else {})}, bias, None)


def _call(m, n, k, dtype, device, a_readings, b_readings, epilogue, out_shape, given, bias, residual) -> Call:
    _check_dimensions(m, n, k)
    pointers = {"a": given["a"].ptr, "b": given["b"].ptr,
                **_epilogue_operands(bias, residual, out_shape, n)}
    ldr = 0
    if residual is not None and m and n:
        _, _, ldr = rows_of(residual, "residual")
    problems = []
    if m and n:
        for (a_major, lda) in a_readings:
            for (b_major, ldb) in b_readings:
                problems.append(Problem(m, n, k, dtype, a_major, b_major, epilogue, lda=lda, ldb=ldb, ldc=n, ldr=ldr))
    return Call(problems, tuple(out_shape), pointers, dtype, device)
