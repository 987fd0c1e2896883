"""Checking and timing one cubin on the device.

Correctness: for every check shape and trial, fresh random inputs (a new
draw each time, from a different distribution per trial), the output
poisoned with NaN bytes before the launch, the result compared elementwise
with a float64 reference on the same rounded inputs:
|y - ref| <= atol + rtol * scale (scale per operator, see aicg/ops.py). A
poisoned element left in the output fails the check. The kernel runs twice
on each input; differing bits fail it when the profile demands determinism.
Large shapes are checked on their first ROWS_CHECKED rows, and long rows on
as many as ELEMENTS_CHECKED elements allow (never fewer than
MIN_ROWS_CHECKED): the kernel sees the full row length, the float64
reference stays cheap (a bfloat16 softmax on 256 rows of 32768: 1.2 s per
comparison on a development CPU; validation compares twice per trial).

Every check also re-runs the kernel on new inputs without poisoning the
output (a kernel that keeps or reads back a previous result fails), and
compares the inputs on the device with what was uploaded (a kernel must not
write them). A timed launch faster than the memory can move its bytes is
rejected: its work was skipped or hidden from the timer.

What the profile demands decides what passes: the bound always; identical
bits over repeated runs and over a launch split in two where determinism is
asked; bit equality with the operator's reference-order emulation (ops.py)
where bitwise order is asked.

Timing: device events around the launch alone, after warm-up, with the L2
flushed (a memset of twice its size) before each repetition; the median.
"""
from __future__ import annotations

import numpy as np

from .. import codegen
from ..dtypes import DTYPES, DType
from ..ops import OPERATORS, Operator
from ..runtime import driver

ROWS_CHECKED = 256
MIN_ROWS_CHECKED = 64
ELEMENTS_CHECKED = 1 << 21
PLAUSIBLE_FRACTION = 1.1  # of the datasheet DRAM bandwidth: no honest launch moves its bytes faster
POISON_BYTE = 0xFF     # all-ones bytes are a NaN in float32 and in bfloat16
# Poisoned bytes on either side of the output, read back after every checked launch: a kernel
# that writes outside its output would corrupt a caller's memory and pass every other check.
# 256 keeps the output as aligned as its allocation.
OUTPUT_GUARD_BYTES = 256
WARMUP = 3


def draw(op: Operator, dtype: DType, rows: int, cols: int, trial: int, rng) -> dict[str, np.ndarray]:
    """Stored (device-format) inputs; odd trials are shifted and scaled."""
    scale, shift = (1.0, 0.0) if trial % 2 == 0 else (4.0, 3.0)
    arrays = {"x": rng.standard_normal((rows, cols), dtype=np.float32) * scale + shift}
    for name in op.matrices:
        arrays[name] = rng.standard_normal((rows, cols), dtype=np.float32) * scale
    if "w" in op.vectors:
        arrays["w"] = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    if "b" in op.vectors:
        arrays["b"] = rng.standard_normal(cols, dtype=np.float32)
    return {name: dtype.encode(a) for name, a in arrays.items()}


