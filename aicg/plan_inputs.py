"""The planner's inputs, resolved from a hwdb entry: measured, else datasheet, else a prior constant.

Each input names where its value may come from, best first. A measured
figure (written by `doit probe`) beats a datasheet fact; where the entry
has neither, the prior constant stands in. The plan's key holds each
input's value and source, so a re-probe that moves one figure rebuilds
exactly the plans that read it, and `doit explain` can say what ranked a
kernel.

`resolve(hardware, measured=False)` gives the datasheet-only model, the
baseline that measuring has to beat.
"""
from __future__ import annotations

from dataclasses import dataclass

from .hw import Hardware

LOADS_IN_FLIGHT = 4        # independent accesses per thread in the row kernels (row_access.cuh UNROLL)
TINY_ROW = 4               # elements per row a thread serving several rows holds (row_access.cuh TINY_ROW)
SECTOR_BYTES = 32          # the unit of a DRAM transaction
SHARED_ROUND_TRIPS = 4     # a block reduction: write partials, barrier, read them, barrier


@dataclass(frozen=True)
class PlanInput:
    value: float
    source: str            # "measured <fact> (<probe>, <date>)", "datasheet <fact>" or "prior constant"

    def as_record(self) -> dict:
        return {"value": self.value, "source": self.source}


def _fact(hardware: Hardware, name: str, measured: bool) -> PlanInput | None:
    fact = (hardware.facts if measured else hardware.datasheet).get(name)
    if fact is None:
        return None
    if fact.source == "measured":
        where = dict(fact.provenance)
        return PlanInput(fact.value, f"measured {name} ({where['probe']} probe, {where['date']})")
    return PlanInput(fact.value, f"datasheet {name}")


def _first(hardware: Hardware, measured: bool, *names: str) -> PlanInput | None:
    return next((found for name in names if (found := _fact(hardware, name, measured)) is not None), None)


def resolve(hardware: Hardware, measured: bool = True) -> dict[str, PlanInput]:
    def fact(*names):
        return _first(hardware, measured, *names)

    inputs = {name: fact(name) for name in ("sm_count", "max_threads_per_block", "max_threads_per_sm",
                                            "max_blocks_per_sm", "registers_per_sm", "shared_memory_per_sm",
                                            "shared_memory_per_block_optin")}
    # A row operator reads and writes its bytes: the copy rate is its ceiling.
    inputs["dram_bandwidth"] = fact("dram_copy_bandwidth", "dram_bandwidth")
    # Where re-read rows stop hitting: the measured knee, or the L2 size.
    inputs["l2_capacity"] = fact("l2_capacity_knee", "l2_cache")

    l2, dram = fact("l2_read_bandwidth"), fact("dram_read_bandwidth")
    inputs["cached_sweep_speedup"] = (
        PlanInput(l2.value / dram.value, f"{l2.source} / {dram.source}") if l2 and dram
        else PlanInput(3.0, "prior constant: an L2 re-read against a DRAM read"))

    inputs["launch_seconds"] = fact("launch_overhead") or PlanInput(3e-6, "prior constant: a launch and its tail")

    # Bytes in flight per SM that saturate DRAM: measured, else one 16-byte
    # access per resident thread, LOADS_IN_FLIGHT deep.
    latency, clock = fact("dram_latency_cycles"), fact("sm_clock_under_load", "boost_clock")
    inputs["saturating_bytes_per_sm"] = fact("dram_bytes_in_flight_90") or (
        # Little's law: bytes in flight = bandwidth x latency
        PlanInput(inputs["dram_bandwidth"].value * latency.value / (clock.value * 1e6) / inputs["sm_count"].value,
                  f"Little's law: {inputs['dram_bandwidth'].source} x {latency.source} / {clock.source}")
        if latency else
        PlanInput(inputs["max_threads_per_sm"].value * 16 * LOADS_IN_FLIGHT,
                  f"{inputs['max_threads_per_sm'].source} x 16 B x {LOADS_IN_FLIGHT} loads"))

    # What one wait for memory costs a lane walking its row: the measured load-to-use
    # latency of DRAM (a first sweep) and of L2 (a re-read), else prior constants.
    for name, level, prior in (("dram_latency_seconds", "dram", 6e-7), ("l2_latency_seconds", "l2", 3e-7)):
        cycles = fact(f"{level}_latency_cycles")
        inputs[name] = (PlanInput(cycles.value / (clock.value * 1e6), f"{cycles.source} / {clock.source}")
                        if cycles and clock else PlanInput(prior, f"prior constant: a {level} load's latency"))

    # Lanes a row apart (a thread per row): useful share of each 4-byte access.
    inputs["uncoalesced_penalty"] = fact("uncoalesced_penalty") or PlanInput(
        SECTOR_BYTES / 4, f"prior constant: a {SECTOR_BYTES}-byte sector per 4-byte access")

    # Blocks that may share a row through distributed shared memory (thread-block clusters, sm_90 on).
    inputs["max_cluster_blocks"] = fact("max_cluster_blocks") or PlanInput(1, "prior constant: no thread-block clusters")

    latency = fact("shared_latency_cycles")
    inputs["block_reduction_seconds"] = (
        PlanInput(SHARED_ROUND_TRIPS * latency.value / (clock.value * 1e6),
                  f"{SHARED_ROUND_TRIPS} x {latency.source} / {clock.source}") if latency
        else PlanInput(1e-6, "prior constant: a shared-memory reduction with two barriers"))
    missing = [name for name, value in inputs.items() if value is None]
    if missing:
        raise KeyError(f"hwdb entry {hardware.target} gives no value for plan input {missing[0]}")
    return inputs


def values(inputs: dict[str, PlanInput]) -> dict[str, float]:
    return {name: i.value for name, i in inputs.items()}


def _shown(value: float) -> str:
    return f"{value:.4g}"


def describe(inputs: dict[str, PlanInput], indent: str = "    ") -> list[str]:
    """One line per input: name, value, and where the value came from."""
    width = max(map(len, inputs))
    return [f"{indent}{name:<{width}}  {_shown(i.value):>10}  {i.source}" for name, i in inputs.items()]
