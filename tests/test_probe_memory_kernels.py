"""The latency, stride and banks probes without a GPU: their kernels compile for
every target and hold the instructions they time, kept live; the host-side
logic (chains, bank model, figure extraction) gives known answers on
fabricated measurements."""
from __future__ import annotations

import math
import random
import re

import pytest

from aicg.probe import banks, latency, stride
from aicg.probe.figures import ProbeResult
import probe_ptx
from aicg.probe.gpu import compile_probe

PROBES = (latency, stride, banks)
SOURCES = [(file, arch) for probe in PROBES for file, arches in probe.SOURCES for arch in arches]
REGISTERS_PER_SM = 65536     # sm_80 and sm_90


_loops, _report = probe_ptx.loops, probe_ptx.report


@pytest.fixture(scope="module", params=["sm_80", "sm_90"])
def ptx_of(request):
    cache: dict[str, dict[str, str]] = {}

    def entries(file: str) -> dict[str, str]:
        if file not in cache:
            cache[file] = probe_ptx.entries(file, request.param)
        return cache[file]
    return entries


# --- kernels ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("file,arch", SOURCES)
def test_probe_kernel_compiles(file, arch):
    assert compile_probe(file, arch).startswith(b"\x7fELF")
    for entry, report in _report(file, arch).items():
        assert "0 bytes spill stores" in report, f"{file} {entry} spills on {arch}"


@pytest.mark.parametrize("file,block,blocks_per_sm", [("stride.cu", stride.BLOCK, 8), ("banks.cu", banks.BLOCK, 2)])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_full_sm_kernels_fit_the_sm(file, block, blocks_per_sm, arch):
    """The run() grids assume every block of a one-wave, full-SM launch is resident at once."""
    for entry, report in _report(file, arch).items():
        registers = int(re.search(r"Used (\d+) registers", report).group(1))
        assert registers * block * blocks_per_sm <= REGISTERS_PER_SM, (entry, registers)


def test_latency_chase_is_dependent_timed_and_live(ptx_of):
    entries = ptx_of("latency.cu")
    for entry, load in (("chase_global", r"ld\.global\.ca\.u64\s+(%rd\d+), \[\1\];"),
                        ("chase_shared_memory", r"ld\.shared\.u32\s+(%r\d+), \[\1\];")):
        body = entries[entry]
        # each load's address is the previous load's value, inside a loop
        timed = [loop for loop in _loops(body) if len(re.findall(load, loop)) >= 8]
        assert timed, f"{entry}: no loop of dependent loads"
        pointer = re.search(load, timed[0]).group(1)
        assert len(re.findall(r"mov\.u64\s+%rd\d+, %clock64;", body)) == 2
        # the last address reached is stored: the chase is live
        assert re.search(rf"st\.global\.u(32|64)\s+\[%rd\d+\], {re.escape(pointer)};", body), entry


def test_strided_reads_are_live(ptx_of):
    for entry, body in ptx_of("stride.cu").items():
        assert any(len(re.findall(r"ld\.global(\.nc)?\.u32", loop)) >= 8 for loop in _loops(body)), entry
        assert re.search(r"st\.global\.u32", body), f"{entry}: the fold is not stored, loads may go"


@pytest.mark.parametrize("width,instruction", [(4, r"ld\.volatile\.shared\.u32"), (8, r"ld\.volatile\.shared\.v2\.u32"),
                                               (16, r"ld\.volatile\.shared\.v4\.u32")])
def test_bank_conflict_loads_stay_in_the_loop(ptx_of, width, instruction):
    body = ptx_of("banks.cu")[f"bank_conflicts_{width}"]
    assert any(len(re.findall(instruction, loop)) >= banks.UNROLL for loop in _loops(body))
    assert len(re.findall(r"%clock64", body)) == 2
    assert re.search(r"st\.global\.u64", body) and re.search(r"st\.global\.u32", body)


# --- latency ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("count", [1, 2, 64, 1000, 65536])
def test_random_cycle_visits_every_element_once(count):
    following, start = latency.random_cycle(count)
    seen, at = set(), start
    for _ in range(count):
        seen.add(at)
        at = int(following[at])
    assert at == start and len(seen) == count


def test_random_cycle_is_fixed_by_its_seed_and_not_sequential():
    a, _ = latency.random_cycle(4096)
    b, _ = latency.random_cycle(4096)
    assert (a == b).all()
    assert (a == (latency.np.arange(4096) + 1) % 4096).mean() < 0.01


def test_latency_sizes_span_l1_to_far_past_l2():
    sizes = latency.SIZES
    assert sizes[0] == 8 * 1024 and sizes[-1] == 1 << 30
    assert all(s % latency.LINE_BYTES == 0 for s in sizes) and sizes == sorted(set(sizes))
    assert len(sizes) >= 2 * math.log2(sizes[-1] / sizes[0])


def _fabricated_latency(size: int) -> float:
    """An H100-like chase: L1 to 200 KiB, near L2 to 30 MiB, far L2 to 50 MiB, DRAM from 100 MiB."""
    steps = [(200 << 10, 33), (300 << 10, 120), (30 << 20, 260), (55 << 20, 340), (90 << 20, 480)]
    return next((cycles for limit, cycles in steps if size <= limit), 650)


