"""Coalescing: useful read bandwidth when a warp's lanes are `stride` words apart.

`strided_read` (kernels/probes/stride.cu) reads a 2 GiB buffer, far larger
than L2, as 4-byte words with neighbouring lanes STRIDES words apart; in pass
p each lane reads word p of its group, and a pass sweeps the whole buffer
before the next, so no fetched sector is reused: from stride 8 on every
4-byte word costs a whole sector (or more, where DRAM is read in larger
pieces). Every word is read once per launch, so the useful bytes (the bytes
threads consume) are the buffer's size at every stride. `row_walk` reads the
same buffer as one thread per row of `stride` words, walking each row word by
word: the pattern of a thread-per-row kernel, where the caches may keep a
sector for its next words; it is recorded as a curve beside the figure.
Loads fold into a value written only when it equals a key no input
produces, so none is removed.

Read by the planner: `uncoalesced_penalty` (useful bandwidth at stride 1
over stride 32) is the coalescing factor of the thread-per-row topology,
whose neighbouring lanes are a row apart.
"""
from __future__ import annotations

import statistics

from .figures import Curve, ProbeResult, figure

NAME = "stride"
SOURCES = (("stride.cu", ("sm_80", "sm_90")),)
FIGURES = {"coalesced_read_bandwidth": "byte/s", "uncoalesced_penalty": "ratio"}

BUFFER_BYTES = 1 << 31        # 2 GiB: over 30 times any L2 of today
WORDS = BUFFER_BYTES // 4
STRIDES = (1, 2, 4, 8, 16, 32, 64)
PENALTY_STRIDE = 32           # a whole 128-byte line per lane: every lane its own sector
KEY = 0x9E3779B9              # what no fold of the 0x3C fill pattern gives
BLOCK = 256
REPETITIONS, LAUNCHES = 5, 3


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


def figures_from(strided: dict[int, list[float]], rows: dict[int, list[float]], result: ProbeResult) -> None:
    """Figures and curves from useful bandwidths (byte/s, one per repetition) by stride and by row length."""
    result.curves["strided_read"] = Curve("lane stride (4-byte words)", "useful bandwidth (byte/s)",
                                          tuple((s, _median(strided[s])) for s in sorted(strided)))
    result.curves["row_walk"] = Curve("row length, one thread per row (4-byte words)", "useful bandwidth (byte/s)",
                                      tuple((s, _median(rows[s])) for s in sorted(rows)))
    result.figures.append(figure("coalesced_read_bandwidth", strided[1], "byte/s",
                                 "4-byte reads of a 2 GiB buffer, neighbouring lanes on neighbouring words, "
                                 "full occupancy; bytes consumed over event time"))
    penalty = [a / b for a, b in zip(strided[1], strided[PENALTY_STRIDE])]
    result.figures.append(figure("uncoalesced_penalty", penalty, "ratio",
                                 f"useful bandwidth of 4-byte reads at lane stride 1 over lane stride "
                                 f"{PENALTY_STRIDE} words, no sector reused (2 GiB between reuses), per repetition"))
    if PENALTY_STRIDE in rows and 1 in rows:
        walk = _median(rows[1]) / _median(rows[PENALTY_STRIDE])
        result.notes.append(f"row_walk: one thread per {PENALTY_STRIDE}-word row, walking it word by word, reads "
                            f"{walk:.2f}x slower than coalesced reads (uncoalesced_penalty, with no reuse: "
                            f"{_median(penalty):.2f}x)")


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    buf, sink = gpu.buffer(BUFFER_BYTES), gpu.buffer(64)
    grid = gpu.sm_count * (gpu.attributes["MAX_THREADS_PER_MULTIPROCESSOR"] // BLOCK)
    strided_read = gpu.kernel("stride.cu", "strided_read")
    row_walk = gpu.kernel("stride.cu", "row_walk")

    def useful_bandwidth(work) -> list[float]:
        return [BUFFER_BYTES / (ms * 1e-3) for ms in gpu.repeat(work, REPETITIONS, LAUNCHES)]

    strided, rows = {}, {}
    for stride in STRIDES:
        tiles = WORDS // (32 * stride)
        strided[stride] = useful_bandwidth(lambda: strided_read.launch(
            grid, BLOCK, [(buf.ptr, "ptr"), (tiles, "i64"), (stride, "int"), (KEY, "u32"), (sink.ptr, "ptr")]))
        rows[stride] = useful_bandwidth(lambda: row_walk.launch(
            grid, BLOCK, [(buf.ptr, "ptr"), (WORDS // stride, "i64"), (stride, "int"), (KEY, "u32"),
                          (sink.ptr, "ptr")]))
        gpu.progress(f"  stride {stride:2d} words: {_median(strided[stride]) / 1e12:.3f} TB/s useful; "
                     f"thread per {stride}-word row: {_median(rows[stride]) / 1e12:.3f} TB/s")
    figures_from(strided, rows, result)
    gpu.release(buf)
    gpu.release(sink)
    return result
