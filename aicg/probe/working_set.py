"""Bandwidth against working-set size, and the cache capacities where it falls.

Two sweeps over kernels/probes/working_set.cu. Per SM: every block re-reads
one region with L1-caching loads, so each SM's working set is the region,
and bandwidth falls when it outgrows L1. GPU-wide: the grid sweeps one
region together with loads that bypass L1, so bandwidth falls when the
region outgrows L2. Each launch moves at least TARGET_BYTES, so small
regions are re-read many times. The knees come from curves.knees (the
midpoint between neighbouring plateaus). Loads are volatile asm and fold
into a conditionally stored value, so none is removed or hoisted.

Read by the planner: `l2_capacity_knee` decides whether the rows a launch
holds at once stay in L2 for the next sweep (the multi-sweep families:
two-pass softmax, layernorm, rmsnorm); `l2_read_bandwidth` over the DRAM
bandwidth is the speed-up of such a cached sweep.
"""
from __future__ import annotations

import math
import statistics

from . import curves
from .figures import Curve, ProbeResult, figure

NAME = "working_set"
SOURCES = (("working_set.cu", ("sm_80", "sm_90")),)
FIGURES = {"l1_read_bandwidth": "byte/s", "l1_capacity_knee": "byte",
           "l2_read_bandwidth": "byte/s", "l2_capacity_knee": "byte"}

KEY = 0x9E3779B9
TARGET_BYTES = 1 << 32       # per launch: long against launch overhead at L1 speeds
PER_SM_BLOCKS, PER_SM_THREADS = 2, 512
PER_SM_SIZES = [int(2 ** (k / 2) * 1024) for k in range(6, 20)]          # 8 KiB .. 724 KiB
GPU_SIZES = [int(2 ** (k / 3) * (1 << 20)) for k in range(0, 3 * 9 + 1)]   # 1 MiB .. 512 MiB, 3 per octave
GPU_THREADS = 512


def _sweep(gpu, kernel, sizes, grid: int, block: int, reads_per_pass, sink, buf) -> list[tuple[int, list[float]]]:
    out = []
    for size in sizes:
        size -= size % 16
        passes = max(1, math.ceil(TARGET_BYTES / reads_per_pass(size)))
        moved = reads_per_pass(size) * passes
        args = [(buf.ptr, "ptr"), (size // 16, "i64"), (passes, "int"), (KEY, "u32"), (sink.ptr, "ptr")]
        samples = gpu.repeat(lambda: kernel.launch(grid, block, args), repetitions=5, launches=3, warmup=1)
        out.append((size, [moved / (ms * 1e-3) for ms in samples]))
    return out


def _level_figures(name: str, sweep, level: str, unit_note: str, result: ProbeResult, min_ratio: float = 1.25):
    xs = [size for size, _ in sweep]
    ys = [sorted(s)[len(s) // 2] for _, s in sweep]
    result.curves[name] = Curve(unit_note, "bandwidth (byte/s)", tuple(zip(xs, ys)))
    found = curves.knees(xs, ys, min_step=min_ratio)
    falls = [k for k in found if k.ratio < 1]
    if not falls:
        result.notes.append(f"{name}: no fall in bandwidth found (levels {curves.levels(xs, ys)})")
        return
    knee = falls[0]
    on_level = [s for size, s in sweep if knee.before.first_x <= size <= knee.before.last_x]
    best = max(on_level, key=statistics.median)
    result.figures.append(figure(f"{level}_read_bandwidth", best, "byte/s",
                                 f"{unit_note}: the working set of highest bandwidth on the plateau before the "
                                 "first fall, its repetitions"))
    # the knee position's spread: where the same analysis puts it on each repetition's curve
    per_rep = []
    for r in range(min(len(s) for _, s in sweep)):
        rep_knees = [k for k in curves.knees(xs, [s[r] for _, s in sweep], min_step=min_ratio) if k.ratio < 1]
        if rep_knees:
            per_rep.append(min(rep_knees, key=lambda k: abs(math.log(k.x / knee.x))).x)
    result.figures.append(figure(f"{level}_capacity_knee", per_rep or [knee.x], "byte",
                                 f"{unit_note}: midpoint of the first fall in bandwidth (curves.knees), "
                                 "per repetition's curve"))


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    buf = gpu.buffer(max(GPU_SIZES))
    sink = gpu.buffer(64)

    per_sm = gpu.kernel("working_set.cu", "per_sm_read")
    grid = gpu.sm_count * PER_SM_BLOCKS
    sweep = _sweep(gpu, per_sm, PER_SM_SIZES, grid, PER_SM_THREADS, lambda size: size * grid, sink, buf)
    for size, s in sweep:
        gpu.progress(f"  per-SM working set {size / 1024:7.0f} KiB: {sorted(s)[2] / 1e12:6.2f} TB/s")
    _level_figures("per_sm_read", sweep, "l1", "working set per SM (byte)", result)

    shared = gpu.kernel("working_set.cu", "shared_read")
    grid = gpu.sm_count * (gpu.attributes["MAX_THREADS_PER_MULTIPROCESSOR"] // GPU_THREADS)
    sweep = _sweep(gpu, shared, GPU_SIZES, grid, GPU_THREADS, lambda size: size, sink, buf)
    for size, s in sweep:
        gpu.progress(f"  GPU-wide working set {size / 2**20:6.1f} MiB: {sorted(s)[2] / 1e12:6.2f} TB/s")
    _level_figures("gpu_wide_read", sweep, "l2", "working set of the whole GPU (byte)", result)
    gpu.release(buf)
    gpu.release(sink)
    return result