class Buffers:
    """Device inputs and output for one (operator, dtype, shape). Input matrices may have rows
    `stride` elements apart (stride >= cols); the padding between rows holds NaN bytes, so a
    kernel that reads past a row's end (or ignores the stride) fails its check."""

    def __init__(self, op: Operator, dtype: DType, rows: int, cols: int, stride: int | None = None):
        self.op, self.dtype, self.rows, self.cols = op, dtype, rows, cols
        self.stride = cols if stride is None else stride
        if self.stride < cols:
            raise ValueError(f"a row stride of {self.stride} elements is shorter than a row of {cols}")
        self.out_count = int(np.prod(op.output_shape(rows, cols)))
        self.buffers = {name: driver.Buffer(rows * self.stride * dtype.size) for name in op.input_matrices()}
        self.buffers["y"] = driver.Buffer(self.out_count * dtype.size + 2 * OUTPUT_GUARD_BYTES)
        self.wrote_outside = False   # whether any launch checked so far wrote into the guards
        for name in op.vectors:
            self.buffers[name] = driver.Buffer(cols * dtype.size)

    def stored(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inputs as the device holds them: matrices widened to the row stride with poison."""
        if self.stride == self.cols:
            return inputs
        out = dict(inputs)
        for name in self.op.input_matrices():
            a = inputs[name]
            wide = np.full((self.rows, self.stride * a.dtype.itemsize), POISON_BYTE, dtype=np.uint8)
            wide[:, :self.cols * a.dtype.itemsize] = np.ascontiguousarray(a).view(np.uint8).reshape(self.rows, -1)
            out[name] = wide.view(a.dtype)
        return out

    def upload(self, inputs: dict[str, np.ndarray]) -> None:
        for name, host in self.stored(inputs).items():
            self.buffers[name].upload(host)

    def launch(self, kernel, params: dict, first_row: int = 0, rows: int | None = None) -> None:
        """Launch over rows [first_row, first_row + rows) only (all by default)."""
        rows = self.rows - first_row if rows is None else rows
        if rows <= 0:   # the second half of a one-row split: nothing to launch (a grid of no blocks is an error)
            return
        out_row = self.out_count // self.rows * self.dtype.size
        offsets = {name: first_row * self.stride * self.dtype.size for name in self.op.input_matrices()}
        offsets["y"] = OUTPUT_GUARD_BYTES + first_row * out_row
        values = {"rows": (rows, "int"), "cols": (self.cols, "int")}
        values.update({name: (self.stride, "int") for name in self.op.stride_names()})
        values.update({name: (value, "float") for name, value in self.op.scalars})
        args = [values[n] if n in values else (self.buffers[n].ptr + offsets.get(n, 0), "ptr")
                for n in self.op.argument_names()]
        grid, block, shared = codegen.launch_of(kernel, params, rows, self.cols, self.dtype.size)
        kernel.launch(grid, block, args, shared_bytes=shared)

    def run_poisoned(self, kernel, params: dict, split: int | None = None) -> np.ndarray:
        """Poison the output, launch (in two launches split at row `split`, if given), read back."""
        self.buffers["y"].fill_byte(POISON_BYTE)
        if split is None:
            self.launch(kernel, params)
        else:
            self.launch(kernel, params, 0, split)
            self.launch(kernel, params, split)
        driver.synchronize()
        return self.output()

    def output(self) -> np.ndarray:
        """The output as stored; notes in `wrote_outside` whether the guards around it changed."""
        y = self.buffers["y"]
        whole = y.download(np.uint8, y.nbytes)
        guards = np.concatenate([whole[:OUTPUT_GUARD_BYTES], whole[y.nbytes - OUTPUT_GUARD_BYTES:]])
        self.wrote_outside |= bool(np.any(guards != POISON_BYTE))
        return whole[OUTPUT_GUARD_BYTES:y.nbytes - OUTPUT_GUARD_BYTES].view(self.dtype.storage)

    def inputs_equal(self, inputs: dict[str, np.ndarray]) -> bool:
        """Whether the device still holds exactly the inputs uploaded, padding included (kernels
        must not write them)."""
        return all(self.buffers[n].download(a.dtype, a.size).tobytes() == np.ascontiguousarray(a).tobytes()
                   for n, a in self.stored(inputs).items())

    def free(self) -> None:
        for b in self.buffers.values():
            b.free()


# Timing inputs are drawn once per process and shared by every candidate of
# the same operator, dtype and shape: drawing gigabytes per candidate would
# cost more than the timing itself, and timing needs no fresh draw. A block
# of TIMING_DRAW_ELEMENTS is drawn and repeated down the rows: no kernel here
# caches across rows, and drawing 2^26 normal values took seconds of host time
# per shape.
_timing_buffers: dict[tuple, Buffers] = {}
TIMING_DRAW_ELEMENTS = 1 << 20


def timing_inputs(op: Operator, dtype: DType, rows: int, cols: int, rng) -> dict[str, np.ndarray]:
    block = draw(op, dtype, max(1, min(rows, TIMING_DRAW_ELEMENTS // cols)), cols, 0, rng)
    return {name: np.resize(a, (rows, cols)) if a.ndim == 2 else a for name, a in block.items()}


def _timing_buffers_for(op: Operator, dtype: DType, shape, rng) -> Buffers:
    key = (op.name, dtype.name, tuple(shape))
    if key not in _timing_buffers:
        buffers = Buffers(op, dtype, *shape)
        buffers.upload(timing_inputs(op, dtype, *shape, rng))
        _timing_buffers[key] = buffers
    return _timing_buffers[key]


def release_timing_buffers() -> None:
    """Free the shared timing inputs (a sweep over many shapes would otherwise keep them all)."""
    for buffers in _timing_buffers.values():
        buffers.free()
    _timing_buffers.clear()


def _compare(op: Operator, dtype: DType, inputs, stored: np.ndarray, rows, cols, tolerance) -> dict:
    wide = {n: dtype.decode(a).astype(np.float64).reshape(a.shape) for n, a in inputs.items()}
    ref, scale = op.reference(**wide, **dict(op.scalars))
    y = dtype.decode(stored).astype(np.float64).reshape(ref.shape)
    rtol, atol = tolerance
    unwritten = int(np.count_nonzero(np.isnan(y) & ~np.isnan(ref)))
    err = np.abs(y - ref)
    bound = atol + rtol * scale
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1), np.where(err > 0, np.inf, 0.0))
    # NaN where the reference has one is right; NaN anywhere else is as wrong as can be
    ratio = np.where(np.isnan(ref) & np.isnan(y), 0.0, np.where(np.isnan(ratio), np.inf, ratio))
    err = np.where(np.isnan(err) & ~np.isnan(ref), np.inf, np.nan_to_num(err, nan=0.0))
    # A result beyond the dtype's range can only be stored as an infinity (a float16 row sum of 32768
    # elements near 3 is near 98304, past 65504): that infinity is right where the reference, moved by the
    # bound towards it, would round there.
    overflowed = (np.isinf(y) & np.isfinite(ref) & (np.sign(y) == np.sign(ref))
                  & _rounds_to_infinity(dtype, np.abs(ref) + bound))
    ratio, err = np.where(overflowed, 0.0, ratio), np.where(overflowed, 0.0, err)
    return {"unwritten": unwritten, "worst_error_over_bound": float(ratio.max()) if ratio.size else 0.0,
            "max_abs_error": float(err.max()) if err.size else 0.0,
            "within_bound": unwritten == 0 and bool(np.all(ratio <= 1.0))}


def _rounds_to_infinity(dtype: DType, magnitude: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isinf(dtype.decode(dtype.encode(np.asarray(magnitude).astype(np.float32))))


def _bitwise(op: Operator, dtype: DType, inputs, stored: np.ndarray) -> bool:
    """Bit-for-bit equality with the operator's reference-order emulation."""
    if op.emulate is None:
        return False
    expected = dtype.encode(op.emulate(dtype.decode(inputs["x"]).reshape(inputs["x"].shape)))
    return expected.tobytes() == stored.tobytes()


def rows_checked(cols: int) -> int:
    """How many rows of a shape validation compares with float64."""
    return min(ROWS_CHECKED, max(MIN_ROWS_CHECKED, ELEMENTS_CHECKED // max(cols, 1)))


def _check_shape(kernel, op, dtype, params, shape, trials, tolerance, deterministic, bitwise, rng) -> list[dict]:
    """`shape`: (rows, cols), or (rows, cols, row stride of the inputs)."""
    rows, cols = min(shape[0], rows_checked(shape[1])), shape[1]
    stride = shape[2] if len(shape) > 2 else cols
    buffers = Buffers(op, dtype, rows, cols, stride)
    results = []
    try:
        for trial in range(trials):
            inputs = draw(op, dtype, rows, cols, trial, rng)
            buffers.upload(inputs)
            first = buffers.run_poisoned(kernel, params)
            again = buffers.run_poisoned(kernel, params)
            split = buffers.run_poisoned(kernel, params, split=(rows + 1) // 2)  # another launch configuration
            intact = buffers.inputs_equal(inputs)
            result = _compare(op, dtype, inputs, first, rows, cols, tolerance)
            # The same buffers, new inputs, no poison: a kernel that leaves a
            # previous result in place (or reads it back) is caught here.
            fresh = draw(op, dtype, rows, cols, trial + 1, rng)
            buffers.upload(fresh)
            buffers.launch(kernel, params)
            driver.synchronize()
            reused = buffers.output()
            result.update(shape=[rows, cols] + ([stride] if stride != cols else []), trial=trial, input_intact=intact,
                          output_bounds_kept=not buffers.wrote_outside,
                          repeatable=first.tobytes() == again.tobytes() == split.tobytes())
            if bitwise:   # the float64 error is reported; the bits decide
                result["bitwise_reference_order"] = _bitwise(op, dtype, inputs, first)
                result["fresh_output"] = _bitwise(op, dtype, fresh, reused)
                accurate = result["bitwise_reference_order"]
            else:
                result["fresh_output"] = _compare(op, dtype, fresh, reused, rows, cols, tolerance)["within_bound"]
                accurate = result["within_bound"]
            result["passed"] = (accurate and result["fresh_output"] and intact and result["output_bounds_kept"]
                                and (result["repeatable"] or not deterministic))
            results.append(result)
    finally:
        buffers.free()
    return results


def moved_bytes(op, dtype, rows: int, cols: int) -> int:
    """What a launch moves at the least: each input matrix read once, each vector once, the output written."""
    out = int(np.prod(op.output_shape(rows, cols)))
    return (rows * cols * len(op.input_matrices()) + out + len(op.vectors) * cols) * dtype.size


def time_shape(kernel, op, dtype, params, shape, repetitions, flush: driver.Buffer, rng) -> dict:
    rows, cols = shape
    buffers = _timing_buffers_for(op, dtype, shape, rng)
    for _ in range(WARMUP):
        buffers.launch(kernel, params)
    timer = driver.EventTimer()
    samples = []
    for _ in range(repetitions):
        flush.fill_byte(0)
        samples.append(timer.time(lambda: buffers.launch(kernel, params)))
    seconds = float(np.median(samples)) * 1e-3
    moved = moved_bytes(op, dtype, rows, cols)
    return {"shape": [rows, cols], "median_seconds": seconds, "bytes": moved,
            "bytes_per_second": moved / seconds, "repetitions": repetitions}


def same_bits(kernels: list[tuple[bytes, dict]], op_name: str, dtype_name: str, shapes) -> list[bool]:
    """For each shape ((rows, cols) or (rows, cols, row stride)), whether every (cubin, params) wrote
    the bytes the first wrote, all of them run on one fresh draw of inputs into a poisoned output:
    a kernel change that claims to keep the bits, checked."""
    op, dtype = OPERATORS[op_name], DTYPES[dtype_name]
    rng = np.random.default_rng()
    loaded = [(driver.Kernel(cubin, codegen.ENTRY), params) for cubin, params in kernels]
    try:
        verdicts = []
        for rows, cols, *stride in shapes:
            buffers = Buffers(op, dtype, rows, cols, *stride)
            try:
                buffers.upload(draw(op, dtype, rows, cols, len(verdicts), rng))
                first, *others = [buffers.run_poisoned(kernel, params).tobytes() for kernel, params in loaded]
                verdicts.append(all(other == first for other in others))
            finally:
                buffers.free()
        return verdicts
    finally:
        for kernel, _ in loaded:
            kernel.unload()


def time_kernels(kernels: list[tuple[bytes, dict]], op_name: str, dtype_name: str, shape, repetitions: int,
                 device) -> list[float]:
    """Median seconds of each (cubin, params) on one shape, on the same inputs, L2 flushed before each run."""
    op, dtype = OPERATORS[op_name], DTYPES[dtype_name]
    rng = np.random.default_rng()
    try:
        with driver.Buffer(2 * device.l2_bytes) as flush:
            seconds = []
            for cubin, params in kernels:
                kernel = driver.Kernel(cubin, codegen.ENTRY)
                try:
                    seconds.append(time_shape(kernel, op, dtype, params, shape, repetitions, flush, rng)["median_seconds"])
                finally:
                    kernel.unload()
            return seconds
    finally:
        release_timing_buffers()


def run(cubin: bytes, op_name: str, dtype_name: str, params: dict, *, tolerance, deterministic, bitwise,
        check_shapes, timed_shapes, trials, repetitions, device, peak_bytes_per_second: float) -> dict:
    if trials < 1 or repetitions < 1 or not check_shapes:
        raise ValueError(f"a validation needs trials >= 1, repetitions >= 1 and shapes to check "
                         f"(got {trials}, {repetitions}, {len(check_shapes)} shapes): nothing checked is no pass")
    op, dtype = OPERATORS[op_name], DTYPES[dtype_name]
    rng = np.random.default_rng()  # fresh entropy: every validation draws new inputs
    kernel = driver.Kernel(cubin, codegen.ENTRY)
    try:
        checks = [c for s in check_shapes
                  for c in _check_shape(kernel, op, dtype, params, s, trials, tolerance, deterministic, bitwise, rng)]
        passed = all(c["passed"] for c in checks)
        timings = []
        if passed:
            with driver.Buffer(2 * device.l2_bytes) as flush:
                timings = [time_shape(kernel, op, dtype, params, s, repetitions, flush, rng) for s in timed_shapes]
    finally:
        kernel.unload()
    # A launch that beats the memory system did not do its work where the
    # timer could see it (skipped rows, or work hidden on another stream).
    implausible = [t["shape"] for t in timings if t["bytes_per_second"] > PLAUSIBLE_FRACTION * peak_bytes_per_second]
    status = "passed" if passed and checks and not implausible else "failed"
    return {"status": status, "device": device.name, "checks": checks, "timings": timings,
            "implausibly_fast": implausible,
            "method": "CUDA events around the launch, L2 flushed, median after warm-up"}
