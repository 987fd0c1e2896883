"""DRAM bandwidth: read, write, copy and triad, by access width and by parallelism.

Kernels (kernels/probes/dram.cu) stream a buffer of BUFFER_BYTES, far larger
than the L2, with a grid-stride loop keeping UNROLL independent accesses per
thread in flight. Bytes counted are the fewest the operation must move:
read + written. Loads fold into a value stored only when it equals a key no
input produces, so they stay live.

Two sweeps: width (4, 8, 16 bytes) at full occupancy, for each operation;
and resident threads per SM (32 .. the device maximum) for 16-byte reads,
whose curve gives the plateau and the least bytes in flight per SM that
reach 90% of it. The driver's own device-to-device copy (cuMemcpyDtoDAsync)
is measured beside them as a reference.

Read by the planner: `dram_copy_bandwidth` is the bandwidth of every row
family's prior (a row operator reads and writes, like a copy);
`dram_bytes_in_flight_90` is its saturation point (how many bytes a launch
must keep in flight per SM before bandwidth stops growing).
"""
from __future__ import annotations

import statistics

from ..runtime import driver
from . import curves
from .figures import Curve, ProbeResult, figure

NAME = "dram"
SOURCES = (("dram.cu", ("sm_80", "sm_90")),)
FIGURES = {"dram_read_bandwidth": "byte/s", "dram_write_bandwidth": "byte/s", "dram_copy_bandwidth": "byte/s",
           "dram_triad_bandwidth": "byte/s", "driver_copy_bandwidth": "byte/s",
           "dram_bytes_in_flight_90": "byte", "dram_threads_per_sm_90": "thread"}

BUFFER_BYTES = 1 << 31       # 2 GiB per array: over 30 times any L2 of today
UNROLL = 4                   # as in dram.cu
BLOCK = 256
KEY = 0x9E3779B9             # what no fold of the 0x3C fill pattern gives
WIDTHS = (4, 8, 16)
REPETITIONS, LAUNCHES = 7, 3


