"""Checking a backward candidate's cubin on the device, as aicg/validate/check.py checks a forward one.

For every check shape and trial: fresh random inputs (aicg/backward/ops.py draws them, a saved
softmax output being the forward's own on drawn logits), every output and workspace poisoned
with NaN bytes and guarded by poisoned bytes on both sides, every output compared elementwise
with the float64 gradient on the same rounded inputs: |y - ref| <= atol + rtol * scale. The
candidate runs twice, and once with its rows part split over two launches; differing bits fail
it where the profile demands determinism. Then it runs on new inputs into the unpoisoned outputs
(a kernel that keeps a previous result fails), and the inputs on the device, padding between
strided rows included, must be what was uploaded.

Every row of a shape is checked: the column sums read them all.
"""
from __future__ import annotations

import numpy as np

from .. import validate
from ..semantics import accuracy
from ..dtypes import DTYPES, DType
from ..runtime import driver
from ..validate.check import OUTPUT_GUARD_BYTES, POISON_BYTE
from . import codegen
from .ops import BACKWARD_OPS, BackwardOp, draw, reference
from .space import Candidate, Space

WORKSPACE_BYTES = 4      # the row statistics and the partial sums are floats
DRAWN_ELEMENTS = 1 << 24   # a timing's draw of inputs: larger shapes repeat its rows


