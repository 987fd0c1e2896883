"""Atomic add throughput by contention: one address for the whole GPU, one per warp, one per thread.

Every thread of a full-occupancy grid (256-thread blocks filling every SM)
adds 1 to a word of a 1 GiB target, `iterations` times
(kernels/probes/atomics.cu); which word is set by three scales and a mask,
kernel arguments the compiler cannot see through:
  contended       all threads on one word;
  warp_address    a word per warp, 128 bytes apart (lanes of a warp agree,
                  so the memory system may merge a warp's 32 adds);
  distinct        a word per thread, the same each iteration: 1 MiB in all,
                  resident in the L2;
  distinct_dram   a fresh word per thread and iteration, sweeping the whole
                  1 GiB, so each add misses the L2 and its line comes from DRAM.
Rates are adds over event time. The figures, `atomic_add_<pattern>_rate`,
are those of f32 adds that return nothing (red.global.add.f32, what a
float reduction's final step issues); u32
adds (red.global.add.u32) and u32 adds whose old value is used
(atom.global.add.u32, folded into a sink) are measured beside them and
reported in the notes. A curve sweeps the f32 rate over the number of
distinct words the grid spreads over (1 .. 2^28, a word per thread and
iteration beyond the grid's thread count).

Adds to global memory are side effects no compiler may drop; the probe
also checks them: before timing, each kernel runs each pattern a few
iterations on a zeroed target, and every word's final value must equal the
number of adds the pattern sends it (exact for u32, and for f32 while
counts stay below 2^24). A mismatch fails the probe.

Read by the planner: nothing yet. A split row reduction (rows longer than
one block, each block adding its partial into the row's output by atomics)
would read `atomic_add_warp_address_rate` (one add per block and row) and
`atomic_add_contended_rate` (many blocks on one row's output) as the cost of
its final step; no such family exists yet.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from ..errors import DeviceError
from .figures import Curve, ProbeResult, figure

NAME = "atomics"
SOURCES = (("atomics.cu", ("sm_80", "sm_90")),)
FIGURES = {"atomic_add_contended_rate": "op/s", "atomic_add_warp_address_rate": "op/s",
           "atomic_add_distinct_rate": "op/s", "atomic_add_distinct_dram_rate": "op/s"}

BLOCK = 256                    # as in atomics.cu
TARGET_BYTES = 1 << 30         # 2^28 words: over 16 times any L2 of today
WARP_SPACING_WORDS = 32        # a warp's word per 128-byte line
CHECK_ITERATIONS = 4
CALIBRATION_ITERATIONS = 8
TARGET_MS = 3.0
MAX_ITERATIONS = 1 << 16
CURVE_WORDS = tuple(4 ** k for k in range(15))     # 1 .. 2^28
KERNELS = {"f32": "add_f32", "u32": "add_u32", "u32 fetch": "fetch_add_u32"}
REPETITIONS, LAUNCHES = 5, 3


@dataclass(frozen=True)
class Pattern:
    lane_scale: int
    warp_scale: int
    iteration_scale: int
    mask: int

    def args(self) -> list:
        return [(self.lane_scale, "u64"), (self.warp_scale, "u64"), (self.iteration_scale, "u64"), (self.mask, "u64")]


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def patterns(threads: int) -> dict[str, Pattern]:
    """The four contention patterns for a grid of `threads` threads."""
    words = TARGET_BYTES // 4
    return {
        "contended": Pattern(0, 0, 0, 0),
        "warp_address": Pattern(0, WARP_SPACING_WORDS, 0, _pow2_at_least(threads // 32 * WARP_SPACING_WORDS) - 1),
        "distinct": Pattern(1, 32, 0, _pow2_at_least(threads) - 1),
        "distinct_dram": Pattern(1, 32, threads, words - 1),
    }


def spread_over(words: int, threads: int) -> Pattern:
    """Every thread and iteration on the next word, wrapped to `words` (a power of two)."""
    return Pattern(1, 32, threads, words - 1)


def word_indices(pattern: Pattern, threads: int, iterations: int) -> np.ndarray:
    """Every word one launch adds to, once per add, as atomics.cu computes it."""
    t = np.arange(threads, dtype=np.uint64)
    base = (t & np.uint64(31)) * np.uint64(pattern.lane_scale) + (t >> np.uint64(5)) * np.uint64(pattern.warp_scale)
    steps = np.arange(iterations, dtype=np.uint64)[:, None] * np.uint64(pattern.iteration_scale)
    return ((base[None, :] + steps) & np.uint64(pattern.mask)).ravel()


def expected_counts(pattern: Pattern, threads: int, iterations: int) -> np.ndarray:
    """Each word's final value after one launch on a zeroed target, up to the last word touched."""
    return np.bincount(word_indices(pattern, threads, iterations).astype(np.int64))