def _bandwidth(samples_ms: list[float], nbytes: int) -> list[float]:
    return [nbytes / (ms * 1e-3) for ms in samples_ms]


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    a, b, c = gpu.buffer(BUFFER_BYTES), gpu.buffer(BUFFER_BYTES), gpu.buffer(BUFFER_BYTES)
    sink = gpu.buffer(64)
    full_grid = gpu.sm_count * (gpu.attributes["MAX_THREADS_PER_MULTIPROCESSOR"] // BLOCK)

    def launches(width: int, grid: int, block: int) -> dict:
        n = BUFFER_BYTES // width
        k = {op: gpu.kernel("dram.cu", f"{op}_w{width}") for op in ("read", "write", "copy", "triad")}
        return {
            "read": (lambda: k["read"].launch(grid, block, [(a.ptr, "ptr"), (n, "i64"), (KEY, "u32"), (sink.ptr, "ptr")]),
                     BUFFER_BYTES),
            "write": (lambda: k["write"].launch(grid, block, [(a.ptr, "ptr"), (n, "i64"), (7, "u32")]), BUFFER_BYTES),
            "copy": (lambda: k["copy"].launch(grid, block, [(a.ptr, "ptr"), (b.ptr, "ptr"), (n, "i64")]),
                     2 * BUFFER_BYTES),
            "triad": (lambda: k["triad"].launch(grid, block, [(a.ptr, "ptr"), (b.ptr, "ptr"), (c.ptr, "ptr"),
                                                              (n, "i64"), (3, "u32")]), 3 * BUFFER_BYTES),
        }

    best: dict[str, list[float]] = {}
    width_points: dict[str, list] = {op: [] for op in ("read", "write", "copy", "triad")}

    def keep_best(op: str, rates: list[float]) -> None:
        if op not in best or statistics.median(rates) > statistics.median(best[op]):
            best[op] = rates

    for width in WIDTHS:
        for op, (work, nbytes) in launches(width, full_grid, BLOCK).items():
            rates = _bandwidth(gpu.repeat(work, REPETITIONS, LAUNCHES), nbytes)
            width_points[op].append((width, statistics.median(rates)))
            keep_best(op, rates)
            gpu.progress(f"  dram {op} {width:2d} B: {width_points[op][-1][1] / 1e12:.2f} TB/s")
    # evict-first (ld/st .cs) variants of the two write-heavy operations, 16-byte accesses
    n = BUFFER_BYTES // 16
    streaming = {
        "copy": (gpu.kernel("dram.cu", "copy_cs_w16"), [(a.ptr, "ptr"), (b.ptr, "ptr"), (n, "i64")], 2),
        "triad": (gpu.kernel("dram.cu", "triad_cs_w16"),
                  [(a.ptr, "ptr"), (b.ptr, "ptr"), (c.ptr, "ptr"), (n, "i64"), (3, "u32")], 3)}
    for depth in (4, 8):   # blocked copies: one tile per block, the grid covering the array once
        kernel, grid = gpu.kernel("dram.cu", f"copy_tile{depth}_w16"), -(-n // (BLOCK * depth))
        streaming[f"copy tile{depth}"] = (kernel, [(a.ptr, "ptr"), (b.ptr, "ptr"), (n, "i64")], 2, grid)
    for op, (kernel, args, arrays, *grid) in streaming.items():
        launch_grid = grid[0] if grid else full_grid
        rates = _bandwidth(gpu.repeat(lambda: kernel.launch(launch_grid, BLOCK, args), REPETITIONS, LAUNCHES),
                           arrays * BUFFER_BYTES)
        keep_best(op.split()[0], rates)
        label = op if "tile" in op else f"{op} evict-first"
        gpu.progress(f"  dram {label} 16 B: {statistics.median(rates) / 1e12:.2f} TB/s")
    for op in ("read", "write", "copy", "triad"):
        result.figures.append(figure(f"dram_{op}_bandwidth", best[op], "byte/s",
                                     f"{op} of 2 GiB arrays, best of access widths 4/8/16 B (copy and triad also with evict-first "
                                     f"hints, copy also one tile per block), {BLOCK}-thread blocks "
                                     f"filling every SM, {UNROLL} accesses in flight per thread; bytes read + written "
                                     "over event time"))
        result.curves[f"{op}_by_width"] = Curve("access width (byte)", "bandwidth (byte/s)", tuple(width_points[op]))

    copy = lambda: driver.check(driver._cu().cuMemcpyDtoDAsync(b.ptr, a.ptr, BUFFER_BYTES, 0))  # noqa: E731
    result.figures.append(figure("driver_copy_bandwidth", _bandwidth(gpu.repeat(copy, REPETITIONS, LAUNCHES),
                                                                     2 * BUFFER_BYTES), "byte/s",
                                 "cuMemcpyDtoDAsync of 2 GiB; bytes read + written over event time"))

    # Parallelism: 16-byte reads with 1 .. max resident threads per SM.
    points, samples_at = [], {}
    max_threads = gpu.attributes["MAX_THREADS_PER_MULTIPROCESSOR"]
    threads = 32
    while threads <= max_threads:
        block = min(threads, BLOCK)
        work, nbytes = launches(16, gpu.sm_count * (threads // block), block)["read"]
        rates = _bandwidth(gpu.repeat(work, 5, 3), nbytes)
        samples_at[threads] = rates
        points.append((threads, sorted(rates)[len(rates) // 2]))
        gpu.progress(f"  dram read, {threads:4d} threads/SM: {points[-1][1] / 1e12:.2f} TB/s")
        threads *= 2
    xs, ys = zip(*points)
    threads_90 = curves.saturation_point(xs, ys, 0.9)
    per_thread = 16 * UNROLL
    result.curves["read_by_threads_per_sm"] = Curve("resident threads per SM", "bandwidth (byte/s)", tuple(points))
    result.figures.append(figure("dram_threads_per_sm_90", [threads_90] * len(samples_at[threads_90]), "thread",
                                 f"least resident threads per SM (powers of two) whose 16-byte reads, {UNROLL} in "
                                 "flight each, reach 90% of the read plateau"))
    result.figures.append(figure("dram_bytes_in_flight_90", [threads_90 * per_thread] * len(samples_at[threads_90]),
                                 "byte", f"dram_threads_per_sm_90 x 16 B x {UNROLL} loads in flight per thread"))
    for buf in (a, b, c, sink):
        gpu.release(buf)
    return result