class Guarded:
    """A device buffer of `nbytes` between two poisoned guards; `wrote_outside` notes any change to them."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.buffer = driver.Buffer(self.nbytes + 2 * OUTPUT_GUARD_BYTES)
        self.ptr = self.buffer.ptr + OUTPUT_GUARD_BYTES
        self.wrote_outside = False

    def poison(self) -> None:
        self.buffer.fill_byte(POISON_BYTE)

    def read(self, dtype) -> np.ndarray:
        whole = self.buffer.download(np.uint8, self.buffer.nbytes)
        guards = np.concatenate([whole[:OUTPUT_GUARD_BYTES], whole[OUTPUT_GUARD_BYTES + self.nbytes:]])
        self.wrote_outside |= bool(np.any(guards != POISON_BYTE))
        return whole[OUTPUT_GUARD_BYTES:OUTPUT_GUARD_BYTES + self.nbytes].view(dtype)

    def free(self) -> None:
        self.buffer.free()


class Buffers:
    """Device inputs, outputs and workspace of one candidate at one shape; input matrices may have
    rows `stride` elements apart, the padding between them NaN bytes."""

    def __init__(self, space: Space, candidate: Candidate, rows: int, cols: int, stride: int | None = None):
        self.space, self.candidate = space, candidate
        self.op: BackwardOp = BACKWARD_OPS[candidate.op]
        self.dtype: DType = DTYPES[candidate.dtype]
        self.rows, self.cols = rows, cols
        self.stride = cols if stride is None else stride
        if self.stride < cols:
            raise ValueError(f"a row stride of {self.stride} elements is shorter than a row of {cols}")
        size = self.dtype.size
        self.inputs = {name: driver.Buffer(rows * self.stride * size) for name in self.op.matrices}
        self.inputs.update({name: driver.Buffer(cols * size) for name in self.op.vectors})
        self.outputs = {name: Guarded(int(np.prod(self.op.output_shape(name, rows, cols))) * size)
                        for name in self.op.outputs}
        self.workspace = {name: Guarded(n * WORKSPACE_BYTES)
                          for name, n in codegen.workspace_floats(space, candidate, rows, cols).items()}

    def stored(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inputs as the device holds them: matrices widened to the row stride with poison."""
        if self.stride == self.cols:
            return inputs
        out = dict(inputs)
        for name in self.op.matrices:
            a = inputs[name]
            wide = np.full((self.rows, self.stride * a.dtype.itemsize), POISON_BYTE, dtype=np.uint8)
            wide[:, :self.cols * a.dtype.itemsize] = np.ascontiguousarray(a).view(np.uint8).reshape(self.rows, -1)
            out[name] = wide.view(a.dtype)
        return out

    def upload(self, inputs: dict[str, np.ndarray]) -> None:
        for name, host in self.stored(inputs).items():
            self.inputs[name].upload(host)

    def inputs_equal(self, inputs: dict[str, np.ndarray]) -> bool:
        return all(self.inputs[n].download(a.dtype, a.size).tobytes() == np.ascontiguousarray(a).tobytes()
                   for n, a in self.stored(inputs).items())

    def _values(self, first_row: int = 0) -> dict:
        """Every argument's value for a launch whose rows part starts at `first_row`."""
        size, op = self.dtype.size, self.op
        values = {name: b.ptr + first_row * self.stride * size for name, b in self.inputs.items()
                  if name in op.matrices}
        values.update({name: b.ptr for name, b in self.inputs.items() if name in op.vectors})
        values["dx"] = self.outputs["dx"].ptr + first_row * self.cols * size
        values.update({name: self.outputs[name].ptr for name in op.column_outputs})
        if "stats" in self.workspace:
            values["stats"] = self.workspace["stats"].ptr + first_row * op.stats_per_row * WORKSPACE_BYTES
        if "partials" in self.workspace:
            first_chunk = first_row // values_of_chunks(self)[0] if self.candidate.partials_in_rows else 0
            values["partials"] = (self.workspace["partials"].ptr
                                  + first_chunk * len(op.column_outputs) * self.cols * WORKSPACE_BYTES)
        values.update({"cols": self.cols, "g_stride": self.stride, f"{op.saved}_stride": self.stride,
                       **dict(op.scalars)})
        values.update(codegen.column_values(self.space, self.candidate, self.rows))
        return values

    def launch(self, kernels: dict, split: int | None = None) -> None:
        """Every launch of the candidate, queued: the rows part (in two launches split at row
        `split`, if given), then the column passes."""
        parts = [(0, self.rows)] if split is None else [(0, split), (split, self.rows - split)]
        for first, count in parts:
            if count > 0:    # a grid of no blocks is an error
                _launch(kernels, codegen.rows_launch(self.space, self.candidate, count, self.cols),
                        {**self._values(first), "rows": count})
        values = {**self._values(), "rows": self.rows}
        for launch in codegen.column_launches(self.space, self.candidate, self.rows, self.cols):
            _launch(kernels, launch, values)

    def run(self, kernels: dict, split: int | None = None, poison: bool = True) -> dict[str, np.ndarray]:
        """Poison the outputs and workspace (unless not `poison`), launch, read the outputs back."""
        if poison:
            for b in (*self.outputs.values(), *self.workspace.values()):
                b.poison()
        self.launch(kernels, split)
        driver.synchronize()
        for b in self.workspace.values():
            b.read(np.uint8)      # only for its guards
        return {name: b.read(self.dtype.storage) for name, b in self.outputs.items()}

    def split_row(self) -> int | None:
        """Where the rows part may be cut into two launches with the same bits: anywhere for row sums
        alone, at a chunk's edge where the rows part also sums the columns (None: one chunk)."""
        if not self.candidate.partials_in_rows:
            return (self.rows + 1) // 2
        chunk, chunks = values_of_chunks(self)
        return chunk * (chunks // 2) if chunks > 1 else None

    @property
    def wrote_outside(self) -> bool:
        return any(b.wrote_outside for b in (*self.outputs.values(), *self.workspace.values()))

    def free(self) -> None:
        for b in (*self.inputs.values(), *self.outputs.values(), *self.workspace.values()):
            b.free()


def values_of_chunks(buffers: Buffers) -> tuple[int, int]:
    """(rows a chunk, chunks) of the column sums at the buffers' shape."""
    found = codegen.column_values(buffers.space, buffers.candidate, buffers.rows)
    return found["chunk_rows"], found["chunks"]


def _launch(kernels: dict, launch: codegen.Launch, values: dict) -> None:
    kernels[launch.entry].launch(launch.grid, launch.block, list(zip(launch.values(values), launch.kinds())))


def compare(dtype: DType, ref: np.ndarray, scale: np.ndarray, stored: np.ndarray, tolerance) -> dict:
    """An output against its float64 reference: elements unwritten (NaN where the reference has
    none), the worst error over its bound and the largest error; `within_bound` where all fit."""
    y = dtype.decode(stored).astype(np.float64).reshape(ref.shape)
    rtol, atol = tolerance
    unwritten = int(np.count_nonzero(np.isnan(y) & ~np.isnan(ref)))
    err = np.abs(y - ref)
    bound = atol + rtol * scale
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1), np.where(err > 0, np.inf, 0.0))
    ratio = np.where(np.isnan(ref) & np.isnan(y), 0.0, np.where(np.isnan(ratio), np.inf, ratio))
    err = np.where(np.isnan(err) & ~np.isnan(ref), np.inf, np.nan_to_num(err, nan=0.0))
    return {"unwritten": unwritten, "worst_error_over_bound": float(ratio.max()) if ratio.size else 0.0,
            "max_abs_error": float(err.max()) if err.size else 0.0,
            "within_bound": unwritten == 0 and bool(np.all(ratio <= 1.0))}


def _compare_all(op: BackwardOp, dtype: DType, inputs, outputs, tolerance) -> dict[str, dict]:
    expected = reference(op, dtype, inputs)
    return {name: compare(dtype, *expected[name], outputs[name], tolerance) for name in op.outputs}


def _same_bits(a: dict, b: dict) -> bool:
    return all(a[name].tobytes() == b[name].tobytes() for name in a)


