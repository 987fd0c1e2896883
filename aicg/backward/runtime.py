"""An instance's backward kernels on PyTorch tensors: what its operators' autograd calls.

`inst.backward(forward_op, g, saved, w, eps=..., weight_grads=...)` returns the gradients the
kernels computed, or None where the instance has no backward kernel for the call, and the caller
(aicg/runtime/torch_ops.py) uses PyTorch's formula instead. Why a call was declined is kept in
`declined` (and logged once per operator, dtype and row length); what served a call, in `served`.

Kernels launch on PyTorch's current stream with no host synchronisation; outputs and workspace
(the row statistics and partial column sums, floats) come from PyTorch's allocator, so a CUDA
graph captures the launches, once the first call at a shape has compiled and validated them.
"""
from __future__ import annotations

import logging
import math
import threading

from .. import digest
from ..errors import CompileError
from ..runtime import arrays, driver
from ..runtime.memo import Memo
from . import codegen
from .jit import BackwardJit
from .ops import BACKWARD_OPS, BY_FORWARD

log = logging.getLogger("aicg.jit")
DTYPES = ("float32", "bfloat16", "float16")


class Backward:
    """The backward kernels of one loaded instance (aicg/runtime/instance.py `Instance`), or of a
    BackwardJit given directly (`jit=`: the bench's, with a planning of its own)."""

    def __init__(self, instance=None, jit: BackwardJit | None = None):
        if (instance is None) == (jit is None):
            raise TypeError("Backward takes an instance or a jit, one of them")
        self._instance = instance
        self._jit: BackwardJit | None = jit
        self._lock = threading.Lock()
        self._by_shape: dict[tuple, tuple | str] = Memo()     # a lookup per distinct shape, bounded
        self._loaded: dict[tuple[str, int], dict] = {}   # (cubin digest, device) -> entry -> driver.Kernel
        self.served: dict[tuple, str] = {}       # (forward op, dtype, rows, cols) -> candidate
        self.declined: dict[tuple, str] = {}     # (forward op, dtype, cols) -> why PyTorch's formula ran

    @property
    def events(self) -> list[dict]:
        """What the backward JIT compiled and validated in this process, with times."""
        return self._jit.events if self._jit is not None else []

    def jit(self) -> BackwardJit | str:
        if self._jit is None:
            main = self._instance.jit
            if main is None or not main.available():
                return ("the instance was loaded with jit=False or has no planning snapshot (source/): backward "
                        "kernels are compiled on first use")
            try:
                self._jit = BackwardJit(self._instance.path, main.planning(), main.signing_key,
                                        self._instance.allow_unvalidated)
            except (RuntimeError, ValueError) as err:   # a snapshot that does not plan, or lacks a rule named here
                return f"the instance's planning snapshot does not serve the backward families: {err}"
        return self._jit

    def __call__(self, forward: str, g, saved, w=None, *, eps: float | None = None, weight_grads: bool = False):
        """(dx,) for softmax and log-softmax, (dx, dw) for rmsnorm, (dx, dw, db) for layernorm (dw and
        db None unless `weight_grads`), or None where the kernels cannot serve the call."""
        op = BY_FORWARD[forward]
        cols = saved.shape[-1] if saved.dim() else 0
        dtype = str(saved.dtype).rsplit(".", 1)[-1]
        reason = self._unsupported(saved, dtype)
        if reason:
            return self._decline(forward, dtype, cols, reason)
        if tuple(g.shape) != tuple(saved.shape):
            return self._decline(forward, dtype, cols, f"g: expected shape {tuple(saved.shape)}, got {tuple(g.shape)}")
        rows = math.prod(saved.shape[:-1])
        if g.dtype != saved.dtype:
            g = g.to(saved.dtype)
        g, saved = _rows_of(g), _rows_of(saved)
        gv, sv = arrays.view(g, "g"), arrays.view(saved, op.saved)
        if max(rows, cols, gv.row_stride, sv.row_stride) >= 2**31:
            return self._decline(forward, dtype, cols, "rows, cols and row strides must each be below 2**31")
        wants_columns = bool(op.column_outputs) and weight_grads
        if rows == 0 or cols == 0:   # nothing to compute: a sum over no rows is zero
            return (saved.new_empty(saved.shape),
                    *(w.new_zeros(cols) if wants_columns else None for _ in op.column_outputs))
        found = self._kernels(forward, dtype, sv.device, rows, cols)
        if isinstance(found, str):
            return self._decline(forward, dtype, cols, found)
        candidate, kernels = found
        gradients = launch(self._jit.space, candidate, kernels, g, saved, w, eps=eps, weight_grads=weight_grads)
        self.served[(forward, dtype, rows, cols)] = candidate.id
        return gradients

    @staticmethod
    def _unsupported(saved, dtype: str) -> str | None:
        if not saved.is_cuda:
            return "the tensors are not on a CUDA device"
        if dtype not in DTYPES:
            return f"no backward kernels for {dtype} (they take {', '.join(DTYPES)})"
        if saved.dim() == 0:
            return "x: expected at least one dimension (rows are the last one)"
        return None

    def _decline(self, forward: str, dtype: str, cols: int, reason: str) -> None:
        key = (forward, dtype, cols)
        if self.declined.get(key) != reason:
            self.declined[key] = reason
            log.info("aicg: %s %s on rows of %d: backward by PyTorch's formula (%s)", forward, dtype, cols, reason)
        return None

    def _kernels(self, forward: str, dtype: str, device: int, rows: int, cols: int):
        """(candidate, its loaded entries) for the shape, or why there are none."""
        key = (forward, dtype, device, rows, cols)
        found = self._by_shape.get(key)
        if found is None:
            with self._lock:
                jit = self.jit()
                if isinstance(jit, str):
                    found = jit
                else:
                    try:
                        chosen = jit.kernel_for(BY_FORWARD[forward].name, dtype, rows, cols)
                    except (CompileError, OSError) as err:
                        chosen = f"the backward JIT failed: {err}"
                    found = chosen if isinstance(chosen, str) else (chosen.candidate, self._load(chosen, device))
                self._by_shape[key] = found
        return found

    def _load(self, chosen, device: int) -> dict:
        key = (digest.of_bytes(chosen.cubin), device)
        if key not in self._loaded:
            self._loaded[key] = load(chosen, device)
        return self._loaded[key]


