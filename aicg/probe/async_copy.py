"""Asynchronous global-to-shared copies: bandwidth against bytes in flight per SM, and latency.

Three ways into an SM stream a 2 GiB buffer (far past any L2) with one
block per SM (each launch asks for more than half the SM's shared memory,
so no two blocks share one), kernels/probes/async_copy.cu:
  cp.async      16-byte cp.async.cg per thread, 1, 2, 4 or 8 stages
                deep (commit_group / wait_group), blocks of 128 .. 1024
                threads: block x 16 B x stages in flight per SM;
  ld.global     the reference: 16-byte loads into registers, 1 .. 8 per
                thread issued before the first is used, same blocks;
  bulk copy     (compute capability 9.0+) the copy engine's non-tensor form,
                cp.async.bulk of a 2 .. 32 KiB tile per stage completed on an
                mbarrier, 1 .. 8 stages, one thread issuing for 128;
  bulk from L2  the same copies read again and again from a quarter of the
                L2: the rate TMA tile loads reach when they hit in the L2
                (the working-set probe measures it with plain loads); and
                from a few tiles each read by about 8 SMs at the same step,
                as a wave of matrix tiles reads the slices its CTAs share.
Each configuration is timed by events over the bytes it reads; where two
give the same bytes in flight the faster is kept. A mechanism's bandwidth
is its curve's plateau (curves.plateau), and its bytes in flight the least
that reach 90% of it (curves.saturation_point).

Latency: one thread copies 16 bytes (cp.async) or a 4 KiB tile (bulk) at
a time, each LATENCY_STEP past the last in a part of the buffer a stream of
four L2 sizes has just pushed out of the L2, so every copy comes from DRAM;
clock64 spans the issue to the wait's return (that includes the wait's own
few cycles). The figure is the median copy of a launch, over repetitions.

Every copy is consumed: each thread xors a word of each tile it waited for
into a value written to a sink, and the loads fold all 16 bytes.

Read by the planner: the matrix prior takes the bulk copy's bytes in
flight and latency for its TMA ring, and its L2 rate for the wgmma tiles'
reads from the L2 (aicg/matrix/prior.py). The row families that hold a row
(register_staging) stage it in registers through ld.global; the staged
topology (block_staged, shared_staging) copies a row into shared memory
with cp.async, all of it in flight at once, and the planner models that
stream with the DRAM figures, which this probe's plateau matches within
about 1% on the H200; none of them uses the bulk copy.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from . import curves
from .figures import Curve, ProbeResult, figure

NAME = "async_copy"
SOURCES = (("async_copy.cu", ("sm_80", "sm_90")),)
FIGURES = {"cp_async_bandwidth": "byte/s", "cp_async_bytes_in_flight_90": "byte",
           "bulk_copy_bandwidth": "byte/s", "bulk_copy_bytes_in_flight_90": "byte",
           "bulk_copy_l2_bandwidth": "byte/s", "bulk_copy_l2_bytes_in_flight_90": "byte",
           "bulk_copy_l2_shared_bandwidth": "byte/s", "bulk_copy_l2_shared_bytes_in_flight_90": "byte",
           "cp_async_latency_cycles": "cycle", "bulk_copy_latency_cycles": "cycle"}

BUFFER_BYTES = 1 << 31
BLOCKS = (128, 256, 512, 1024)          # threads per block (one block per SM)
DEPTHS = (1, 2, 4, 8)                   # cp.async stages and ld.global loads per thread: async_copy.cu's entries
BULK_TILES = (2048, 4096, 8192, 16384, 32768)
BULK_STAGES = (1, 2, 4, 8)
BULK_BLOCK = 128
L2_SHARE = 4                            # the L2-resident working set: this part of the L2
L2_STREAM_BYTES = 512 << 20             # read per launch from it
L2_SHARED_BY = 8                        # SMs reading a tile at once in the shared series (a band of 8 tiles' slice)
BULK_BARRIER_BYTES = 128                # as in async_copy.cu
BULK_MOST_IN_FLIGHT = 192 << 10         # stage bytes per block, within every sm_90 part's shared memory
LATENCY_COUNT = 64                      # copies per latency launch
LATENCY_STEP = 64 << 10                 # bytes between them: a new DRAM page and line each time
BULK_LATENCY_BYTES = 4096
FLUSH_L2_TIMES = 4
REPETITIONS, LAUNCHES = 5, 3


@dataclass(frozen=True)
class Point:
    bytes_in_flight: int
    config: str
    rates: list          # byte/s, one per repetition


def best_by_bytes_in_flight(points: list[Point]) -> dict[int, Point]:
    """For each bytes-in-flight value, the configuration with the highest median rate."""
    best: dict[int, Point] = {}
    for p in points:
        kept = best.get(p.bytes_in_flight)
        if kept is None or statistics.median(p.rates) > statistics.median(kept.rates):
            best[p.bytes_in_flight] = p
    return dict(sorted(best.items()))


def plateau_point(best: dict[int, Point]) -> Point:
    """The point whose median rate is the curve's plateau (curves.plateau: the median of the top three)."""
    xs = list(best)
    level = curves.plateau(xs, [statistics.median(best[x].rates) for x in xs])
    return next(p for p in best.values() if statistics.median(p.rates) == level)


