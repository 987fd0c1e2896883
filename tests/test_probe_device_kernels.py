"""CPU checks of the tensor-core, async-copy and atomics probes.

Their kernels compile for every target they list, without spills; the PTX
holds the instructions each probe means to measure, inside the timed
loops; the pure helpers count right; and each probe's run() drives a
stand-in GPU end to end: kernels are compiled for real, and every launch is
checked against its entry's PTX parameters, the launch limits and the
buffers it may touch.
"""
from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

from aicg import hw
from aicg.errors import DeviceError
from aicg.matrix import prior
from aicg.probe import async_copy, atomics, curves, tensor_cores
from aicg.probe.figures import ProbeResult
import probe_ptx
from aicg.probe.gpu import KERNELS_DIR, PROBE_KERNELS, compile_probe

PROBES = (tensor_cores, async_copy, atomics)
SOURCES = [(file, arch) for probe in PROBES for file, arches in probe.SOURCES for arch in arches]
REGISTERS_PER_SM = 65536
HWDB = Path(__file__).resolve().parents[1] / "hwdb"


_ptx, _entries, _loops, _report = probe_ptx.ptx, probe_ptx.entries, probe_ptx.loops, probe_ptx.report


def _parameters(body: str) -> list[str]:
    """An entry's parameter types, in order ('u64', 'u32', 'f32')."""
    return re.findall(r"\.param \.(\w+)", body.split(")", 1)[0])


def _most_in_a_loop(body: str, pattern: str) -> int:
    return max((len(re.findall(pattern, loop)) for loop in _loops(body)), default=0)


def _registers(file: str, arch: str, entry: str) -> int:
    return int(re.search(r"Used (\d+) registers", _report(file, arch)[entry]).group(1))


# --- kernels compile --------------------------------------------------------------------------------------

@pytest.mark.parametrize("file,arch", SOURCES)
def test_probe_kernel_compiles_without_spills(file, arch):
    assert compile_probe(file, arch).startswith(b"\x7fELF")
    for entry, report in _report(file, arch).items():
        assert "0 bytes spill stores" in report, f"{file} {entry} spills on {arch}"
        assert "serializ" not in report.lower(), f"{file} {entry}: ptxas serialised something on {arch}"


# --- tensor cores -----------------------------------------------------------------------------------------

MMA_SYNC = {"mma_bf16": r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32",
            "mma_fp16": r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32",
            "mma_tf32": r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32",
            "mma_fp8_e4m3": r"mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3\.e4m3\.f32"}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mma_sync_loops_keep_every_chain_and_store_the_sum(arch):
    entries = _entries("mma.cu", arch)
    expected = set(MMA_SYNC) - ({"mma_fp8_e4m3"} if arch == "sm_80" else set())
    assert set(entries) == expected, "fp8 mma.sync is compiled from sm_89 on only"
    for entry in expected:
        body = entries[entry]
        assert _most_in_a_loop(body, MMA_SYNC[entry]) >= tensor_cores.CHAINS, entry
        assert re.search(r"st\.global\.f32", body), f"{entry}: the accumulators are not stored"
        # four blocks of 256 threads must fit an SM's registers (MMA_BLOCKS_PER_SM)
        registers = _registers("mma.cu", arch, entry)
        assert registers * tensor_cores.MMA_BLOCK * max(tensor_cores.MMA_BLOCKS_PER_SM) <= REGISTERS_PER_SM


def test_mma_shapes_agree_with_the_ptx():
    """The FLOPs counted per instruction are those of the shape and type each entry issues."""
    ptx_type = {"bf16": "bf16", "fp16": "f16", "tf32": "tf32", "e4m3": "e4m3"}
    for instruction in tensor_cores.INSTRUCTIONS:
        m, n, k = instruction.shape
        body = _entries(instruction.file, instruction.arch or "sm_90")[instruction.entry]
        kind = ptx_type[instruction.operands]
        assert re.search(rf"\.m{m}n{n}k{k}\.(row\.col\.)?f32\.{kind}\.{kind}", body), instruction.name