def load(chosen, device: int) -> dict:
    """A chosen candidate's entries loaded on `device` (entry -> driver.Kernel)."""
    driver.use_primary_context(device)
    return {entry: driver.Kernel(chosen.cubin, entry) for entry in codegen.entries(chosen.candidate)}


def launch(space, candidate, kernels: dict, g, saved, w=None, *, eps: float | None = None,
           weight_grads: bool = False) -> tuple:
    """The candidate's launches on PyTorch's current stream for CUDA tensors `g` and `saved` of one
    shape and dtype (rows evenly apart, the last dimension contiguous), at least one row of at least
    one element; returns (dx, *the vectors' gradients, None unless weight_grads)."""
    import torch
    op = BACKWARD_OPS[candidate.op]
    gv, sv = arrays.view(g, "g"), arrays.view(saved, op.saved)
    rows, cols = math.prod(sv.shape[:-1]), sv.shape[-1]
    dx = saved.new_empty(saved.shape)
    values = {"g": gv.ptr, op.saved: sv.ptr, "dx": dx.data_ptr(), "rows": rows, "cols": cols,
              "g_stride": gv.row_stride, f"{op.saved}_stride": sv.row_stride}
    if "w" in op.vectors:
        w = w.contiguous() if w.dtype == saved.dtype else w.to(saved.dtype).contiguous()
        values["w"] = w.data_ptr()
    values.update({name: float(eps if eps is not None else default) for name, default in op.scalars})
    outputs: dict = {}
    launches = [codegen.rows_launch(space, candidate, rows, cols)]
    if op.column_outputs:
        floats = codegen.workspace_floats(space, candidate, rows, cols)
        if "stats" in floats:
            stats = saved.new_empty(floats["stats"], dtype=torch.float32)
            values["stats"] = stats.data_ptr()
        # a rows part that writes the partial sums skips them at a null pointer
        values.update({"partials": 0, **codegen.column_values(space, candidate, rows)})
        if weight_grads:
            partials = saved.new_empty(floats["partials"], dtype=torch.float32)
            outputs = {name: saved.new_empty(cols) for name in op.column_outputs}
            values.update({"partials": partials.data_ptr(), **{n: t.data_ptr() for n, t in outputs.items()}})
            launches += codegen.column_launches(space, candidate, rows, cols)
    stream = arrays.current_stream(sv)
    for each in launches:
        kernels[each.entry].launcher(each.kinds())(each.grid, (each.block, 1, 1), each.values(values), stream)
    # the workspace is freed on return: PyTorch's allocator reuses it only for work queued after these launches
    return (dx, *(outputs.get(name) for name in op.column_outputs))


def _rows_of(t):
    """`t` itself where the kernels take its layout (rows evenly apart, last dimension contiguous), else a copy."""
    try:
        arrays.row_stride("x", tuple(t.shape), t.stride())
        return t
    except ValueError:
        return t.contiguous()
