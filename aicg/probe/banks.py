"""Shared-memory bank conflicts: the cost of a warp's load by how many words share a bank.

Every lane of every warp loads the element at lane x stride of a shared
array of 4-, 8- or 16-byte elements (kernels/probes/banks.cu), ITERATIONS x
UNROLL times, with the SM full (2048 threads) so its shared-memory pipe sets
the pace. Shared memory has 32 banks of 4-byte words; a warp's load takes as
many passes (wavefronts) as the most distinct words one bank must deliver,
counted per group of lanes that one 128-byte pass can serve (32 lanes of 4
bytes, 16 of 8, 8 of 16). Each block times its loop with clock64 between two
barriers; the block's span over the loads its SM made is SM cycles per
warp-wide load (a throughput, not a latency). Loads are volatile asm folded
into a value written only when it equals a key no input produces, so each is
issued and none is hoisted.

Read by the planner: the block topology's reduction goes through shared
memory; `shared_bank_conflict_cycles_per_way` prices a conflicting step of
it, and `shared_bank_conflict_32way_penalty` bounds the worst layout.
"""
from __future__ import annotations

import statistics

import numpy as np

from .figures import Curve, ProbeResult, figure

NAME = "banks"
SOURCES = (("banks.cu", ("sm_80", "sm_90")),)
FIGURES = {"shared_bank_conflict_32way_penalty": "ratio", "shared_bank_conflict_cycles_per_way": "cycle",
           "shared_penalty_8byte_stride32": "ratio", "shared_penalty_16byte_stride32": "ratio"}

BANKS, WARP = 32, 32
WIDTHS = (4, 8, 16)                          # bytes per element: ld.shared.u32, .v2.u32, .v4.u32
STRIDES = (1, 2, 3, 4, 6, 8, 12, 16, 17, 24, 32, 33)   # up to MAX_STRIDE of banks.cu
UNROLL, BLOCK = 16, 1024                     # as in banks.cu
ITERATIONS = 512                             # 8192 loads per warp
KEY = 0x9E3779B9
REPETITIONS = 5


def wavefronts(stride: int, width: int) -> int:
    """Passes one warp-wide load needs: for each group of lanes one 128-byte pass can serve,
    the most distinct 4-byte words any bank must deliver, summed over the groups."""
    words_per_element = width // 4
    group = BANKS * 4 // width
    total = 0
    for first in range(0, WARP, group):
        words_of_bank: dict[int, set[int]] = {}
        for lane in range(first, first + group):
            for k in range(words_per_element):
                word = lane * stride * words_per_element + k
                words_of_bank.setdefault(word % BANKS, set()).add(word)
        total += max(len(words) for words in words_of_bank.values())
    return total


def slope(xs, ys) -> float:
    """Least-squares slope of y on x."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    return float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())


def figures_from(cycles: dict[int, dict[int, list[float]]], result: ProbeResult) -> None:
    """Figures and curves from {width: {stride: cycles per warp-wide load, one per repetition}}."""
    for width, by_stride in sorted(cycles.items()):
        result.curves[f"shared_{width}byte"] = Curve(
            f"lane stride ({width}-byte elements)", "SM cycles per warp-wide load",
            tuple((s, statistics.median(by_stride[s])) for s in sorted(by_stride)))
    words = cycles[4]
    repetitions = min(len(s) for s in words.values())
    result.figures.append(figure(
        "shared_bank_conflict_32way_penalty", [a / b for a, b in zip(words[32], words[1])], "ratio",
        "time per warp-wide 4-byte shared load at lane stride 32 words (32-way conflict) over stride 1, "
        "full SM, clock64 per block, per repetition"))
    ways = [wavefronts(s, 4) for s in sorted(words)]
    result.figures.append(figure(
        "shared_bank_conflict_cycles_per_way",
        [slope(ways, [words[s][r] for s in sorted(words)]) for r in range(repetitions)], "cycle",
        f"least-squares slope of SM cycles per warp-wide 4-byte shared load over conflict ways, lane strides "
        f"{', '.join(map(str, sorted(words)))}; full SM, clock64 per block, per repetition"))
    for width in (8, 16):
        if width in cycles:
            by_stride = cycles[width]
            result.figures.append(figure(
                f"shared_penalty_{width}byte_stride32", [a / b for a, b in zip(by_stride[32], by_stride[1])],
                "ratio", f"time per warp-wide {width}-byte shared load at lane stride 32 elements over stride 1 "
                f"(expected {wavefronts(32, width) / wavefronts(1, width):.0f}x from bank mapping), per repetition"))
    # Where the time does not follow the bank model, say so: the model is what the figures assume.
    for width, by_stride in sorted(cycles.items()):
        base = statistics.median(by_stride[1]) / wavefronts(1, width)
        off = [f"stride {s}: {statistics.median(by_stride[s]) / base:.1f} passes for {wavefronts(s, width)} expected"
               for s in sorted(by_stride)
               if abs(statistics.median(by_stride[s]) / base / wavefronts(s, width) - 1) > 0.25]
        if off:
            result.notes.append(f"shared {width}-byte loads off the bank model: {'; '.join(off)}")


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    blocks_per_sm = gpu.attributes["MAX_THREADS_PER_MULTIPROCESSOR"] // BLOCK
    grid = gpu.sm_count * blocks_per_sm             # one wave: every SM holds blocks_per_sm blocks throughout
    loads_per_sm = blocks_per_sm * (BLOCK // WARP) * ITERATIONS * UNROLL
    spans, sink = gpu.buffer(8 * grid), gpu.buffer(64)

    cycles: dict[int, dict[int, list[float]]] = {}
    for width in WIDTHS:
        kernel = gpu.kernel("banks.cu", f"bank_conflicts_{width}")
        cycles[width] = {}
        for stride in STRIDES:
            args = [(stride, "int"), (ITERATIONS, "int"), (KEY, "u32"), (sink.ptr, "ptr"), (spans.ptr, "ptr")]
            kernel.launch(grid, BLOCK, args)                     # warm-up: module load, clocks
            samples = []
            for _ in range(REPETITIONS):
                kernel.launch(grid, BLOCK, args)
                gpu.synchronize()
                samples.append(float(np.median(spans.download(np.int64, grid))) / loads_per_sm)
            cycles[width][stride] = samples
            gpu.progress(f"  shared {width:2d}-byte loads, lane stride {stride:2d}: "
                         f"{statistics.median(samples):6.2f} SM cycles per warp load")
    figures_from(cycles, result)
    gpu.release(spans)
    gpu.release(sink)
    return result