def test_wgmma_issues_groups_from_shared_memory_and_waits_for_them():
    entries = _entries("wgmma.cu", "sm_90a")
    for entry, instruction in (("wgmma_bf16", r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16"),
                               ("wgmma_fp8_e4m3", r"wgmma\.mma_async\.sync\.aligned\.m64n256k32\.f32\.e4m3\.e4m3")):
        body = entries[entry]
        loop = next(loop for loop in _loops(body) if re.search(instruction, loop))
        # the compiler may unroll the loop: WGMMAS_PER_GROUP MMAs per fence, commit and wait, however often
        groups = len(re.findall(r"wgmma\.commit_group\.sync\.aligned", loop))
        assert groups >= 1 and len(re.findall(instruction, loop)) == groups * tensor_cores.WGMMAS_PER_GROUP
        assert len(re.findall(r"wgmma\.fence\.sync\.aligned", loop)) == groups
        assert len(re.findall(r"wgmma\.wait_group\.sync\.aligned 1;", loop)) == groups
        # both operands by descriptor: 128 accumulators, then two 64-bit registers
        operands = re.search(instruction + r"\s*\{([^}]*)\},\s*(%rd\d+),\s*(%rd\d+)", loop)
        assert operands and len(operands.group(1).split(",")) == 128
        assert re.search(r"wgmma\.wait_group\.sync\.aligned 0;", body)
        assert re.search(r"fence\.proxy\.async\.shared::cta", body)
        assert re.search(r"st\.global\.f32", body)
        registers = _registers("wgmma.cu", "sm_90a", entry)
        # three warpgroups per SM (WARPGROUPS_PER_SM) fit when registers round up to at most 168
        assert math.ceil(registers / 8) * 8 * tensor_cores.WARPGROUP * max(tensor_cores.WARPGROUPS_PER_SM) \
            <= REGISTERS_PER_SM, registers


def test_wgmma_descriptors_stay_inside_the_tiles():
    """Core matrices are 8 rows of 16 bytes; whichever way the hardware reads the two offsets,
    the last byte a 64-row (A) or 256-row (B) tile of two K core matrices reaches lies in the tile;
    and the kernel encodes them where the descriptor format wants them, without swizzling."""
    source = (KERNELS_DIR / PROBE_KERNELS / "wgmma.cu").read_text()
    a_bytes = int(re.search(r"#define A_TILE_BYTES (\d+)", source).group(1))
    b_bytes = int(re.search(r"#define B_TILE_BYTES (\d+)", source).group(1))
    leading, stride = map(int, re.search(r"matrix_descriptor\(base, (\d+), (\d+)\)", source).groups())
    for rows, tile in ((64, a_bytes), (256, b_bytes)):
        groups = rows // 8
        for along_mn, along_k in ((stride, leading), (leading, stride)):
            assert (groups - 1) * along_mn + along_k + 128 <= tile
        assert groups * 2 * 128 == tile      # the tile holds exactly its core matrices
    # start address >> 4 in bits 0-13, the offsets >> 4 in bits 16-29 and 32-45, swizzle bits 62-63 zero
    fields = (leading >> 4) << 16 | (stride >> 4) << 32
    for entry, body in _entries("wgmma.cu", "sm_90a").items():
        assert re.search(r"and\.b32\s+%r\d+, %r\d+, 262128;\s+shr\.u32\s+%r\d+, %r\d+, 4;", body), entry
        constants = re.findall(r"or\.b64\s+%rd\d+, %rd\d+, (\d+);", body)
        assert constants and set(constants) == {str(fields)}, entry      # A's and B's, maybe once per code path


def test_flops_per_launch_counts_every_instruction():
    bf16 = tensor_cores.INSTRUCTIONS[0]
    assert bf16.flops == 2 * 16 * 8 * 16
    warps = tensor_cores.MMA_BLOCK // 32
    assert tensor_cores.flops_per_launch(bf16, 3, 5) == 3 * warps * 5 * tensor_cores.CHAINS * 4096
    wgmma = next(i for i in tensor_cores.INSTRUCTIONS if i.name == "wgmma_bf16")
    assert wgmma.flops == 2 * 64 * 256 * 16
    assert tensor_cores.flops_per_launch(wgmma, 2, 7) == 2 * 7 * tensor_cores.WGMMAS_PER_GROUP * 524288
    fp8 = next(i for i in tensor_cores.INSTRUCTIONS if i.name == "wgmma_fp8")
    assert fp8.flops == 2 * wgmma.flops


def test_instructions_name_their_figures_and_targets():
    names = {f"{i.name}_flops" for i in tensor_cores.INSTRUCTIONS}
    assert names == set(tensor_cores.FIGURES)
    runs = {i.name for i in tensor_cores.INSTRUCTIONS if tensor_cores._runs_on(i, (8, 0))}
    assert runs == {"mma_sync_bf16", "mma_sync_fp16", "mma_sync_tf32"}
    assert {i.name for i in tensor_cores.INSTRUCTIONS if tensor_cores._runs_on(i, (9, 0))} == {
        i.name for i in tensor_cores.INSTRUCTIONS}
    assert "wgmma_bf16" not in {i.name for i in tensor_cores.INSTRUCTIONS if tensor_cores._runs_on(i, (10, 0))}


def _decode(encoding: str, words: np.ndarray) -> np.ndarray:
    if encoding == "tf32":
        return words.view(np.float32).astype(np.float64)
    if encoding == "bf16":
        return (words.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if encoding == "fp16":
        return words.view(np.float16).astype(np.float64)
    b = words.view(np.uint8).astype(np.int64)
    exponent, mantissa = (b >> 3) & 15, b & 7
    return np.where(b >> 7, -1.0, 1.0) * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


@pytest.mark.parametrize("encoding", ["bf16", "fp16", "tf32", "e4m3"])
def test_random_operands_are_finite_non_zero_and_fixed_by_the_seed(encoding):
    words = tensor_cores.random_operands(encoding, 1 << 16)
    assert words.dtype == np.uint32 and words.nbytes == 1 << 16
    values = _decode(encoding, words)
    assert np.isfinite(values).all() and (np.abs(values) >= 0.24).all() and (np.abs(values) <= 2.0).all()
    assert (values > 0).mean() == pytest.approx(0.5, abs=0.05)           # both signs
    assert len(np.unique(values)) > 4
    assert (words == tensor_cores.random_operands(encoding, 1 << 16)).all()
    if encoding == "e4m3":                   # no NaN (S.1111.111) and no zero or subnormal
        b = words.view(np.uint8)
        assert ((b & 0x7F) != 0x7F).all() and ((b >> 3) & 15 != 0).all()


def test_scaled_iterations_aim_at_the_target_and_stay_in_bounds():
    assert tensor_cores.scaled_iterations(64, 0.5, 2.0) == 256
    assert tensor_cores.scaled_iterations(64, 1e-6, 2.0) == 1 << 22
    assert tensor_cores.scaled_iterations(64, 100.0, 2.0) == 16
    assert tensor_cores.scaled_iterations(64, 0.0, 2.0) == 1 << 22
    assert atomics.scaled_iterations(8, 1.0, 3.0) == 24
    assert atomics.scaled_iterations(8, 1e-9) == atomics.MAX_ITERATIONS


# --- async copy -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cp_async_stages_pipeline_and_consume_every_tile(arch):
    entries = _entries("async_copy.cu", arch)
    for depth in async_copy.DEPTHS:
        body = entries[f"cp_async_stream_{depth}"]
        copy = r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16;"
        steady = [loop for loop in _loops(body) if re.search(copy, loop)
                  and re.search(rf"cp\.async\.wait_group {depth - 1};", loop)]
        assert steady, f"stage depth {depth}: no loop that copies and waits for all but {depth - 1} groups"
        assert all(re.search(r"cp\.async\.commit_group;", loop) and re.search(r"ld\.shared\.u32", loop)
                   for loop in steady)
        assert re.search(r"st\.global\.u32", body)
        loads = entries[f"load_stream_{depth}"]
        assert _most_in_a_loop(loads, r"ld\.global(\.nc)?\.v4\.u32") >= depth, "16-byte loads, all in flight"
        assert re.search(r"st\.global\.u32", loads)
    latency = entries["cp_async_latency"]
    assert re.search(r"cp\.async\.wait_group 0;", latency)
    assert len(re.findall(r"%clock64", latency)) >= 2
    bulk = {"bulk_stream", "bulk_latency"}
    if arch == "sm_80":
        assert not bulk & set(entries), "bulk copies are sm_90 only"
        return
    copy = r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
    for entry in bulk:
        body = entries[entry]
        assert re.search(copy, body) and re.search(r"mbarrier\.arrive\.expect_tx\.shared::cta\.b64", body)
        assert re.search(r"mbarrier\.init\.shared::cta\.b64", body)
        assert re.search(r"mbarrier\.try_wait\.parity\.shared::cta\.b64", body)
        assert re.search(r"st\.global\.u32", body)
    # the steady state: wait for a stage, read it, barrier, refill it
    assert any(all(re.search(p, loop) for p in (copy, r"mbarrier\.try_wait\.parity", r"ld\.volatile\.shared\.u32",
                                                r"bar\.sync"))
               for loop in _loops(entries["bulk_stream"]))


def _points(curve: dict[int, list[float]]) -> list[async_copy.Point]:
    return [async_copy.Point(x, f"config {x}", rates) for x, rates in curve.items()]


def test_best_by_bytes_in_flight_keeps_the_faster_configuration():
    points = [async_copy.Point(4096, "slow", [1.0, 1.1]), async_copy.Point(2048, "a", [5.0]),
              async_copy.Point(4096, "fast", [2.0, 2.2])]
    best = async_copy.best_by_bytes_in_flight(points)
    assert list(best) == [2048, 4096] and best[4096].config == "fast"


def test_async_copy_figures_from_a_saturating_curve():
    # bandwidth rises with bytes in flight until 32 KiB, then holds at 3 TB/s
    sweep = {x: [min(3e12, 3e12 * x / 32768) * f for f in (0.99, 1.0, 1.01, 1.0, 1.0)]
             for x in (2048, 4096, 8192, 16384, 32768, 65536, 131072)}
    result = ProbeResult()
    async_copy.figures_of("cp_async", _points(sweep), "method", result)
    got = {f.name: f for f in result.figures}
    assert got["cp_async_bandwidth"].value == pytest.approx(3e12)
    assert got["cp_async_bandwidth"].repetitions == 5
    assert got["cp_async_bytes_in_flight_90"].value == 32768      # 16 KiB gives only half
    assert got["cp_async_bytes_in_flight_90"].spread == 0
    assert [x for x, _ in result.curves["cp_async"].points] == sorted(sweep)
    assert set(got) <= set(async_copy.FIGURES)


def test_async_copy_configurations_fit_shared_memory():
    h100 = 232448
    assert (1024, 8) in async_copy.cp_async_configs(h100)
    assert all(b * 16 * s <= 100_000 for b, s in async_copy.cp_async_configs(100_000))
    bulk = async_copy.bulk_configs(h100)
    assert (32768, 8) not in bulk and (16384, 8) in bulk and (2048, 1) in bulk
    assert all(t * s + async_copy.BULK_BARRIER_BYTES <= h100 for t, s in bulk)
    assert all(t % 16 == 0 for t, _ in bulk)
    source = (KERNELS_DIR / PROBE_KERNELS / "async_copy.cu").read_text()
    assert int(re.search(r"#define BULK_BARRIER_BYTES (\d+)", source).group(1)) == async_copy.BULK_BARRIER_BYTES
    assert max(async_copy.BULK_STAGES) * 8 <= async_copy.BULK_BARRIER_BYTES     # an mbarrier per stage fits
    latency_max = int(re.search(r"#define BULK_LATENCY_BYTES (\d+)", source).group(1))
    assert async_copy.BULK_LATENCY_BYTES <= latency_max


# --- atomics ----------------------------------------------------------------------------------------------

def test_add_kernels_issue_the_intended_atomic():
    for arch in ("sm_80", "sm_90"):
        entries = _entries("atomics.cu", arch)
        for entry, instruction in (("add_u32", r"red\.global\.add\.u32"), ("add_f32", r"red\.global\.add\.f32"),
                                   ("fetch_add_u32", r"atom\.global\.add\.u32")):
            body = entries[entry]
            assert _most_in_a_loop(body, instruction) >= 4, (arch, entry)   # ATOMIC_UNROLL in flight
            assert not re.search(r"atom\.global" if entry.startswith("add") else r"red\.global", body)
        # the fetched values reach the sink
        assert re.search(r"st\.global\.u32", entries["fetch_add_u32"])
        # eight 256-thread blocks fill an SM of 2048 threads
        for entry in entries:
            assert _registers("atomics.cu", arch, entry) * atomics.BLOCK * 8 <= REGISTERS_PER_SM


THREADS = 132 * 2048


def test_contention_patterns_address_what_they_say():
    found = atomics.patterns(THREADS)
    counts = {name: atomics.expected_counts(p, THREADS, 3) for name, p in found.items()}
    assert counts["contended"].tolist() == [3 * THREADS]
    warp = counts["warp_address"]
    assert (warp[::atomics.WARP_SPACING_WORDS] == 3 * 32).all() and warp.sum() == 3 * THREADS
    assert np.count_nonzero(warp) == THREADS // 32
    assert len(counts["distinct"]) == THREADS and (counts["distinct"] == 3).all()
    assert len(counts["distinct_dram"]) == 3 * THREADS and (counts["distinct_dram"] == 1).all()
    for name, p in found.items():
        assert (p.mask + 1) & p.mask == 0, name                       # a power of two, less one
        assert (p.mask + 1) * 4 <= atomics.TARGET_BYTES
    assert found["distinct_dram"] == atomics.spread_over(atomics.TARGET_BYTES // 4, THREADS)
    # a sweep wraps around its words evenly: every word once before any twice
    swept = atomics.expected_counts(atomics.spread_over(1 << 20, THREADS), THREADS, 8)
    assert len(swept) == 1 << 20 and swept.min() == 2 and swept.max() == 3 and swept.sum() == 8 * THREADS


def test_word_indices_follow_the_kernel_formula():
    pattern = atomics.Pattern(lane_scale=3, warp_scale=100, iteration_scale=7, mask=1023)
    got = atomics.word_indices(pattern, 64, 2).reshape(2, 64)
    for i in range(2):
        for t in (0, 5, 31, 32, 63):
            assert got[i, t] == ((t % 32) * 3 + (t // 32) * 100 + i * 7) & 1023


def test_spreading_over_one_word_is_full_contention():
    one = atomics.spread_over(1, THREADS)
    assert atomics.expected_counts(one, THREADS, 2).tolist() == [2 * THREADS]
    assert atomics.CURVE_WORDS[0] == 1 and atomics.CURVE_WORDS[-1] == atomics.TARGET_BYTES // 4


# --- run() on a stand-in GPU ------------------------------------------------------------------------------

_KINDS = {"ptr": "u64", "i64": "u64", "u64": "u64", "int": "u32", "u32": "u32", "float": "f32"}
DEFAULT_SHARED = 48 * 1024

H200 = {"arch": "sm_90", "capability": (9, 0), "attributes": {
    "MULTIPROCESSOR_COUNT": 132, "MAX_THREADS_PER_MULTIPROCESSOR": 2048, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448,
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233472, "L2_CACHE_SIZE": 62914560, "CLOCK_RATE": 1980000}}
A100 = {"arch": "sm_80", "capability": (8, 0), "attributes": {
    "MULTIPROCESSOR_COUNT": 108, "MAX_THREADS_PER_MULTIPROCESSOR": 2048, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 166912,
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 167936, "L2_CACHE_SIZE": 41943040, "CLOCK_RATE": 1410000}}


class FakeBuffer:
    def __init__(self, gpu, ptr: int, nbytes: int):
        self.gpu, self.ptr, self.nbytes = gpu, ptr, nbytes
        # Per-word add counts (atomics), kept from a zeroing fill to the next download:
        # the timed launches after a check are not replayed.
        self.counts = None

    def upload(self, host):
        assert np.asarray(host).nbytes <= self.nbytes

    def fill_byte(self, value: int, stream: int = 0):
        self.counts = np.zeros(0, dtype=np.int64) if value == 0 else None

    def download(self, dtype, count: int):
        assert count * np.dtype(dtype).itemsize <= self.nbytes
        if np.dtype(dtype) == np.int64:
            return np.full(count, 900, dtype=np.int64)       # cycles
        counts = np.zeros(count, dtype=np.int64)
        if self.counts is not None:
            n = min(count, len(self.counts))
            counts[:n] = self.counts[:n]
            self.counts = None
        return counts.astype(dtype)


class FakeKernel:
    def __init__(self, gpu, file: str, entry: str, arch: str):
        entries = _entries(file, arch)
        assert entry in entries, f"{file} has no entry {entry} for {arch}"
        self.gpu, self.file, self.entry, self.arch = gpu, file, entry, arch
        self.parameters = _parameters(entries[entry])
        self.registers = _registers(file, arch, entry)
        self.allowed_shared = DEFAULT_SHARED
        self.function = None

    def allow_shared_bytes(self, nbytes: int):
        assert nbytes <= self.gpu.attributes["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"]
        self.allowed_shared = nbytes

    def launch(self, grid, block, args, stream=0, shared_bytes=0):
        assert [_KINDS[kind] for _, kind in args] == self.parameters, (self.entry, args)
        assert isinstance(grid, int) and 1 <= grid < 2 ** 31 and isinstance(block, int) and 1 <= block <= 1024
        assert block == 1 or block % 32 == 0
        assert shared_bytes <= self.allowed_shared, (self.entry, shared_bytes)
        values = [value for value, _ in args]
        for value, kind in args:
            if kind == "ptr":
                self.gpu.buffer_at(value)
        for pointer, nbytes in touched(self.entry, grid, block, values, shared_bytes):
            buf = self.gpu.buffer_at(pointer)
            assert pointer + nbytes <= buf.ptr + buf.nbytes, (self.entry, "reads or writes past its buffer")
        if "add_" in self.entry:
            self._add(grid * block, values)
        self.gpu.launches.append(self.entry)

    def _add(self, threads: int, values: list):
        target = self.gpu.buffer_at(values[0])
        if target.counts is None:
            return
        pattern = atomics.Pattern(*values[1:5])
        added = np.bincount(atomics.word_indices(pattern, threads, values[5]).astype(np.int64))
        size = max(len(added), len(target.counts))
        target.counts = np.pad(target.counts, (0, size - len(target.counts))) + np.pad(added, (0, size - len(added)))


def touched(entry: str, grid: int, block: int, v: list, shared: int) -> list[tuple[int, int]]:
    """(pointer, bytes) ranges a launch of `entry` reads or writes, as its kernel computes them."""
    threads = grid * block
    if entry.startswith("mma_"):
        return [(v[0], 0x10000 * 4), (v[2], threads * 4)]
    if entry.startswith("wgmma_"):
        return [(v[0], 0x10000 * 16), (v[2], threads * 4)]
    if entry.startswith("cp_async_stream_"):
        assert shared >= block * 16 * int(entry.rsplit("_", 1)[1])
        return [(v[0], v[1] * block * 16), (v[2], threads * 4)]
    if entry.startswith("load_stream_"):
        return [(v[0], v[1] * block * 16), (v[2], threads * 4)]
    if entry == "bulk_stream":
        tiles, span, tile, stages = v[1], v[2], v[3], v[4]
        assert tile % 16 == 0 and shared >= async_copy.BULK_BARRIER_BYTES + tile * stages and stages <= 16
        assert 0 < span <= tiles
        return [(v[0], span * tile), (v[5], threads * 4)]
    if entry == "cp_async_latency":
        assert threads == 1
        return [(v[0], (v[2] - 1) * v[1] * 16 + 16), (v[3], v[2] * 8), (v[4], 4)]
    if entry == "bulk_latency":
        assert threads == 1 and v[2] % 16 == 0
        return [(v[0], (v[3] - 1) * v[1] + v[2]), (v[4], v[3] * 8), (v[5], 4)]
    if "add_" in entry:
        assert v[5] <= atomics.MAX_ITERATIONS
        return [(v[0], (v[4] + 1) * 4)] + ([(v[6], threads * 4)] if entry.startswith("fetch") else [])
    raise AssertionError(f"no footprint for {entry}")


class FakeGPU:
    """What the probes use of ProbeGPU, with kernels compiled (to PTX) for real and launches checked."""

    def __init__(self, device: dict):
        self.arch, self.compute_capability = device["arch"], device["capability"]
        self.attributes = dict(device["attributes"])
        self.buffers: list[FakeBuffer] = []
        self.launches: list[str] = []
        self._next_ptr = 1 << 32
        self._ms = iter(1.0 + 0.01 * (k % 5) for k in range(10 ** 9))

    @property
    def sm_count(self):
        return self.attributes["MULTIPROCESSOR_COUNT"]

    def kernel(self, file, entry, arch=None):
        arch = arch or self.arch
        assert arch in dict(s for p in PROBES for s in p.SOURCES)[file] or arch == self.arch, (file, arch)
        return FakeKernel(self, file, entry, arch)

    def buffer(self, nbytes):
        buf = FakeBuffer(self, self._next_ptr, int(nbytes))
        self._next_ptr += (int(nbytes) + 0xFFFF) & ~0xFFFF
        self.buffers.append(buf)
        return buf

    def buffer_at(self, pointer: int) -> FakeBuffer:
        found = [b for b in self.buffers if b.ptr <= pointer < b.ptr + b.nbytes]
        assert found, f"pointer {pointer:#x} is in no live buffer"
        return found[0]

    def release(self, buf):
        self.buffers.remove(buf)

    def time_ms(self, work):
        work()
        return next(self._ms)

    def repeat(self, work, repetitions=7, launches=5, warmup=2):
        for _ in range(warmup):
            work()
        return [statistics.median(self.time_ms(work) for _ in range(launches)) for _ in range(repetitions)]

    def progress(self, line):
        pass

    def synchronize(self):
        pass


@pytest.fixture
def resident_by_registers(monkeypatch):
    """Occupancy from ptxas' register count, in place of the driver's occupancy call."""
    def limit(kernel, block):
        return REGISTERS_PER_SM // (math.ceil(kernel.registers / 8) * 8 * block)
    monkeypatch.setattr(tensor_cores, "_resident_limit", limit)


@pytest.mark.parametrize("device", [H200, A100], ids=["h200", "a100"])
@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.NAME)
def test_run_on_a_stand_in_gpu(probe, device, resident_by_registers):
    gpu = FakeGPU(device)
    result = probe.run(gpu)
    assert not gpu.buffers, "every buffer is released"
    names = {f.name for f in result.figures}
    hopper = device is H200
    expected = set(probe.FIGURES)
    if not hopper:
        # wgmma and the bulk copy are Hopper's; Ampere's mma.sync has no fp8
        expected = {name for name in expected if not name.startswith(("wgmma_", "bulk_copy_"))} - {"mma_sync_fp8_flops"}
    assert names == expected
    for f in result.figures:
        assert f.unit == probe.FIGURES[f.name] and f.repetitions >= 5
        assert math.isfinite(f.value) and f.value > 0
    for name, curve in result.curves.items():
        xs = [x for x, _ in curve.points]
        assert xs == sorted(set(xs)) and len(xs) >= 2, name
        curves.plateau(*zip(*curve.points))     # positive, finite
    if not hopper and probe is not atomics:
        assert any("not measured" in note for note in result.notes)


def test_async_copy_launches_one_block_per_sm(monkeypatch):
    """Every timed stream is one block per SM: it asks for more than half an SM's shared memory."""
    gpu = FakeGPU(H200)
    seen = []
    launch = FakeKernel.launch

    def spy(self, grid, block, args, stream=0, shared_bytes=0):
        tile = args[3][0] if self.entry == "bulk_stream" else block * 16
        if "stream" in self.entry and args[1][0] * tile in (async_copy.BUFFER_BYTES, async_copy.L2_STREAM_BYTES):
            assert grid == gpu.sm_count
            seen.append(shared_bytes)
        return launch(self, grid, block, args, stream, shared_bytes)
    monkeypatch.setattr(FakeKernel, "launch", spy)
    async_copy.run(gpu)
    assert seen and min(seen) > H200["attributes"]["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"] // 2


def test_async_copy_shared_series_reads_each_tile_from_several_sms_and_moves_on(monkeypatch):
    """The L2 series whose tiles several SMs read at once: at each step about L2_SHARED_BY blocks read the same
    tile (blocks b and b + span), and each block reads a different tile the next step (grid is no multiple of
    the span)."""
    gpu = FakeGPU(H200)
    spans = set()
    launch = FakeKernel.launch

    def spy(self, grid, block, args, stream=0, shared_bytes=0):
        if self.entry == "bulk_stream" and args[2][0] < grid:
            spans.add((grid, args[2][0]))
        return launch(self, grid, block, args, stream, shared_bytes)
    monkeypatch.setattr(FakeKernel, "launch", spy)
    async_copy.run(gpu)
    assert spans
    for grid, span in spans:
        readers = [sum(1 for b in range(grid) if (b + k * grid) % span == t) for k in range(3) for t in range(span)]
        assert async_copy.L2_SHARED_BY - 1 <= min(readers) and max(readers) <= async_copy.L2_SHARED_BY
        assert len({k * grid % span for k in range(3)}) == 3      # block 0 reads a new tile at each step


def test_atomics_check_catches_a_wrong_count(monkeypatch):
    add = FakeKernel._add

    def one_add_lost(self, threads, values):
        add(self, threads, values)
        target = self.gpu.buffer_at(values[0])
        if target.counts is not None and len(target.counts):
            target.counts[0] -= 1
    monkeypatch.setattr(FakeKernel, "_add", one_add_lost)
    with pytest.raises(DeviceError, match="word 0 holds"):
        atomics.run(FakeGPU(H200))


# --- the probe protocol -----------------------------------------------------------------------------------

@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.NAME)
def test_probe_module_protocol(probe):
    assert probe.__doc__ and "Read by the planner" in probe.__doc__
    # "nothing yet" exactly where the matrix prior (the planner's reader of these probes) takes none of
    # the figures: its inputs name the measured fact each came from
    read = " ".join(i.source for i in prior.inputs(hw.load_target(HWDB, "h100-sxm")).values())
    used = {name for name in probe.FIGURES if f"measured {name} " in read}
    assert ("nothing yet" in probe.__doc__) == (not used), used
    assert probe.NAME == probe.__name__.rsplit(".", 1)[1]
    assert callable(probe.run) and probe.FIGURES
    for file, arches in probe.SOURCES:
        assert (KERNELS_DIR / PROBE_KERNELS / file).exists() and arches
    assert {"sm_80", "sm_90"} <= {arch for _, arches in probe.SOURCES for arch in arches}
