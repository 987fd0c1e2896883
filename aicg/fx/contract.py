"""Whether a match may become a call of the instance operator: what the kernel takes.

A pattern says what the graph computes; the kernel says what it accepts: x of a dtype the
instance has kernels for, on a CUDA device (or meta, which stands for any), its rows
evenly spaced with the last dimension contiguous; matrices shaped like x, vectors of
(cols,) and contiguous, all in x's dtype; scalars that are numbers; a result of x's dtype
and the operator's shape (a trailing 1 where the graph kept the reduced dimension).
Nothing the pattern matched inside may be needed elsewhere, since the kernel returns only
its result; and every rule the pattern names must be legal at the instance's preservation
level. The first thing that fails is the reason the match is declined.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from ..matrix.space import Epilogue
from ..ops import OPERATORS
from ..runtime import arrays
from ..semantics.patterns import Pattern, matrix_epilogue
from .legal import InstanceRules
from .match import Match, example
from .spellings import Spellings

DEVICES = ("cuda", "meta")   # meta tensors have no device of their own: graphs are checked on them
LIMIT = 2**31                # kernels index rows, columns and strides in 32 bits


@dataclass(frozen=True)
class Verdict:
    kind: str | None          # None: the kernel takes it; else a key of report.KINDS
    reason: str = ""
    dtype: str = ""
    keepdim: bool = False     # the graph's result has a trailing 1 the kernel's does not


def _dtype_name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _static(sizes) -> tuple | None:
    """Sizes or strides as ints, or None where any is symbolic (then checked when the kernel runs)."""
    values = tuple(sizes)
    return values if all(isinstance(v, int) for v in values) else None


def _size_text(sizes) -> list:
    return [v if isinstance(v, int) else str(v) for v in sizes]


def check(pattern: Pattern, match: Match, root: torch.fx.Node, kernels_by_op: dict, rules: InstanceRules,
          spellings: Spellings) -> Verdict:
    """`kernels_by_op`: the instance's operators (op -> its kernels, whose `entries` are by dtype)."""
    op = OPERATORS[pattern.operator]
    if op.name not in kernels_by_op:
        return Verdict("operator", f"this instance has no {op.name} kernels (it has: "
                                   f"{', '.join(sorted(kernels_by_op)) or 'none'})")
    names = ("x", *op.matrices, *op.vectors)
    tensors, verdict = _tensors(match, names)
    if verdict:
        return verdict
    x = tensors["x"]
    dtype = _dtype_name(x.dtype)
    have = kernels_by_op[op.name].entries
    if dtype not in have:
        return Verdict("dtype", f"x is {dtype}; this instance has {op.name} in {', '.join(sorted(have))}", dtype)
    if x.ndim == 0:
        return Verdict("shape", "x is a scalar; the kernels take rows (the last dimension)", dtype)
    for name in names[1:]:
        t = tensors[name]
        if t.dtype != x.dtype or t.device != x.device:
            return Verdict("dtype", f"{name} is {_dtype_name(t.dtype)} on {t.device}; the kernel takes x's "
                                    f"{dtype} on {x.device}", dtype)
        wanted = tuple(x.shape) if name in op.matrices else (x.shape[-1],)
        if [str(s) for s in t.shape] != [str(s) for s in wanted]:
            return Verdict("shape", f"{name} has shape {_size_text(t.shape)}; the kernel takes "
                                    f"{_size_text(wanted)}", dtype)
    shape, cols = _static(x.shape), x.shape[-1]
    if shape is not None and (cols >= LIMIT or _rows(shape) >= LIMIT):
        return Verdict("shape", f"x has shape {list(shape)}: rows and columns must each be below 2**31", dtype)
    layout = _layout(op, tensors)
    if layout:
        return Verdict("layout", layout, dtype)
    verdict = _result(op, root, x, dtype)
    if verdict.kind:
        return verdict
    for name, _ in op.scalars:
        value = match.captures[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return Verdict("scalar", f"{name}: the kernel takes a number, the graph passes {value!r}", dtype)
    used = _used_outside(match, spellings, dtype)
    if used:
        return used
    for rule in pattern.rules:
        why_not = rules.why_not(rule, op.name, dtype)
        if why_not:
            return Verdict("legality", f"{rule} is not legal for {op.name} in {dtype} at preservation "
                                       f"{rules.preset!r} ({pattern.why}): {why_not}", dtype)
    return verdict


def _tensors(match: Match, names) -> tuple[dict, Verdict | None]:
    """The example tensors of the captures `names` (x first), or the verdict on the first that is
    not a tensor, or on x where it is not on a device the kernels run on."""
    tensors = {}
    for name in names:
        value = example(match.captures[name])
        if not isinstance(value, torch.Tensor):
            return tensors, Verdict("shape", f"{name}: the kernel takes a tensor, the graph passes "
                                             f"{match.captures[name]!r}")
        tensors[name] = value
    x = tensors["x"]
    if x.device.type not in DEVICES:
        return tensors, Verdict("device", f"x is on {x.device}; the kernels run on CUDA devices", _dtype_name(x.dtype))
    return tensors, None


def _used_outside(match: Match, spellings: Spellings, dtype: str) -> Verdict | None:
    """Nothing the pattern matched inside may be needed elsewhere: the kernel returns only its result."""
    inside = set(match.nodes)
    for node in match.nodes[1:]:
        others = [user.name for user in node.users if user not in inside]
        if others:
            return Verdict("users", f"{spellings.describe(node)} is used by {', '.join(others)} as well, and the "
                                    f"kernel does not return it", dtype)
    return None


def _rows(shape: tuple) -> int:
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return rows


def _layout(op, tensors: dict) -> str | None:
    for name, t in tensors.items():
        shape, strides = _static(t.shape), _static(t.stride())
        if shape is None or strides is None:
            continue
        if name in op.vectors:
            if shape[0] > 1 and strides[0] != 1:
                return f"{name} has stride {strides[0]}; the kernel takes a contiguous vector"
            continue
        try:
            arrays.row_stride(name, shape, strides)
        except ValueError as err:
            return str(err)
    return None


def _result(op, root: torch.fx.Node, x: torch.Tensor, dtype: str) -> Verdict:
    result = example(root)
    if not isinstance(result, torch.Tensor):
        return Verdict("shape", f"the graph's result is {type(result).__name__}, not one tensor", dtype)
    if result.dtype != x.dtype:
        return Verdict("dtype", f"the graph's result is {_dtype_name(result.dtype)}; the kernel returns x's {dtype}",
                       dtype)
    wanted = [str(s) for s in (x.shape if op.output == "matrix" else x.shape[:-1])]
    found = [str(s) for s in result.shape]
    if found == wanted:
        return Verdict(None, dtype=dtype)
    if found == wanted + ["1"]:
        return Verdict(None, dtype=dtype, keepdim=True)
    return Verdict("shape", f"the graph's result has shape {found}; the kernel's would have {wanted}", dtype)


# --- matrix patterns (inst.matmul with an epilogue) ---------------------------------------------

def check_matrix(pattern: Pattern, match: Match, root: torch.fx.Node, matrix, spellings: Spellings) -> Verdict:
    """Whether the instance's matrix kernels (`matrix`: aicg/matrix/dispatch.py's MatrixKernels, None
    without any) take this match: x's rows (K contiguous), w of N x K read as F.linear's weight (K
    contiguous) or its transpose, b of (N,) contiguous, r shaped like the result with contiguous rows,
    all in one 16-bit dtype, and a class of the instance for that dtype, those layouts and the
    pattern's epilogue (the build made it only where its fusion is legal)."""
    activation, has_bias, has_residual = matrix_epilogue(pattern)
    if matrix is None or not matrix.classes:
        return Verdict("operator", "this instance has no matrix kernels (no [[matmul]] entries in its profile, or "
                                   "none validated on the target)")
    names = ("x", "w", *(("b",) if has_bias else ()), *(("r",) if has_residual else ()))
    if has_bias and match.captures["b"] is None:   # F.linear(x, w, None): the pattern without a bias is that one
        return Verdict("structure", "the graph passes no bias")
    tensors, verdict = _tensors(match, names)
    if verdict:
        return verdict
    x, w = tensors["x"], tensors["w"]
    dtype = _dtype_name(x.dtype)
    for name, t in tensors.items():
        if t.dtype != x.dtype or t.device != x.device:
            return Verdict("dtype", f"{name} is {_dtype_name(t.dtype)} on {t.device}; the kernel takes x's {dtype} on "
                                    f"{x.device}", dtype)
    if x.ndim < 1 or w.ndim != 2 or str(x.shape[-1]) != str(w.shape[1]):
        return Verdict("shape", f"x of shape {_size_text(x.shape)} and w of shape {_size_text(w.shape)}: the kernel "
                                f"takes rows of K and a weight of N x K", dtype)
    result = example(root)
    wanted = [str(s) for s in (*x.shape[:-1], w.shape[0])]
    if not isinstance(result, torch.Tensor) or result.dtype != x.dtype or [str(s) for s in result.shape] != wanted:
        return Verdict("shape", f"the graph's result is not one {dtype} tensor of shape {wanted}", dtype)
    if has_bias and [str(s) for s in tensors["b"].shape] != [str(w.shape[0])]:
        return Verdict("shape", f"b has shape {_size_text(tensors['b'].shape)}; the kernel takes ({w.shape[0]},)", dtype)
    if has_residual and [str(s) for s in tensors["r"].shape] != wanted:
        return Verdict("shape", f"r has shape {_size_text(tensors['r'].shape)}; the kernel takes the result's {wanted}",
                       dtype)
    w_major, layout = _matrix_layout(tensors)
    if layout:
        return Verdict("layout", layout, dtype)
    epilogue = Epilogue(activation, has_bias, has_residual)
    if (dtype, "k", w_major, epilogue) not in matrix.classes:
        have = ", ".join(sorted(c.name for c in matrix.classes.values()))
        return Verdict("operator", f"this instance has no matrix kernels for {dtype}, layouts (A, B) k{w_major}, "
                                   f"epilogue {epilogue.name} (it has {have}): add that [[matmul]] class to its profile",
                       dtype)
    return _used_outside(match, spellings, dtype) or Verdict(None, dtype=dtype)


def _matrix_layout(tensors: dict) -> tuple[str, str | None]:
    """(w's contiguous dimension as the kernels name it: "k" for F.linear's weight, "mn" for its
    transpose; what the kernels do not take, or None). Symbolic sizes are checked when it runs."""
    w = tensors["w"]
    shape, strides = _static(w.shape), _static(w.stride())
    w_major = "k"
    if shape is not None and strides is not None:
        n, k = shape
        if strides[1] == 1 or k == 1:
            w_major = "k"
        elif strides[0] == 1 or n == 1:
            w_major = "mn"
        else:
            return "k", f"w has strides {list(strides)}: the kernels take a weight with one contiguous dimension"
    for name in ("x", "r"):
        t = tensors.get(name)
        if t is None or _static(t.shape) is None or _static(t.stride()) is None:
            continue
        try:
            arrays.row_stride(name, tuple(t.shape), t.stride())
        except ValueError as err:
            return w_major, str(err)
    b = tensors.get("b")
    if b is not None and _static(b.stride()) is not None and b.shape[0] > 1 and b.stride()[0] != 1:
        return w_major, f"b has stride {b.stride()[0]}; the kernel takes a contiguous vector"
    return w_major, None
