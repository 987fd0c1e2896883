"""The matrix family's cost prior: a realisation's time at a shape, from the target's hwdb facts.

It ranks candidates before the device times them; it only has to put good
ones ahead of bad ones. Each input is a fact of the target's hwdb entry
(measured where `doit probe` measured it, else the datasheet) or a stated
prior constant, with where it came from (`inputs`): the tensor cores' peak
per instruction family (the probe's wgmma and mma.sync rates), DRAM and L2
read bandwidth, the bytes in flight an SM needs to saturate DRAM by TMA,
cp.async and plain loads, the SM count and a launch's overhead.

A tiled realisation (wgmma, mma) takes the longest of:
  compute   whole waves of tiles (wave quantisation: tiles over the CTAs the
            GPU holds at once, each tile padded to whole tiles and K slices)
            at the template's tensor-core rate per SM, scaled by how well a
            warp's tile reuses its operands (mma.sync) and by whether the
            copies are asynchronous
  L2        every tile's A and B slices, (block_m + block_n) x K, read from L2
            (an operand a cluster shares counts once a cluster: B along M, A along N)
            at the L2 rate of their loads: for wgmma the bulk copy's (TMA's), of tiles
            several SMs read at once where the probe measured that
  DRAM      A, B and C (and the residual) once, at the bandwidth the bytes in
            flight (stages x slice bytes x resident CTAs) reach
plus a split-K reduction's partial sums written and read back, and a launch.
The decode realisation (gemv) streams the weight once: its bytes at the
bandwidth its loads in flight reach, slowed where SMs hold unequal numbers
of its CTAs (the even spread's one wave holds equal numbers), the partial
sums of blocks split across CTAs, and the MMA work of 16 padded rows.

Knobs the model does not read it cannot rank. Those a matrix profile's
measurements rank (CALIBRATED_KNOBS: the schedule, the epilogue's store, the
decode kernel's ring; aicg/matrix/calibration.py) the planner takes at each
combination the space tries; the others (raster order, band size) at the
values the space tries first.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..hw import Hardware
from ..plan_inputs import PlanInput
from .problem import Problem
from .space import Realisation
from .templates import RULES

# Knobs each template's model reads; the others are ranked by the space's `tried` order.
MODELLED_KNOBS = {
    "wgmma": ("block_m", "block_n", "stages", "cluster_m", "cluster_n", "split_k"),
    "mma": ("block_m", "block_n", "block_k", "warps_m", "warps_n", "stages", "aligned"),
    "gemv": ("warps", "tiles", "unroll"),
}
# Knobs the model reads whose values the planner takes only from the space's tried settings: ptxas
# spills some untried even-spread settings (4-16 bytes, with an activation's epilogue), and a spill
# voids a design.
TRIED_ONLY_KNOBS = {"gemv": ("spread",)}
# Knob values the planner takes only from the space's tried settings, not in every combination of the
# modelled knobs: values no matrix profile has measured yet, whose effect the calibration cannot
# carry (it takes them as neutral), where the model alone would rank them first far from the regime
# they were made for (clusters along N sharing A at M = 4096, say).
TRIED_ONLY_VALUES = {"wgmma": {"cluster_n": (2, 4), "block_n": (32, 48, 96)}}
# mma.sync on a GPU whose tensor cores also take wgmma reaches only part of their peak: the H100's
# probe measured 631 of 962 TFLOP/s (hwdb/h100-sxm.toml, 2026-12-05).
MMA_SYNC_SHARE_WITH_WGMMA = 0.66
ELEMENTWISE_SLOWDOWN = 4.0        # copies one element at a time, without cp.async: no overlap, 2-byte accesses
WARP_TILE_REUSE = 32.0            # a warp tile of m x n reuses its operands fully from m n / (m + n) of 32 on
REGISTER_BASE, REGISTER_PER_ACCUMULATOR = 40, 1.5   # mma.sync threads' registers, for occupancy (ptxas: 72..229)
# What an mma.sync thread holds at once: its accumulators, one block_k slice of A and B fragments
# (4 registers an m16 x k16 A fragment, 2 an n8 x k16 B fragment) and addressing. ptxas used 229
# registers for 128 accumulators at block_k 32 (estimate 224) and spilled at block_k 64 (288).
MMA_ADDRESSING_REGISTERS = 32
# Knobs the model does not read whose effect a matrix profile measures (aicg/matrix/calibration.py).
CALIBRATED_KNOBS = {"wgmma": ("schedule", "store"), "gemv": ("ring",)}
GEMV_ROWS = 16                    # the decode kernel computes 16 rows, whatever M
# A copy issued while every SM streams waits longer than the probe's lone copy: the ring is sized
# for twice the measured latency.
LOADED_LATENCY = 2.0


def _fact(hardware: Hardware, *names: str) -> PlanInput | None:
    for name in names:
        fact = hardware.facts.get(name)
        if fact is None:
            continue
        if fact.source == "measured":
            where = dict(fact.provenance)
            return PlanInput(fact.value, f"measured {name} ({where['probe']} probe, {where['date']})")
        return PlanInput(fact.value, f"datasheet {name}")
    return None


def inputs(hardware: Hardware) -> dict[str, PlanInput]:
    """The matrix prior's inputs, each with its source (names prefixed `matrix.`)."""
    found = {"sm_count": _fact(hardware, "sm_count"),
             "registers_per_sm": _fact(hardware, "registers_per_sm"),
             "max_threads_per_sm": _fact(hardware, "max_threads_per_sm"),
             "shared_memory_per_sm": _fact(hardware, "shared_memory_per_sm"),
             "dram_read_bandwidth": _fact(hardware, "dram_read_bandwidth", "dram_bandwidth")}
    peak = _fact(hardware, "bf16_tensor_flops")
    for dtype, probe in (("bfloat16", "bf16"), ("float16", "fp16")):
        wgmma = _fact(hardware, f"wgmma_{probe}_flops") or (
            PlanInput(w.value, f"{w.source} (the same rate for float16: the tensor cores' datasheet gives one figure "
                               f"for both)") if (w := _fact(hardware, "wgmma_bf16_flops")) else peak)
        found[f"wgmma_flops.{dtype}"] = wgmma
        mma = _fact(hardware, f"mma_sync_{probe}_flops", "mma_sync_bf16_flops")
        if mma is None:
            mma = (PlanInput(peak.value * MMA_SYNC_SHARE_WITH_WGMMA,
                             f"{peak.source} x {MMA_SYNC_SHARE_WITH_WGMMA} (prior constant: mma.sync's share of the "
                             f"tensor cores where wgmma exists)")
                   if tuple(hardware.compute_capability) >= (9, 0) else peak)
        found[f"mma_flops.{dtype}"] = mma
    dram = found["dram_read_bandwidth"]
    found["l2_read_bandwidth"] = _fact(hardware, "l2_read_bandwidth") or PlanInput(
        3.0 * dram.value, f"3 x {dram.source} (prior constant: an L2 read against a DRAM read)")
    l2 = found["l2_read_bandwidth"]
    # the slices a wave of tiles shares are read by several SMs at once: the bulk copy's rate so, where measured
    found["tma_l2_read_bandwidth"] = _fact(hardware, "bulk_copy_l2_shared_bandwidth", "bulk_copy_l2_bandwidth") or \
        PlanInput(l2.value, f"{l2.source} (plain loads: the bulk copy's L2 rate is not measured)")
    for name, fact, what in (("tma_bytes_in_flight", "bulk_copy_bytes_in_flight_90", "TMA"),
                             ("cp_async_bytes_in_flight", "cp_async_bytes_in_flight_90", "cp.async"),
                             ("load_bytes_in_flight", "dram_bytes_in_flight_90", "plain loads")):
        found[name] = _fact(hardware, fact) or PlanInput(
            32768, f"prior constant: 32 KiB in flight an SM saturate DRAM by {what}")
    clock = _fact(hardware, "sm_clock_under_load", "boost_clock")
    for name, fact, prior_seconds in (("tma_latency_seconds", "bulk_copy_latency_cycles", 6e-7),
                                      ("cp_async_latency_seconds", "cp_async_latency_cycles", 5e-7)):
        cycles = _fact(hardware, fact)
        found[name] = (PlanInput(cycles.value / (clock.value * 1e6), f"{cycles.source} / {clock.source}") if cycles
                       else PlanInput(prior_seconds, "prior constant: a copy's latency from DRAM"))
    found["launch_seconds"] = _fact(hardware, "launch_overhead") or PlanInput(
        3e-6, "prior constant: a launch and its tail")
    missing = [name for name, value in found.items() if value is None]
    if missing:
        raise KeyError(f"hwdb entry {hardware.target} gives no value for the matrix prior's input {missing[0]}")
    return found