def scaled_iterations(iterations: int, measured_ms: float, target_ms: float = TARGET_MS,
                      low: int = 1, high: int = MAX_ITERATIONS) -> int:
    """Iterations that make a launch of `iterations` that took `measured_ms` take about `target_ms`."""
    if measured_ms <= 0:
        return high
    return int(min(high, max(low, round(iterations * target_ms / measured_ms))))


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    grid = gpu.sm_count * (gpu.attributes["MAX_THREADS_PER_MULTIPROCESSOR"] // BLOCK)
    threads = grid * BLOCK
    target = gpu.buffer(TARGET_BYTES)
    sink = gpu.buffer(threads * 4)
    kernels = {dtype: gpu.kernel("atomics.cu", entry) for dtype, entry in KERNELS.items()}

    def launch(dtype: str, pattern: Pattern, iterations: int):
        args = [(target.ptr, "ptr"), *pattern.args(), (iterations, "int"), (sink.ptr, "ptr")]
        return lambda: kernels[dtype].launch(grid, BLOCK, args)

    def check(dtype: str, name: str, pattern: Pattern) -> None:
        expected = expected_counts(pattern, threads, CHECK_ITERATIONS)
        target.fill_byte(0)
        launch(dtype, pattern, CHECK_ITERATIONS)()
        got = target.download(np.float32 if dtype == "f32" else np.uint32, len(expected))
        if not np.array_equal(got.astype(np.int64), expected):
            wrong = int(np.flatnonzero(got.astype(np.int64) != expected)[0])
            raise DeviceError(f"atomics: {dtype} adds, pattern {name}: word {wrong} holds {got[wrong]}, "
                              f"expected {expected[wrong]} after {CHECK_ITERATIONS} iterations of {threads} threads")

    def rates(dtype: str, pattern: Pattern) -> tuple[list[float], int]:
        iterations = CALIBRATION_ITERATIONS
        launch(dtype, pattern, iterations)()                 # warms the clocks
        for _ in range(2):        # the first guess is skewed by launch overhead; the second is not
            iterations = scaled_iterations(iterations, gpu.time_ms(launch(dtype, pattern, iterations)))
        samples = gpu.repeat(launch(dtype, pattern, iterations), REPETITIONS, LAUNCHES)
        return [threads * iterations / (ms * 1e-3) for ms in samples], iterations

    measured: dict[tuple[str, str], list[float]] = {}
    for name, pattern in patterns(threads).items():
        for dtype in KERNELS:
            check(dtype, name, pattern)
            measured[dtype, name], iterations = rates(dtype, pattern)
            gpu.progress(f"  atomics {dtype:9s} {name:13s}: {statistics.median(measured[dtype, name]) / 1e9:8.2f} "
                         f"Gop/s ({iterations} adds per thread)")
    result.notes.append(f"the counts of every pattern and kernel were checked exact on a zeroed target "
                        f"({CHECK_ITERATIONS} adds per thread, {threads} threads)")

    where = {"contended": "all threads of the grid on one word",
             "warp_address": f"a word per warp, {WARP_SPACING_WORDS * 4} bytes apart",
             "distinct": f"a word per thread ({threads * 4 / 2**20:.1f} MiB in all, L2-resident), the same each "
                         "iteration",
             "distinct_dram": f"a fresh word per thread and iteration over {TARGET_BYTES >> 30} GiB (each add "
                              "misses the L2)"}
    for name in where:
        result.figures.append(figure(
            f"atomic_add_{name}_rate", measured["f32", name], "op/s",
            f"f32 adds of 1.0 by red.global.add.f32 (no old value returned), {where[name]}; {threads} threads "
            f"({BLOCK}-thread blocks filling every SM), adds over event time"))
        f32 = statistics.median(measured["f32", name])
        result.notes.append(f"{name}: u32 red {statistics.median(measured['u32', name]) / f32:.2f}x, u32 atom "
                            f"with the old value used {statistics.median(measured['u32 fetch', name]) / f32:.2f}x "
                            f"the f32 red rate")

    points = []
    for words in CURVE_WORDS:
        samples, _ = rates("f32", spread_over(words, threads))
        points.append((words, statistics.median(samples)))
        gpu.progress(f"  atomics f32 over {words:9d} words: {points[-1][1] / 1e9:8.2f} Gop/s")
    result.curves["f32_add_by_words"] = Curve("distinct words the grid adds to", "adds per second (op/s)",
                                              tuple(points))
    gpu.release(target)
    gpu.release(sink)
    return result
