"""Load-to-use latency of L1, L2, DRAM and shared memory, by pointer chasing.

One thread follows a cyclic chain of pointers (kernels/probes/latency.cu),
each load's address being the previous load's value, so the loads cannot
overlap and clock64 around STEPS of them gives cycles per load. The chain
holds one pointer per 128-byte line, its lines linked in a random order
(numpy, fixed seed) covering the whole working set, so every step touches a
new line and no prefetcher can guess the next. Working sets run from 8 KiB to
1 GiB, three per octave; up to twice the L2 size, a full untimed lap first
leaves in the caches what they can hold (ld.global.ca keeps L1 in play).
The curve's plateaus (curves.levels) are the L1, L2 and DRAM latencies; the
midpoints between them (as in curves.knees) are capacities. A chase through
shared memory gives its latency alone.

Address translation shows in this curve: a random chain over a working set
larger than a TLB level's reach misses that TLB on most steps, which adds a
step of its own (within the L2 range, the first-level TLB's reach; at the
largest sets, the last level's). Steps the L1/L2/DRAM model does not explain
are reported in the notes; H100/H200's L2 is two partitions, and lines homed
in the far one answer later, which can also add a step inside the L2 range.
L2 latency is the first level after L1 (the near partition, inside every TLB
reach); DRAM latency is the longest level beyond the L2 size.

The chase is volatile asm, and its cycle count and the last address reached
are written out, so nothing is removed.

Read by the planner: `dram_latency_cycles` gives bytes in flight by Little's
law (bandwidth x latency) where the dram probe did not measure saturation;
`shared_latency_cycles` is the step cost of a block topology's shared-memory
reduction.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from . import curves
from .figures import Curve, Figure, ProbeResult, figure

NAME = "latency"
SOURCES = (("latency.cu", ("sm_80", "sm_90")),)
FIGURES = {"l1_latency_cycles": "cycle", "l2_latency_cycles": "cycle", "dram_latency_cycles": "cycle",
           "shared_latency_cycles": "cycle", "l1_capacity_latency_knee": "byte",
           "l2_capacity_latency_knee": "byte"}

LINE_BYTES = 128              # as in latency.cu: one pointer per line
SWEEP_STEP = 2 ** (1 / 3)      # three working sets per octave
SIZES = sorted({round(2 ** (13 + k / 3) / LINE_BYTES) * LINE_BYTES for k in range(3 * 17 + 1)})  # 8 KiB .. 1 GiB
STEPS = 16384                 # timed loads per launch (a multiple of 8)
WARM_STEPS_PAST_L2 = 16384    # beyond twice the L2, a full lap would not be kept: warm only TLBs and code
SHARED_WORDS = 1024           # the shared chase: 4 KiB, one word per element
REPETITIONS = 5               # launches per working set, each one sample
SEED = 20240613


def random_cycle(count: int, seed: int = SEED) -> tuple[np.ndarray, int]:
    """(next, start): next[i] is the element after i on one random cycle through all `count` elements."""
    order = np.random.default_rng(seed).permutation(count).astype(np.uint32)
    following = np.empty(count, dtype=np.uint32)
    following[order] = np.roll(order, -1)
    return following, int(order[0])


@dataclass
class LatencyLevels:
    l1: curves.Level | None = None
    l2: curves.Level | None = None          # the first level past L1: the near L2 partition
    l2_last: curves.Level | None = None     # the last level before DRAM (l2 itself without a second step)
    dram: curves.Level | None = None
    extra: list[curves.Level] = field(default_factory=list)   # steps the L1/L2/DRAM model does not explain


def latency_levels(xs, ys, l2_bytes: int) -> LatencyLevels:
    """Which plateau of the latency curve is which: L1 holds the smallest sets, DRAM is the
    longest plateau starting past the L2 size, L2 is what lies between."""
    found = curves.levels(xs, ys)
    out = LatencyLevels()
    if not found:
        return out
    rest = found
    if found[0].first_x == float(xs[0]):
        out.l1, rest = found[0], found[1:]
    past_l2 = [lv for lv in rest if lv.first_x >= l2_bytes]
    if past_l2:
        out.dram = max(past_l2, key=lambda lv: lv.points)
    inside = [lv for lv in rest if lv.first_x < l2_bytes]
    if inside:
        out.l2, out.l2_last = inside[0], inside[-1]
    out.extra = [lv for lv in rest if lv not in (out.dram, out.l2, out.l2_last)]
    return out


def crossing(xs, ys, before: curves.Level, after: curves.Level) -> float:
    """Where the curve crosses from `before` to `after`: the geometric mean of the two
    levels, interpolated in log(x) (the knee rule of curves.knees, for levels that need not be adjacent)."""
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    middle = math.sqrt(before.value * after.value)
    rising = after.value > before.value
    for i in range(xs.index(before.last_x), xs.index(after.first_x)):
        if (ys[i + 1] >= middle) if rising else (ys[i + 1] <= middle):
            y0, y1 = math.log(ys[i]), math.log(ys[i + 1])
            t = 0.5 if y1 == y0 else min(1.0, max(0.0, (math.log(middle) - y0) / (y1 - y0)))
            return math.exp(math.log(xs[i]) + t * (math.log(xs[i + 1]) - math.log(xs[i])))
    return after.first_x


def _knees(xs, ys, levels: LatencyLevels) -> dict[str, float]:
    found = {}
    if levels.l1 and levels.l2:
        found["l1"] = crossing(xs, ys, levels.l1, levels.l2)
    if levels.l2_last and levels.dram:
        found["l2"] = crossing(xs, ys, levels.l2_last, levels.dram)
    return found


def _level_samples(sweep: dict[int, list[float]], level: curves.Level) -> list[float]:
    """One value per repetition: the geometric mean of that repetition's points on the level."""
    on_level = [samples for size, samples in sweep.items() if level.first_x <= size <= level.last_x]
    return [math.exp(statistics.fmean(math.log(s[r]) for s in on_level)) for r in range(len(on_level[0]))]


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.0f} KiB"