def values(found: dict[str, PlanInput]) -> dict[str, float]:
    return {name: i.value for name, i in found.items()}


@dataclass(frozen=True)
class Terms:
    compute: float
    l2: float
    dram: float
    reduction: float
    launch: float

    @property
    def seconds(self) -> float:
        return max(self.compute, self.l2, self.dram) + self.reduction + self.launch


def _fill(bytes_in_flight_per_sm: float, saturating: float) -> float:
    return min(1.0, bytes_in_flight_per_sm / saturating)


def _coverage(stages: int, slice_seconds: float, latency: float) -> float:
    """The share of the tensor cores' rate a ring of `stages` slots keeps: a slot is refilled while
    the others are consumed, and the copy into it takes LOADED_LATENCY x the measured latency."""
    needed = math.ceil(LOADED_LATENCY * latency / slice_seconds) + 1
    return 1.0 if needed <= 1 else min(1.0, (stages - 1) / (needed - 1))


def _io_bytes(problem: Problem) -> float:
    e = problem.epilogue
    return 2.0 * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n * (1 + e.residual)
                  + problem.n * e.bias)


def _wgmma(real: Realisation, p: Problem, hw: dict) -> Terms:
    k = _knobs(real)
    rules = RULES["wgmma"]
    bm, bn, along_m, along_n = k["block_m"], k["block_n"], k["cluster_m"], k["cluster_n"]
    cluster = along_m * along_n
    work = rules.work(real, p) if hasattr(rules, "work") else None
    tiles = work.tiles if work else -(-p.m // bm) * -(-p.n // bn)
    splits = work.splits if work else 1
    k_blocks = -(-p.k // 64)
    units = tiles * splits
    ctas = max(cluster, hw["sm_count"] // cluster * cluster)
    waves = -(-units // ctas)
    per_sm = hw[f"wgmma_flops.{p.dtype}"] / hw["sm_count"]
    coverage = _coverage(k["stages"], 2.0 * bm * bn * 64 / per_sm, hw["tma_latency_seconds"])
    compute = waves * 2.0 * bm * bn * 64 * -(-k_blocks // splits) / (per_sm * coverage)
    slice_bytes = (bm / along_n + bn / along_m) * 64 * 2
    l2 = tiles * k_blocks * slice_bytes / hw["tma_l2_read_bandwidth"]
    in_flight = k["stages"] * (bm + bn) * 64 * 2 * min(1.0, units / hw["sm_count"])
    dram = _io_bytes(p) / (hw["dram_read_bandwidth"] * _fill(in_flight, hw["tma_bytes_in_flight"]))
    reduction = (2.0 * units * bm * bn * 4 / hw["dram_read_bandwidth"]) if splits > 1 else 0.0
    return Terms(compute, l2, dram, reduction, hw["launch_seconds"])


@functools.lru_cache(maxsize=1 << 14)
def _knobs(real: Realisation) -> dict:
    """The realisation's knob settings (read-only: shared between calls)."""
    return real.settings


@functools.lru_cache(maxsize=1 << 14)
def _mma_blocks_per_sm(real: Realisation, threads_per_sm: int, registers_per_sm: int, shared_per_sm: int) -> int:
    rules = RULES["mma"]
    threads = rules.threads(real)
    registers = min(255, REGISTER_BASE + REGISTER_PER_ACCUMULATOR * rules.accumulators(real))
    return max(1, min(threads_per_sm // threads, int(registers_per_sm // (registers * threads)),
                      shared_per_sm // max(1, rules.dynamic_shared_bytes(real))))


def mma_registers(real: Realisation) -> int:
    k = _knobs(real)
    warp_m, warp_n = k["block_m"] // k["warps_m"], k["block_n"] // k["warps_n"]
    fragments = k["block_k"] // 16 * (warp_m // 16 * 4 + warp_n // 8 * 2)
    return RULES["mma"].accumulators(real) + fragments + MMA_ADDRESSING_REGISTERS


def expected_to_spill(real: Realisation, registers_per_thread: int) -> bool:
    """Whether the prior expects ptxas to spill the realisation (a spill voids a matrix design:
    aicg/matrix/build.py); the compile step still decides."""
    return real.template == "mma" and mma_registers(real) > registers_per_thread


def _mma(real: Realisation, p: Problem, hw: dict) -> Terms:
    k = _knobs(real)
    bm, bn, bk = k["block_m"], k["block_n"], k["block_k"]
    tiles = -(-p.m // bm) * -(-p.n // bn)
    blocks = _mma_blocks_per_sm(real, int(hw["max_threads_per_sm"]), int(hw["registers_per_sm"]),
                                int(hw["shared_memory_per_sm"]))
    waves = -(-tiles // (hw["sm_count"] * blocks))
    warp_m, warp_n = bm / k["warps_m"], bn / k["warps_n"]
    reuse = min(1.0, warp_m * warp_n / (warp_m + warp_n) / WARP_TILE_REUSE)
    slow = 1.0 if k["aligned"] else ELEMENTWISE_SLOWDOWN
    per_sm = hw[f"mma_flops.{p.dtype}"] / hw["sm_count"] * reuse / slow
    coverage = _coverage(k["stages"], 2.0 * bm * bn * bk * blocks / per_sm, hw["cp_async_latency_seconds"])
    compute = waves * blocks * 2.0 * bm * bn * (-(-p.k // bk) * bk) / (per_sm * coverage)
    l2 = slow * tiles * (bm + bn) * p.k * 2 / hw["l2_read_bandwidth"]
    in_flight = blocks * k["stages"] * (bm + bn) * bk * 2 * min(1.0, tiles / hw["sm_count"])
    dram = slow * _io_bytes(p) / (hw["dram_read_bandwidth"] * _fill(in_flight, hw["cp_async_bytes_in_flight"]))
    return Terms(compute, l2, dram, 0.0, hw["launch_seconds"])


def _gemv(real: Realisation, p: Problem, hw: dict) -> Terms:
    k = _knobs(real)
    rules = RULES["gemv"]
    geometry = rules.geometry(real, p, int(hw["sm_count"]), None)
    ctas = geometry.grid[0] * geometry.grid[1]
    if k["spread"] == "bulk":
        # the ring's stages in flight but the one read; a CTA's run of whole blocks, the longest
        # run sets the time
        in_flight = min(ctas, hw["sm_count"] * rules.blocks_per_sm_estimate(real)) / hw["sm_count"] \
            * (k["ring"] - 1) * rules.bulk_stage_bytes(real)
        per_cta = -(-p.n // rules.columns_per_block(real)) / ctas
        balance = per_cta / math.ceil(per_cta) * min(1.0, ctas / hw["sm_count"])
    else:
        resident = min(ctas * rules.threads(real), hw["sm_count"] * hw["max_threads_per_sm"])
        in_flight = resident / hw["sm_count"] * 16 * k["tiles"] * k["unroll"]
        # Each CTA streams an equal share of the weight and the busiest SM, with ceil(ctas / SMs) of
        # them, sets the time: 448 CTAs on 132 SMs keep the weight's reads at 3.39 / 4 of the rate.
        # The even spread's grid is one full wave (a whole number of CTAs an SM): no SM idles.
        per_sm = ctas / hw["sm_count"]
        balance = per_sm / math.ceil(per_sm)
    dram = _io_bytes(p) / (hw["dram_read_bandwidth"] * _fill(in_flight, hw["load_bytes_in_flight"]) * balance)
    compute = 2.0 * GEMV_ROWS * p.n * p.k / hw[f"mma_flops.{p.dtype}"]
    if k["spread"] in ("warps", "bulk"):     # the warps' sums are added in shared memory
        partial_bytes = 0
    elif k["spread"] == "even":
        published = rules.even_shares(real, p, int(hw["sm_count"])).partial_segments if geometry.splits > 1 else 0
        partial_bytes = published * p.m * rules.columns_per_block(real) * 4
    else:
        partial_bytes = geometry.splits * p.m * p.n * 4 if geometry.splits > 1 else 0
    reduction = 2.0 * partial_bytes / hw["dram_read_bandwidth"]    # written, then read back
    blocks = -(-p.n // rules.columns_per_block(real))
    l2 = blocks * p.m * p.k * 2 / hw["l2_read_bandwidth"]     # A, read for every column block
    return Terms(compute, l2, dram, reduction, hw["launch_seconds"])


MODELS = {"wgmma": _wgmma, "mma": _mma, "gemv": _gemv}


def terms(real: Realisation, problem: Problem, hw: dict) -> Terms:
    return MODELS[real.template](real, problem, hw)


def predict_seconds(real: Realisation, problem: Problem, hw: dict) -> float:
    return terms(real, problem, hw).seconds


def modelled_key(real: Realisation) -> tuple:
    """What the model reads of a realisation: realisations alike in it are predicted alike."""
    k = _knobs(real)
    names = MODELLED_KNOBS[real.template] + TRIED_ONLY_KNOBS.get(real.template, ())
    return (real.template, real.dtype, real.epilogue, tuple(k.get(name) for name in names))


def is_finite(seconds: float) -> bool:
    return math.isfinite(seconds) and seconds > 0