def check_shape(space: Space, candidate: Candidate, kernels: dict, shape, trials: int, tolerance,
                deterministic: bool, rng) -> list[dict]:
    """`shape`: (rows, cols) or (rows, cols, row stride of the input matrices)."""
    rows, cols, *rest = shape
    stride = rest[0] if rest else cols
    op, dtype = BACKWARD_OPS[candidate.op], DTYPES[candidate.dtype]
    buffers = Buffers(space, candidate, rows, cols, stride)
    results = []
    try:
        for trial in range(trials):
            inputs = draw(op, dtype, rows, cols, trial, rng)
            buffers.upload(inputs)
            first = buffers.run(kernels)
            again = buffers.run(kernels)
            split = buffers.run(kernels, split=buffers.split_row())   # another launch configuration
            intact = buffers.inputs_equal(inputs)
            outputs = _compare_all(op, dtype, inputs, first, tolerance)
            fresh = draw(op, dtype, rows, cols, trial + 1, rng)
            buffers.upload(fresh)
            reused = _compare_all(op, dtype, fresh, buffers.run(kernels, poison=False), tolerance)
            result = {"shape": [rows, cols] + ([stride] if stride != cols else []), "trial": trial,
                      "outputs": outputs, "input_intact": intact, "output_bounds_kept": not buffers.wrote_outside,
                      "repeatable": _same_bits(first, again) and _same_bits(first, split),
                      "fresh_output": all(r["within_bound"] for r in reused.values())}
            result["within_bound"] = all(r["within_bound"] for r in outputs.values())
            result["passed"] = (result["within_bound"] and result["fresh_output"] and intact
                                and result["output_bounds_kept"] and (result["repeatable"] or not deterministic))
            results.append(result)
    finally:
        buffers.free()
    return results


def load_kernels(cubin: bytes, candidate: Candidate) -> dict:
    return {entry: driver.Kernel(cubin, entry) for entry in codegen.entries(candidate)}


def run(space: Space, cubin: bytes, candidate: Candidate, *, tolerance, deterministic: bool, check_shapes,
        trials: int, device) -> dict:
    if trials < 1 or not check_shapes:
        raise ValueError(f"a validation needs trials >= 1 and shapes to check (got {trials}, "
                         f"{len(check_shapes)} shapes): nothing checked is no pass")
    rng = np.random.default_rng()   # fresh entropy: every validation draws new inputs
    kernels = load_kernels(cubin, candidate)
    try:
        checks = [c for shape in check_shapes
                  for c in check_shape(space, candidate, kernels, shape, trials, tolerance, deterministic, rng)]
    finally:
        for kernel in kernels.values():
            kernel.unload()
    return {"status": "passed" if checks and all(c["passed"] for c in checks) else "failed",
            "device": device.name, "candidate": candidate.id, "checks": checks}


