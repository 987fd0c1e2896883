"""Validating a matrix realisation on the device against float64.

For one problem, two trials of fresh inputs (aicg/matrix/reference.py):
  trial 0  the output poisoned (NaN bits) first, with 256 poisoned guard
           bytes on each side and NaN in any padding between rows; the kernel
           runs, then runs again on the same inputs (the bits must repeat)
  trial 1  new inputs into the same buffers, the output NOT poisoned: a kernel
           that leaves (or reads back) trial 0's result fails here
After each run: no poisoned element left in the M x N output (checked whole),
the guards and row padding untouched, the inputs unchanged, and every
checked row (all rows up to 512, else the first and last 64 and a random row
in every 128; all columns) within the bound of reference.py.

A failed comparison is described so that one device run can diagnose a
layout bug: how many elements, which rows and columns (as ranges), a few
examples, and for outputs up to 256 x 256 a map of 8 x 8 blocks.
"""
from __future__ import annotations

import time

import numpy as np

from ..dtypes import DTYPES
from ..errors import DeviceError
from ..runtime import driver
from . import reference
from .problem import Problem
from .templates import RULES

GUARD_BYTES = 256
HANG_SECONDS = 20.0          # a launch not finished by then is a hang (the worker is stopped)
MAP_LIMIT = 256              # outputs up to this many rows and columns get a block map
MAP_BLOCK = 8


def wait(stream: int = 0, seconds: float = HANG_SECONDS) -> None:
    """Return when `stream`'s work is done; DeviceError if it is not done within `seconds`."""
    from cuda.bindings import driver as cu
    deadline = time.monotonic() + seconds
    pause = 1e-5
    while True:
        (err,) = cu.cuStreamQuery(stream)
        if err == cu.CUresult.CUDA_SUCCESS:
            return
        if err != cu.CUresult.CUDA_ERROR_NOT_READY:
            driver.check((err,))
        if time.monotonic() > deadline:
            raise DeviceError(f"a launch did not finish within {seconds:g} s (hang guard)")
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


class Operands:
    """Device buffers of one problem: the inputs as stored, the output between guards."""

    def __init__(self, problem: Problem):
        self.problem = problem
        names = ["a", "b"] + (["bias"] if problem.epilogue.bias else []) + \
                (["residual"] if problem.epilogue.residual else [])
        self.inputs = {name: driver.Buffer(problem.elements(name) * 2) for name in names}
        self.c_bytes = problem.elements("c") * 2
        self.c = driver.Buffer(self.c_bytes + 2 * GUARD_BYTES)

    @property
    def pointers(self) -> dict[str, int]:
        return {**{name: b.ptr for name, b in self.inputs.items()}, "c": self.c.ptr + GUARD_BYTES}

    def upload(self, images: dict[str, np.ndarray]) -> None:
        for name, buffer in self.inputs.items():
            buffer.upload(images[name])

    def poison_output(self) -> None:
        self.c.fill_byte(0xFF)
        driver.synchronize()

    def output(self) -> tuple[np.ndarray, bool]:
        """(the output's bits as M x ldc uint16, whether the guards are intact)."""
        whole = self.c.download(np.uint8, self.c.nbytes)
        guards = np.concatenate([whole[:GUARD_BYTES], whole[GUARD_BYTES + self.c_bytes:]])
        bits = whole[GUARD_BYTES:GUARD_BYTES + self.c_bytes].view(np.uint16)
        p = self.problem
        if bits.size != p.m * p.ldc:   # the last row's padding lies past the allocation: stand in for it
            bits = np.concatenate([bits, np.full(p.m * p.ldc - bits.size, reference.POISON_BITS, np.uint16)])
        return bits.reshape(p.m, p.ldc), bool(np.all(guards == 0xFF))

    def inputs_intact(self, images: dict[str, np.ndarray]) -> bool:
        return all(self.inputs[n].download(np.uint16, img.size).tobytes() == img.tobytes()
                   for n, img in images.items() if n in self.inputs)

    def free(self) -> None:
        for b in [*self.inputs.values(), self.c]:
            b.free()


def nan_bits(dtype: str, bits: np.ndarray) -> np.ndarray:
    """Where 16-bit patterns are NaN (exponent all ones, mantissa not zero)."""
    exponent = {"bfloat16": 0x7F80, "float16": 0x7C00}[dtype]
    magnitude = bits & 0x7FFF
    return magnitude > exponent


def _ranges(indices) -> str:
    indices = sorted(set(int(i) for i in indices))
    if not indices:
        return ""
    parts, start, last = [], indices[0], indices[0]
    for i in indices[1:] + [None]:
        if i is not None and i == last + 1:
            last = i
            continue
        parts.append(f"{start}" if start == last else f"{start}-{last}")
        if i is not None:
            start = last = i
    return ",".join(parts[:24]) + (f",... ({len(parts)} ranges)" if len(parts) > 24 else "")