def _describe(level: curves.Level) -> str:
    return f"{level.value:.0f} cycles over {_size(level.first_x)} .. {_size(level.last_x)}"


def figures_from_sweep(sweep: dict[int, list[float]], l2_bytes: int, result: ProbeResult) -> None:
    """The latency and capacity figures of a sweep {working-set bytes: cycles per load, one per repetition}."""
    xs = sorted(sweep)
    ys = [statistics.median(sweep[x]) for x in xs]
    result.curves["chase_global"] = Curve("working set (byte)", "latency (cycle per load)", tuple(zip(xs, ys)))
    found = latency_levels(xs, ys, l2_bytes)
    method = (f"one thread chasing a random cyclic chain, a pointer per {LINE_BYTES}-byte line, "
              f"{STEPS} dependent ld.global.ca timed by clock64")
    for name, level, where in (("l1", found.l1, "the plateau of the smallest working sets"),
                               ("l2", found.l2, "the first plateau past L1"),
                               ("dram", found.dram, "the longest plateau past the L2 size")):
        if level is None:
            result.notes.append(f"chase_global: no {name} plateau found; levels "
                                f"{[_describe(lv) for lv in curves.levels(xs, ys)]}")
            continue
        result.figures.append(figure(f"{name}_latency_cycles", _level_samples(sweep, level), "cycle",
                                     f"{method}; {where} ({_describe(level)}), per repetition"))
    for level in found.extra:
        result.notes.append(f"chase_global: an extra latency step, {_describe(level)} (two L2 partitions, "
                            "the far one slower, or a TLB level's reach)")
    if found.l2 is not found.l2_last and found.l2_last is not None:
        result.notes.append(f"chase_global: L2 shows more than one level (two partitions, the far one slower, or "
                            f"the first-level TLB's reach): l2_latency_cycles is the first, {_describe(found.l2)}; "
                            f"the capacity knee is read off the last, {_describe(found.l2_last)}")

    # A knee is known to within the sweep's step: that step is its spread (the
    # repetitions agree on the levels far better than on which points a gradual
    # transition assigns to which level).
    for name, x in _knees(xs, ys, found).items():
        result.figures.append(Figure(f"{name}_capacity_latency_knee", x, "byte",
                                     f"{method}; where the median curve crosses midway (geometric) from the "
                                     f"{name} plateau to the next; spread = one sweep step", REPETITIONS,
                                     round(SWEEP_STEP - 1, 4)))


def _chase_global(gpu, lines, next_buf, cycles, last, size: int, l2_bytes: int) -> list[float]:
    count = size // LINE_BYTES
    following, start = random_cycle(count)
    next_buf.upload(following)
    link = gpu.kernel("latency.cu", "link_chain")
    link.launch(gpu.sm_count * 4, 256, [(lines.ptr, "ptr"), (next_buf.ptr, "ptr"), (count, "i64")])
    warm = count if size <= 2 * l2_bytes else WARM_STEPS_PAST_L2
    chase = gpu.kernel("latency.cu", "chase_global")
    # Where a lap is not warmed whole, each repetition starts further along the cycle: lines an
    # earlier repetition touched would answer from L2.
    order = np.random.default_rng(SEED).permutation(count) if warm < count else None
    samples = []
    for r in range(REPETITIONS):
        if order is not None:
            start = int(order[(r * (warm + STEPS)) % count])
        chase.launch(1, 1, [(lines.ptr, "ptr"), (start, "u32"), (warm, "i64"), (STEPS, "int"),
                            (cycles.ptr, "ptr"), (last.ptr, "ptr")])
        gpu.synchronize()
        samples.append(int(cycles.download(np.int64, 1)[0]) / STEPS)
    return samples


def _chase_shared(gpu, next_buf, cycles, last) -> list[float]:
    following, start = random_cycle(SHARED_WORDS, SEED + 1)
    next_buf.upload(following)
    chase = gpu.kernel("latency.cu", "chase_shared_memory")
    samples = []
    for _ in range(REPETITIONS):
        chase.launch(1, 128, [(next_buf.ptr, "ptr"), (SHARED_WORDS, "int"), (start, "u32"), (STEPS, "int"),
                              (cycles.ptr, "ptr"), (last.ptr, "ptr")])
        gpu.synchronize()
        samples.append(int(cycles.download(np.int64, 1)[0]) / STEPS)
    return samples


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    l2_bytes = gpu.attributes["L2_CACHE_SIZE"]
    lines = gpu.buffer(max(SIZES))
    next_buf = gpu.buffer(4 * (max(SIZES) // LINE_BYTES))
    cycles, last = gpu.buffer(64), gpu.buffer(64)

    sweep = {}
    for size in SIZES:
        sweep[size] = _chase_global(gpu, lines, next_buf, cycles, last, size, l2_bytes)
        gpu.progress(f"  pointer chase over {_size(size):>10s}: {statistics.median(sweep[size]):6.1f} cycles")
    figures_from_sweep(sweep, l2_bytes, result)

    shared = _chase_shared(gpu, next_buf, cycles, last)
    gpu.progress(f"  pointer chase in shared memory: {statistics.median(shared):.1f} cycles")
    result.figures.append(figure("shared_latency_cycles", shared, "cycle",
                                 f"one thread chasing a random cyclic chain of {SHARED_WORDS} words in shared "
                                 f"memory, {STEPS} dependent ld.shared.u32 timed by clock64"))
    for buf in (lines, next_buf, cycles, last):
        gpu.release(buf)
    return result