def time_candidates(space: Space, kernels: list[tuple[bytes, Candidate]], shape, repetitions: int,
                    flush) -> list[float]:
    """Median seconds of each (cubin, candidate) of one operator and dtype at `shape`: every launch
    of it (the rows part and the column passes: the weights' gradients a training step asks for),
    on one draw of inputs, timed as aicg/matrix/timing.py times a launch, `flush` (its L2Flush)
    evicting the L2 before each run. At most DRAWN_ELEMENTS are drawn; more rows repeat them (the
    values do not change a launch's time, the rows' count does)."""
    if repetitions < 1 or not kernels:
        raise ValueError(f"timing needs repetitions >= 1 and kernels (got {repetitions}, {len(kernels)})")
    from ..matrix import timing
    rows, cols = shape
    op, dtype = BACKWARD_OPS[kernels[0][1].op], DTYPES[kernels[0][1].dtype]
    drawn = draw(op, dtype, min(rows, max(1, DRAWN_ELEMENTS // cols)), cols, 0, np.random.default_rng())
    inputs = {name: np.resize(a, (rows, cols)) if name in op.matrices else a for name, a in drawn.items()}
    seconds = []
    for cubin, candidate in kernels:
        loaded = load_kernels(cubin, candidate)
        buffers = Buffers(space, candidate, rows, cols)
        try:
            buffers.upload(inputs)
            seconds.append(timing.median_seconds(lambda: buffers.launch(loaded), flush, repetitions)["median_seconds"])
        finally:
            buffers.free()
            for kernel in loaded.values():
                kernel.unload()
    return seconds


def why_failed(report: dict) -> str:
    """What a failed report found first, in a line ("" for a pass)."""
    if report["status"] == "unvalidated":
        return report.get("reason", "")
    if report.get("fault"):
        return f"the kernel faulted: {report['fault']}"
    for c in report.get("checks", []):
        if c["passed"]:
            continue
        found = [f"{name}: {o['unwritten']} outputs unwritten" for name, o in c["outputs"].items() if o["unwritten"]]
        found += [f"{name}: error {o['worst_error_over_bound']:.3g}x the bound (max |y - ref| {o['max_abs_error']:.3g})"
                  for name, o in c["outputs"].items() if not o["within_bound"] and not o["unwritten"]]
        found += [what for key, what in (("input_intact", "input overwritten"),
                                         ("output_bounds_kept", "wrote outside its outputs"),
                                         ("repeatable", "bits differ between runs"),
                                         ("fresh_output", "a second input gave a wrong output")) if c.get(key) is False]
        return f"{'x'.join(map(str, c['shape']))} trial {c['trial']}: {', '.join(found) or 'check failed'}"
    return "" if report["status"] == "passed" else "failed"


# --- on the target, in a worker process ----------------------------------------------------

def not_the_target(dev, hardware) -> str | None:
    """Why this machine's GPU cannot stand for the target; None where it can."""
    if dev is None:
        return "no GPU on this machine"
    if dev.name != hardware.name or tuple(dev.compute_capability) != tuple(hardware.compute_capability):
        return (f"this machine's GPU is {dev.name} (sm_{dev.compute_capability[0]}{dev.compute_capability[1]}), "
                f"not the target {hardware.name}")
    return None


def validate_on_device(cubin: bytes, candidate: Candidate, hardware, *, tolerance, deterministic: bool,
                       check_shapes, trials: int) -> dict:
    """run()'s report from a worker process (aicg/validate/isolated.py), so that a kernel that
    faults or never finishes fails the candidate and leaves the caller's process unharmed;
    "unvalidated", with the reason, where this machine's GPU is not the target."""
    dev = driver.probe_device()
    reason = not_the_target(dev, hardware)
    if reason:
        return {"status": "unvalidated", "reason": reason}
    from ..validate import isolated
    reply = isolated.worker.call("aicg.backward.check:check_here", kwargs={
        "cubin": cubin, "candidate": candidate.as_record(), "tolerance": list(tolerance),
        "deterministic": deterministic, "check_shapes": [list(s) for s in check_shapes], "trials": trials})
    if "fault" in reply:
        return {"status": "failed", "device": dev.name, "candidate": candidate.id, "fault": reply["fault"],
                "checks": []}
    return reply["result"]


def can_time(hardware) -> bool:
    """Whether this machine's GPU can validate and time kernels for `hardware`."""
    return not_the_target(driver.probe_device(), hardware) is None


def time_on_device(kernels: list[tuple[bytes, Candidate]], hardware, shape, repetitions: int) -> list[float] | None:
    """time_candidates() from a worker process; None where this machine's GPU is not the target (or
    a kernel faulted there), and the caller keeps the ladder's order."""
    if not can_time(hardware):
        return None
    from ..validate import isolated
    reply = isolated.worker.call("aicg.backward.check:time_here", kwargs={
        "kernels": [[cubin, candidate.as_record()] for cubin, candidate in kernels], "shape": list(shape),
        "repetitions": repetitions})
    return None if "fault" in reply else reply["result"]


def time_here(kernels: list, shape, repetitions: int) -> list[float]:
    """time_candidates() on this process's GPU with the shipped space (the worker's side of time_on_device)."""
    from ..matrix.timing import L2Flush
    from .space import shipped
    return time_candidates(shipped(), [(bytes(cubin), Candidate.from_record(record)) for cubin, record in kernels],
                           tuple(shape), repetitions, L2Flush("write"))


def check_here(cubin: bytes, candidate: dict, tolerance, deterministic: bool, check_shapes, trials: int) -> dict:
    """run() on this process's GPU with the shipped space (the worker's side of validate_on_device)."""
    from .space import shipped
    return run(shipped(), cubin, Candidate.from_record(candidate), tolerance=tuple(tolerance),
               deterministic=deterministic, check_shapes=[tuple(s) for s in check_shapes], trials=trials,
               device=driver.probe_device())


def check_shapes(space: Space, candidate: Candidate, rtol: float, failure_probability: float, shape) -> tuple:
    """The build's awkward shapes and `shape`, their rows cut to the longest the candidate's order
    keeps `rtol` on, and to the longest it holds whole where it sums the columns in the rows' pass
    (it is never run on longer ones)."""
    from .space import held_cols, longest_row
    longest = longest_row(candidate.op, candidate.dtype, candidate.rows, rtol, failure_probability)
    if candidate.partials_in_rows:
        held = held_cols(candidate.rows, candidate.dtype)
        longest = held if longest is None else min(longest, held)
    return accuracy.clip_shapes(validate.AWKWARD_SHAPES + (tuple(shape),), longest)