def describe(problem: Problem, rows: np.ndarray, got: np.ndarray, ref: np.ndarray, bad: np.ndarray,
             unwritten: np.ndarray) -> dict:
    """Where the output is wrong: counts, row and column ranges, examples, and a block map.
    `unwritten` is the whole output's M x N mask of poison left in place."""
    r_idx, c_idx = np.nonzero(bad)
    found = {"wrong": int(bad.sum()), "checked": int(bad.size), "unwritten": int(unwritten.sum()),
             "rows": _ranges(rows[r_idx]), "columns": _ranges(c_idx),
             "unwritten_rows": _ranges(np.nonzero(unwritten.any(axis=1))[0]),
             "unwritten_columns": _ranges(np.nonzero(unwritten.any(axis=0))[0]),
             "examples": [[int(rows[i]), int(j), float(got[i, j]), float(ref[i, j])]
                          for i, j in list(zip(r_idx, c_idx))[:6]]}
    if problem.m <= MAP_LIMIT and problem.n <= MAP_LIMIT and rows.size == problem.m:
        lines = []
        for r0 in range(0, problem.m, MAP_BLOCK):
            line = ""
            for c0 in range(0, problem.n, MAP_BLOCK):
                blk = (slice(r0, r0 + MAP_BLOCK), slice(c0, c0 + MAP_BLOCK))
                line += "n" if unwritten[blk].any() else ("x" if bad[blk].any() else ".")
            lines.append(line)
        found["map"] = lines   # one character per 8 x 8 block: . right, x wrong, n left unwritten
    return found


def compare(problem: Problem, bits: np.ndarray, logical: dict, rows: np.ndarray, splits: int,
            poisoned: bool, cached: tuple | None = None, rounded_sum: bool = False) -> dict:
    """One run's verdict; `bits` is the output as M x ldc uint16. `cached`: (ref, bound) for `rows`."""
    dtype = DTYPES[problem.dtype]
    body = bits[:, :problem.n]
    unwritten = nan_bits(problem.dtype, body) if poisoned else np.zeros(body.shape, dtype=bool)
    padding_intact = (not poisoned) or bool(np.all(bits[:, problem.n:] == reference.POISON_BITS))
    ref, bound = cached if cached is not None else reference.expected(problem, logical, rows, splits, rounded_sum)
    got = dtype.decode(body[rows]).astype(np.float64).reshape(rows.size, problem.n)
    error = np.abs(got - ref)
    with np.errstate(invalid="ignore"):
        ratio = np.where(np.isnan(got), np.inf, error / bound)
    bad = ~(ratio <= 1.0)
    result = {"poisoned": poisoned, "unwritten": int(unwritten.sum()), "padding_intact": padding_intact,
              "checked_rows": int(rows.size), "worst_error_over_bound": float(np.nanmax(ratio)) if ratio.size else 0.0,
              "max_abs_error": float(np.nanmax(np.where(np.isnan(got), np.inf, error))) if error.size else 0.0,
              "within_bound": not bad.any() and not unwritten.any()}
    if not result["within_bound"]:
        result["mismatch"] = describe(problem, rows, got, ref, bad, unwritten)
    return result


def splits_of(template: str, geometry) -> int:
    """The parts each output's K sum is cut into at this launch (one more rounding each in the bound):
    the geometry's count, or for a template whose geometry does not give one, the decode kernel's
    grid rows."""
    splits = getattr(geometry, "splits", None)
    if splits is not None:
        return int(splits)
    return geometry.grid[1] if template == "gemv" else 1


def validate(kernel, problem: Problem, trials: list[dict], rows: np.ndarray, operands: Operands,
             references: list[tuple], hang_seconds: float = HANG_SECONDS, stream: int = 0) -> dict:
    """Run `kernel` (an aicg.matrix.launch.MatmulKernel) on `problem` for each trial's logical
    inputs (reference.draw) and judge it; `references[t]` is trial t's (ref, bound) on `rows`."""
    geometry = kernel.geometry(problem)
    splits = splits_of(kernel.real.template, geometry)
    checks, repeatable = [], True
    for t, logical in enumerate(trials):
        images = reference.stored(problem, logical)
        operands.upload(images)
        poisoned = t == 0
        if poisoned:
            operands.poison_output()
        kernel.launch(problem, operands.pointers, stream)
        wait(stream, hang_seconds)
        bits, guards = operands.output()
        result = compare(problem, bits, logical, rows, splits, poisoned, references[t],
                         RULES[kernel.real.template].rounds_sum(kernel.real))
        if t == 0:
            kernel.launch(problem, operands.pointers, stream)
            wait(stream, hang_seconds)
            again, _ = operands.output()
            repeatable = bool(np.array_equal(again, bits))
            result["repeatable"] = repeatable
        result.update(trial=t, guards_intact=guards, inputs_intact=operands.inputs_intact(images))
        result["passed"] = (result["within_bound"] and guards and result["padding_intact"]
                            and result["inputs_intact"] and result.get("repeatable", True))
        checks.append(result)
    passed = all(c["passed"] for c in checks)
    return {"status": "passed" if passed else "failed", "checks": checks, "splits": splits,
            "grid": list(geometry.grid), "cluster": geometry.cluster}