def cp_async_configs(max_shared: int) -> list[tuple[int, int]]:
    """(block, stages) pairs whose stages fit in a block's shared memory."""
    return [(block, stages) for block in BLOCKS for stages in DEPTHS if block * 16 * stages <= max_shared]


def bulk_configs(max_shared: int) -> list[tuple[int, int]]:
    """(tile bytes, stages) pairs within BULK_MOST_IN_FLIGHT and the block's shared memory."""
    return [(tile, stages) for tile in BULK_TILES for stages in BULK_STAGES
            if tile * stages <= min(BULK_MOST_IN_FLIGHT, max_shared - BULK_BARRIER_BYTES)]


def curve_of(best: dict[int, Point]) -> Curve:
    return Curve("bytes in flight per SM (byte)", "bandwidth (byte/s)",
                 tuple((x, statistics.median(p.rates)) for x, p in best.items()))


def figures_of(label: str, points: list[Point], method: str, result: ProbeResult) -> None:
    """`<label>_bandwidth` (the plateau) and `<label>_bytes_in_flight_90`, and the curve behind them."""
    best = best_by_bytes_in_flight(points)
    result.curves[label] = curve_of(best)
    xs, ys = zip(*result.curves[label].points)
    top = plateau_point(best)
    result.figures.append(figure(f"{label}_bandwidth", top.rates, "byte/s",
                                 f"{method}; the curve's plateau (median of its three best points), here "
                                 f"{top.config}, {top.bytes_in_flight} B in flight per SM"))
    x90 = curves.saturation_point(xs, ys, 0.9)
    result.figures.append(figure(f"{label}_bytes_in_flight_90", [x90] * len(top.rates), "byte",
                                 f"least bytes in flight per SM whose bandwidth reaches 90% of {label}_bandwidth "
                                 f"({best[x90].config}); {method}"))


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    hopper = tuple(gpu.compute_capability) >= (9, 0)
    source = gpu.buffer(BUFFER_BYTES)
    sink = gpu.buffer(gpu.sm_count * max(BLOCKS) * 4)
    max_shared = gpu.attributes["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"]
    resident_bytes = gpu.attributes["L2_CACHE_SIZE"] // L2_SHARE
    # More than half an SM's shared memory: no two blocks fit on one SM, so a grid of sm_count is one per SM.
    alone = min(max_shared, gpu.attributes["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"] // 2 + 1024)
    grid = gpu.sm_count
    # tiles of the shared L2 series: about L2_SHARED_BY blocks read each at a step, and where grid is no
    # multiple of it (132 SMs: 17 tiles) the remainder moves every block on to another tile the next step
    shared_span = grid // L2_SHARED_BY + 1

    def timed(kernel, block: int, shared: int, args: list, nbytes: int) -> list[float]:
        shared = max(shared, alone)
        kernel.allow_shared_bytes(shared)
        work = lambda: kernel.launch(grid, block, args, shared_bytes=shared)  # noqa: E731
        return [nbytes / (ms * 1e-3) for ms in gpu.repeat(work, REPETITIONS, LAUNCHES, warmup=1)]

    cp_async, loads, bulk, bulk_l2, bulk_l2_shared = [], [], [], [], []
    for block, depth in cp_async_configs(max_shared):
        tiles = BUFFER_BYTES // (block * 16)
        args = [(source.ptr, "ptr"), (tiles, "i64"), (sink.ptr, "ptr")]
        in_flight = block * 16 * depth
        cp_async.append(Point(in_flight, f"{block} threads x {depth} stages",
                              timed(gpu.kernel("async_copy.cu", f"cp_async_stream_{depth}"), block,
                                    in_flight, args, tiles * block * 16)))
        loads.append(Point(in_flight, f"{block} threads x {depth} loads",
                           timed(gpu.kernel("async_copy.cu", f"load_stream_{depth}"), block, 0, args,
                                 tiles * block * 16)))
        gpu.progress(f"  async_copy {block:4d} threads x {depth}: cp.async "
                     f"{statistics.median(cp_async[-1].rates) / 1e12:.2f} TB/s, ld.global "
                     f"{statistics.median(loads[-1].rates) / 1e12:.2f} TB/s")
    if hopper:
        kernel = gpu.kernel("async_copy.cu", "bulk_stream")

        def bulk_point(tiles: int, span: int, tile: int, stages: int) -> Point:
            args = [(source.ptr, "ptr"), (tiles, "i64"), (span, "i64"), (tile, "u32"), (stages, "int"),
                    (sink.ptr, "ptr")]
            return Point(tile * stages, f"{tile} B tiles x {stages} stages",
                         timed(kernel, BULK_BLOCK, BULK_BARRIER_BYTES + tile * stages, args, tiles * tile))

        for tile, stages in bulk_configs(max_shared):
            bulk.append(bulk_point(BUFFER_BYTES // tile, BUFFER_BYTES // tile, tile, stages))
            # again from a working set the L2 holds (the warm-up launch brings it in), each tile read by one SM
            # a pass; then from shared_span tiles, as the CTAs of a wave of matrix tiles read the slices they share
            bulk_l2.append(bulk_point(L2_STREAM_BYTES // tile, resident_bytes // tile, tile, stages))
            bulk_l2_shared.append(bulk_point(L2_STREAM_BYTES // tile, shared_span, tile, stages))
            gpu.progress(f"  async_copy bulk {tile:5d} B x {stages}: "
                         f"{statistics.median(bulk[-1].rates) / 1e12:.2f} TB/s from DRAM, "
                         f"{statistics.median(bulk_l2[-1].rates) / 1e12:.2f} TB/s from the L2, "
                         f"{statistics.median(bulk_l2_shared[-1].rates) / 1e12:.2f} TB/s shared")

    stream = "one {} block per SM streaming %d GiB, bytes read over event time" % (BUFFER_BYTES >> 30)
    figures_of("cp_async", cp_async, "16-byte cp.async.cg, commit/wait_group pipelining, "
               + stream.format("128..1024-thread"), result)
    if bulk:
        figures_of("bulk_copy", bulk, "cp.async.bulk tiles completed on mbarriers, "
                   + stream.format(f"{BULK_BLOCK}-thread"), result)
        figures_of("bulk_copy_l2", bulk_l2, f"cp.async.bulk tiles completed on mbarriers, one {BULK_BLOCK}-thread "
                   f"block per SM reading {L2_STREAM_BYTES >> 20} MiB from a working set of 1/{L2_SHARE} of the L2 "
                   f"({resident_bytes} B, brought in by a warm-up launch), bytes read over event time", result)
        figures_of("bulk_copy_l2_shared", bulk_l2_shared, f"cp.async.bulk tiles completed on mbarriers, one "
                   f"{BULK_BLOCK}-thread block per SM reading {L2_STREAM_BYTES >> 20} MiB from {shared_span} "
                   f"tiles held in the L2, each read by about {L2_SHARED_BY} SMs at the same step, bytes delivered "
                   f"over event time", result)
    else:
        result.notes.append("bulk copy: not measured; cp.async.bulk needs compute capability 9.0")
    load_best = best_by_bytes_in_flight(loads)
    result.curves["ld_global"] = curve_of(load_best)
    load_top, cp_top = plateau_point(load_best), plateau_point(best_by_bytes_in_flight(cp_async))
    result.notes.append(f"ld.global 16-byte loads into registers plateau at "
                        f"{statistics.median(load_top.rates) / 1e12:.2f} TB/s ({load_top.config}); cp.async at "
                        f"{statistics.median(cp_top.rates) / statistics.median(load_top.rates):.2f}x that")

    _latencies(gpu, source, sink, hopper, result)
    gpu.release(source)
    gpu.release(sink)
    return result


def _latencies(gpu, source, sink, hopper: bool, result: ProbeResult) -> None:
    cycles = gpu.buffer(LATENCY_COUNT * 8)
    flush = gpu.kernel("async_copy.cu", "load_stream_4")
    flush_tiles = min(BUFFER_BYTES // 2, FLUSH_L2_TIMES * gpu.attributes["L2_CACHE_SIZE"]) // (1024 * 16)
    # Copies come from the upper half of the buffer, a stretch no earlier launch of this
    # function read for each run; the flush streams the lower half.
    span = LATENCY_COUNT * LATENCY_STEP
    stretches = iter(range(BUFFER_BYTES // 2, BUFFER_BYTES - span + 1, span))

    def median_copy(kernel, args_at) -> list[float]:
        samples = []
        for r in range(REPETITIONS + 1):                  # the first run loads code and warms TLBs: not kept
            flush.launch(gpu.sm_count, 1024, [(source.ptr, "ptr"), (flush_tiles, "i64"), (sink.ptr, "ptr")])
            kernel.launch(1, 1, args_at(source.ptr + next(stretches)))
            gpu.synchronize()
            if r:
                samples.append(float(statistics.median(cycles.download("int64", LATENCY_COUNT))))
        return samples

    cp = gpu.kernel("async_copy.cu", "cp_async_latency")
    result.figures.append(figure(
        "cp_async_latency_cycles",
        median_copy(cp, lambda at: [(at, "ptr"), (LATENCY_STEP // 16, "i64"), (LATENCY_COUNT, "int"),
                                    (cycles.ptr, "ptr"), (sink.ptr, "ptr")]),
        "cycle", f"one thread, one 16-byte cp.async.cg at a time from DRAM ({LATENCY_STEP >> 10} KiB apart, after "
                 f"a stream of {FLUSH_L2_TIMES} L2 sizes), clock64 from issue to wait_group 0; median of "
                 f"{LATENCY_COUNT} copies per launch"))
    if hopper:
        bulk = gpu.kernel("async_copy.cu", "bulk_latency")
        result.figures.append(figure(
            "bulk_copy_latency_cycles",
            median_copy(bulk, lambda at: [(at, "ptr"), (LATENCY_STEP, "i64"), (BULK_LATENCY_BYTES, "u32"),
                                          (LATENCY_COUNT, "int"), (cycles.ptr, "ptr"), (sink.ptr, "ptr")]),
            "cycle", f"one thread, one {BULK_LATENCY_BYTES >> 10} KiB cp.async.bulk at a time from DRAM "
                     f"({LATENCY_STEP >> 10} KiB apart, after a stream of {FLUSH_L2_TIMES} L2 sizes), clock64 from "
                     f"issue to the mbarrier's phase flip; median of {LATENCY_COUNT} copies per launch"))
    gpu.release(cycles)