def test_latency_figures_from_a_fabricated_sweep():
    rng = random.Random(7)
    sweep = {s: [_fabricated_latency(s) * rng.uniform(0.98, 1.02) for _ in range(5)] for s in latency.SIZES}
    result = ProbeResult()
    latency.figures_from_sweep(sweep, 50 << 20, result)
    got = {f.name: f for f in result.figures}
    assert got["l1_latency_cycles"].value == pytest.approx(33, rel=0.03)
    assert got["l2_latency_cycles"].value == pytest.approx(260, rel=0.03)
    assert got["dram_latency_cycles"].value == pytest.approx(650, rel=0.03)
    assert 160 << 10 <= got["l1_capacity_latency_knee"].value <= 300 << 10    # between the samples either side
    assert 50 << 20 <= got["l2_capacity_latency_knee"].value <= 100 << 20
    assert all(f.repetitions == 5 and f.unit == latency.FIGURES[f.name] for f in result.figures)
    assert any("more than one level" in note for note in result.notes)    # the far partition's step
    assert result.curves["chase_global"].points[0] == (8192, pytest.approx(33, rel=0.03))


def test_latency_without_a_dram_plateau_says_so():
    sweep = {s: [40.0 if s < 1 << 20 else 300.0] * 5 for s in latency.SIZES}
    result = ProbeResult()
    latency.figures_from_sweep(sweep, 1 << 31, result)        # an L2 larger than the sweep
    names = {f.name for f in result.figures}
    assert "dram_latency_cycles" not in names and "l1_latency_cycles" in names
    assert any("no dram plateau" in note for note in result.notes)


# --- stride ----------------------------------------------------------------------------------------------

def test_stride_figures_from_fabricated_bandwidths():
    strided = {s: [3.6e12 / min(s, 8) * f for f in (1.0, 0.99, 1.01, 1.0, 1.0)] for s in stride.STRIDES}
    rows = {s: [3.6e12 / (1 + s / 16)] * 5 for s in stride.STRIDES}
    result = ProbeResult()
    stride.figures_from(strided, rows, result)
    got = {f.name: f for f in result.figures}
    assert got["coalesced_read_bandwidth"].value == pytest.approx(3.6e12)
    assert got["uncoalesced_penalty"].value == pytest.approx(8)
    assert got["uncoalesced_penalty"].repetitions == 5 and got["uncoalesced_penalty"].spread == 0
    assert {f.name for f in result.figures} == set(stride.FIGURES)
    assert [x for x, _ in result.curves["strided_read"].points] == list(stride.STRIDES)
    assert any("row_walk" in note for note in result.notes)


# --- banks -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stride_,width,expected", [
    (1, 4, 1), (2, 4, 2), (3, 4, 1), (16, 4, 16), (32, 4, 32), (33, 4, 1),
    (1, 8, 2), (2, 8, 4), (32, 8, 32), (1, 16, 4), (32, 16, 32), (33, 16, 4)])
def test_wavefronts_follow_the_bank_mapping(stride_, width, expected):
    assert banks.wavefronts(stride_, width) == expected


def test_four_byte_ways_are_the_gcd_with_the_bank_count():
    assert all(banks.wavefronts(s, 4) == math.gcd(s, 32) for s in range(1, 65))


def test_bank_figures_from_a_fabricated_linear_cost():
    # 2 cycles per pass, plus a fixed 0.5
    cycles = {w: {s: [2.0 * banks.wavefronts(s, w) + 0.5] * 5 for s in banks.STRIDES} for w in banks.WIDTHS}
    result = ProbeResult()
    banks.figures_from(cycles, result)
    got = {f.name: f.value for f in result.figures}
    assert got["shared_bank_conflict_cycles_per_way"] == pytest.approx(2.0)
    assert got["shared_bank_conflict_32way_penalty"] == pytest.approx(64.5 / 2.5)
    assert got["shared_penalty_8byte_stride32"] == pytest.approx(64.5 / 4.5)
    assert got["shared_penalty_16byte_stride32"] == pytest.approx(64.5 / 8.5)
    assert set(got) == set(banks.FIGURES)
    assert set(result.curves) == {"shared_4byte", "shared_8byte", "shared_16byte"}
    assert not result.notes


def test_bank_model_mismatch_is_noted():
    cycles = {4: {s: [1.0] * 5 for s in banks.STRIDES}}     # no conflict ever costs anything
    result = ProbeResult()
    banks.figures_from(cycles, result)
    assert any("off the bank model" in note and "stride 32" in note for note in result.notes)


# --- the probe protocol ----------------------------------------------------------------------------------

@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.NAME)
def test_probe_module_protocol(probe):
    assert probe.__doc__ and "Read by the planner" in probe.__doc__
    assert probe.NAME == probe.__name__.rsplit(".", 1)[1]
    assert all(arches == ("sm_80", "sm_90") for _, arches in probe.SOURCES)
    assert callable(probe.run) and probe.FIGURES
