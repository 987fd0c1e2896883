"""The matrix family's host side without a GPU: problem and argument checks, TMA descriptor
arithmetic, launch geometry (the decode kernel's even shares among it), inputs as stored, and the
float64 bound (aicg/matrix/reference.py) held to account: a float32 emulation of the kernels'
arithmetic passes it (the even spread's segment walk, workspace and reduction order too), and the
wrong kernels the adversarial suite names (a skipped k slice, a transposed operand, an epilogue
applied twice, a bias left out, rows shifted) and a lost partial sum fail it."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from aicg.dtypes import DTYPES
from aicg.matrix import check, reference, space, tensormap
from aicg.matrix.launch import check_arguments
from aicg.matrix.problem import Problem
from aicg.matrix.space import Epilogue
from aicg.matrix.templates import RULES
from aicg.matrix.templates.gemv import EvenShares

TRIED = {name: tpl.tried for name, tpl in space.templates().items()}
POINTERS = {"a": 0x10000, "b": 0x20000, "c": 0x30000, "bias": 0x40000, "residual": 0x50000}


def real(template, a="k", b="k", epilogue=Epilogue(), dtype="bfloat16", i=0, **change):
    return space.realisation(template, dtype, a, b, epilogue, **dict(TRIED[template][i], **change))


# ---- problems and arguments

@pytest.mark.parametrize("kwargs, message", [
    ({"m": 0}, "m = 0: expected an integer from 1"), ({"k": 2.0}, "k = 2.0"), ({"n": True}, "n = True"),
    ({"dtype": "float32"}, "dtype = 'float32'"), ({"a_major": "row"}, "a_major = 'row'"),
    ({"lda": 63}, "lda = 63: a row of 64 elements"), ({"ldc": -1}, "ldc = -1"),
    ({"epilogue": "gelu"}, "epilogue = 'gelu'")])
def test_problem_rejects_bad_arguments(kwargs, message):
    args = dict(m=32, n=48, k=64) | kwargs
    with pytest.raises(ValueError) as err:
        Problem(**args)
    assert message in str(err.value)


def test_problem_leading_dimensions_default_to_the_row():
    p = Problem(5, 7, 9, a_major="mn", b_major="k")
    assert (p.lda, p.ldb, p.ldc, p.ldr) == (5, 9, 7, 7)
    assert p.a_stored == (9, 5) and p.b_stored == (7, 9)
    padded = Problem(5, 7, 9, b_major="mn", ldb=16, ldc=8)
    assert padded.elements("b") == 8 * 16 + 7 and padded.elements("c") == 4 * 8 + 7
    assert Problem.from_dict(padded.as_dict()) == padded


def test_check_arguments_accepts_a_good_call():
    p = Problem(128, 256, 64)
    check_arguments(real("wgmma"), p, {"a": 0x1000, "b": 0x2000, "c": 0x3002})   # c needs only element alignment


@pytest.mark.parametrize("r, problem, pointers, message", [
    (real("wgmma"), Problem(128, 128, 60, lda=60), {}, "lda = 60 is not a multiple of 8"),
    (real("wgmma", b="mn"), Problem(128, 100, 64, b_major="mn"), {}, "ldb = 100 is not a multiple of 8"),
    (real("wgmma"), Problem(128, 128, 64, b_major="mn"), {}, "built for bfloat16 kk plain, asked for bfloat16 kmn"),
    (real("wgmma"), Problem(128, 128, 64, dtype="float16"), {}, "asked for float16"),
    (real("gemv"), Problem(17, 128, 64), {}, "m = 17: the decode kernel takes at most 16 rows"),
    (real("gemv"), Problem(8, 128, 60, lda=64, ldb=64), {}, "k = 60 is not a multiple of 8"),
    (real("wgmma"), Problem(128, 128, 64), {"a": 0x1008}, "a at 0x1008 is not 16-byte aligned"),
    (real("wgmma"), Problem(128, 128, 64), {"c": 0x3001}, "c at 0x3001 is not 2-byte aligned"),
    (real("wgmma"), Problem(128, 128, 64), {"b": 0}, "the b pointer is missing or null"),
    (real("wgmma", epilogue=Epilogue(bias=True)), Problem(128, 128, 64, epilogue=Epilogue(bias=True)), {},
     "the bias pointer is missing"),
    (real("wgmma"), Problem(128, 128, 64), {"d": 0x1000}, "unknown operand 'd'"),
])
def test_check_arguments_rejects(r, problem, pointers, message):
    args = {"a": 0x1000, "b": 0x2000, "c": 0x3000} | pointers
    args = {k: v for k, v in args.items()}
    with pytest.raises(ValueError) as err:
        check_arguments(r, problem, args)
    assert message in str(err.value)


def test_unaligned_mma_takes_any_strides_and_pointers():
    r = real("mma", i=3)
    assert not r.knob("aligned")
    check_arguments(r, Problem(7, 9, 13), {"a": 0x1002, "b": 0x2006, "c": 0x300a})
    with pytest.raises(ValueError, match="lda = 13"):
        check_arguments(real("mma"), Problem(7, 9, 13), {"a": 0x1000, "b": 0x2000, "c": 0x3000})


# ---- TMA descriptors

def tried(**want) -> int:
    """The index of the first tried wgmma setting with these knob values."""
    return next(i for i, k in enumerate(TRIED["wgmma"]) if all(k[n] == v for n, v in want.items()))


@pytest.mark.parametrize("a, b, i", [("k", "k", 0), ("k", "mn", 1), ("mn", "k", 2), ("mn", "mn", 4), ("k", "k", 6),
                                     ("k", "k", tried(block_m=64)), ("mn", "mn", tried(block_m=64))])
def test_tensor_map_boxes_fill_exactly_the_stage_the_barrier_expects(a, b, i):
    r = real("wgmma", a, b, i=i)
    k = r.settings
    p = Problem(1000, 520, 136, a_major=a, b_major=b)
    sa, sb = tensormap.spec(r, p, "a"), tensormap.spec(r, p, "b")
    a_copies = 1 if a == "k" else k["block_m"] // 64
    b_copies = (1 if b == "k" else k["block_n"] // 64 // k["cluster_m"]) * k["cluster_m"]   # all CTAs' shares
    assert sa.box_bytes * a_copies + sb.box_bytes * b_copies == tensormap.stage_bytes(r)
    assert sa.dims == (p.a_stored[1], p.a_stored[0]) and sa.stride_bytes == 2 * p.lda
    assert sb.dims == (p.b_stored[1], p.b_stored[0]) and sb.stride_bytes == 2 * p.ldb
    assert sa.problems(0x1000) == [] and sb.problems(0x1000) == []


def test_tensor_map_spec_names_what_the_driver_would_reject():
    r = real("wgmma")
    s = tensormap.spec(r, Problem(64, 64, 64, lda=68), "a")
    found = s.problems(0x1008)
    assert any("not 16-byte aligned" in f for f in found) and any("row stride of 136 bytes" in f for f in found)
    with pytest.raises(ValueError, match="take no tensor maps"):
        tensormap.spec(real("mma"), Problem(64, 64, 64), "a")


# The kernels' own box placement (kernels/matrix/tiles.cuh: box_start), compiled for the host: a
# clustered wgmma CTA copies a box of block_n / cluster_m rows of K-major B, and a 32-row box
# placed as if it were 64 rows long loaded the wrong columns of B (block_n 64, two CTAs, N = 128:
# the second CTA's share of the last tile, rows 96..127, came from rows 64..95).
BOX_PLACEMENT = r"""
#include <algorithm>
#include <cstdio>
#define __device__
#define __forceinline__ inline
using std::min;
unsigned __cvta_generic_to_shared(const void*) { return 0; }
#include "matrix/tiles.cuh"
int main() {
  int box, extent, start;
  while (std::scanf("%d %d %d", &box, &extent, &start) == 3)
    std::printf("%d\n", aicg::matrix::box_start(start, extent, box));
}
"""


@pytest.fixture(scope="module")
def box_start(tmp_path_factory):
    """box_start(start, extent, box) as the kernels compute it, for many arguments at once."""
    import shutil
    import subprocess
    from pathlib import Path
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    root = tmp_path_factory.mktemp("box_start")
    (root / "main.cpp").write_text(BOX_PLACEMENT)
    kernels = Path(__file__).resolve().parents[1] / "kernels"
    subprocess.run([compiler, "-std=c++17", "-I", str(kernels), "-o", str(root / "main"), str(root / "main.cpp")],
                   check=True, capture_output=True, timeout=120)

    def run(cases: list[tuple[int, int, int]]) -> list[int]:
        lines = "".join(f"{box} {extent} {start}\n" for start, extent, box in cases)
        done = subprocess.run([str(root / "main")], input=lines, capture_output=True, text=True, check=True,
                              timeout=60)
        return [int(v) for v in done.stdout.split()]
    return run


def test_tma_boxes_start_where_their_rows_are(box_start):
    """Every box a wgmma stage copies starts at its own rows where those lie in the tensor, and at
    a box inside the tensor where they lie wholly past it (padded cluster tiles)."""
    knobs, lengths, p = space.templates()["wgmma"].knobs, set(), Problem(128, 128, 64)
    for block_m in knobs["block_m"]:
        for block_n in knobs["block_n"]:
            for cluster_m in knobs["cluster_m"]:
                r = real("wgmma", block_m=block_m, block_n=block_n, cluster_m=cluster_m)
                lengths.add(tensormap.spec(r, p, "b").box[1])   # a K-major B box: this CTA's share of the tile
                lengths.add(tensormap.spec(r, p, "a").box[1])   # a K-major A box: the tile's rows
    lengths.add(64)                                        # MN-major boxes
    assert 32 in lengths                                   # block_n 64 over two CTAs is tried
    cases = [(start, extent, box) for box in sorted(lengths) for extent in range(1, 600, 7)
             for start in range(0, extent + 2 * box, box)]
    for (start, extent, box), placed in zip(cases, box_start(cases), strict=True):
        if start < extent:
            assert placed == start, (start, extent, box)
        else:
            assert placed % box == 0 and 0 <= placed < extent, (start, extent, box)
    assert box_start([(96, 128, 32)]) == [96]              # the device's failing case

# ---- geometry

def test_wgmma_grid_is_persistent_and_whole_clusters():
    rules = RULES["wgmma"]
    big = Problem(8192, 8192, 8192)
    g = rules.geometry(real("wgmma"), big, 132, None)
    assert g.grid == (132, 1, 1) and g.block == (384, 1, 1) and g.cluster == 1
    clustered = real("wgmma", i=1)
    g = rules.geometry(clustered, big, 132, 66)
    assert g.grid == (132, 1, 1) and g.cluster == 2
    g = rules.geometry(clustered, big, 132, 60)    # the GPU holds fewer clusters than SMs / 2
    assert g.grid == (120, 1, 1)
    # fewer tiles than SMs: one CTA a tile; a cluster pair for an odd tile count
    g = rules.geometry(clustered, Problem(300, 256, 64), 132, 66)
    assert g.grid == (4, 1, 1)       # 3 row tiles -> 2 pairs, 1 column tile
    assert rules.geometry(real("wgmma"), Problem(1, 1, 8), 132, None).grid == (1, 1, 1)


def test_mma_grid_is_one_cta_a_tile():
    g = RULES["mma"].geometry(real("mma"), Problem(1000, 1000, 64), 132, None)
    assert g.grid == (8 * 8, 1, 1) and g.block == (128, 1, 1) and g.cluster == 1


@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (16, 28672, 4096), (1, 4096, 14336), (16, 6144, 4096),
                                     (3, 520, 8), (1, 64, 64)])
def test_gemv_splits_cover_k_in_whole_steps(m, n, k):
    rules, r = RULES["gemv"], real("gemv")
    g = rules.geometry(r, Problem(m, n, k), 132, None)
    k_split = rules.k_split(r, Problem(m, n, k), 132)
    splits = g.grid[1]
    assert k_split % 32 == 0 and (splits - 1) * k_split < k <= splits * k_split
    assert g.grid[0] * rules.columns_per_block(r) >= n
    assert g.workspace_bytes == (splits * m * n * 4 if splits > 1 else 0) and g.ticket_bytes == 4 * g.grid[0]
    assert splits == 1 or k_split >= 8 * 32       # no split too short to pay for its reduction
    if (m, n, k) == (1, 4096, 4096):
        assert splits > 1 and g.grid[0] * splits >= 132   # the whole GPU reads the weight


@pytest.mark.parametrize("k, splits", [(64, 1), (100, 2), (128, 2), (192, 3), (320, 3), (4096, 4), (4097, 4)])
def test_wgmma_split_k_cuts_k_into_whole_slices_none_empty(k, splits):
    w = RULES["wgmma"].work(real("wgmma", split_k=4), Problem(256, 512, k))
    assert w.k_blocks == -(-k // 64) and w.splits == splits
    per = -(-w.k_blocks // min(4, w.k_blocks))
    assert (w.splits - 1) * per < w.k_blocks <= w.splits * per     # the last split holds a slice too
    assert w.units == w.tiles * splits and w.tiles == 2 * 2


def test_wgmma_split_k_geometry_keeps_partial_sums_and_tickets():
    rules = RULES["wgmma"]
    r = real("wgmma", i=tried(block_n=192, split_k=4))
    g = rules.geometry(r, Problem(128, 6144, 4096), 132, None)
    assert g.splits == 4 and g.grid == (128, 1, 1)           # 32 tiles x 4 parts: a unit for 128 SMs
    assert g.workspace_bytes == 32 * 4 * 128 * 192 * 4 and g.ticket_bytes == 4 * 32
    assert rules.geometry(r, Problem(128, 6144, 64), 132, None).splits == 1   # one slice: nothing to split
    plain = rules.geometry(real("wgmma"), Problem(128, 6144, 4096), 132, None)
    assert (plain.splits, plain.workspace_bytes, plain.ticket_bytes) == (1, 0, 0)
    # a clustered split launch counts its padded row of tiles (tickets are per tile)
    clustered = real("wgmma", i=1, split_k=2)
    g = rules.geometry(clustered, Problem(300, 256, 4096), 132, 66)
    assert g.ticket_bytes == 4 * 4 and g.grid == (8, 1, 1)     # 3 row tiles -> 2 pairs, x 2 parts, 2 CTAs each
    reason = rules.unsupported(r, Problem(16384, 28672, 4096))
    assert "MiB of partial sums" in reason and "without splitting K" in reason


def test_pingpong_units_are_the_tiles():
    rules = RULES["wgmma"]
    r = real("wgmma", i=tried(schedule="pingpong", block_m=64))
    assert rules.consumer_rows(r) == 64 and rules.accumulators(r) == 128
    g = rules.geometry(r, Problem(8192, 4096, 4096), 132, None)
    assert g.grid == (132, 1, 1) and g.splits == 1 and g.workspace_bytes == 0


def test_gemv_grid_is_one_wave_of_resident_ctas():
    rules, r = RULES["gemv"], real("gemv")
    for blocks_per_sm in (1, 3, 8):
        for n, k in [(4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096)]:
            g = rules.geometry(r, Problem(1, n, k), 132, None, blocks_per_sm=blocks_per_sm)
            ctas = g.grid[0] * g.grid[1]
            assert ctas <= max(132 * blocks_per_sm, g.grid[0]), (blocks_per_sm, n, k, g.grid)
            assert g.splits == g.grid[1]
    g = rules.geometry(r, Problem(1, 4096, 4096), 132, None, blocks_per_sm=3)
    assert g.grid == (32, 12, 1)             # 32 column blocks x 12 splits of 352: 384 of 396 resident CTAs


class _FakeDriver:
    """What MatmulKernel asks of the CUDA driver, recorded: launches and scratch buffers."""

    def __init__(self):
        self.launches, self.buffers = [], []

    def cuLaunchKernel(self, function, *args):
        self.launches.append(args)
        return (0,)

    class Buffer:
        def __init__(self, nbytes):
            self.nbytes, self.ptr = nbytes, 0x100000 * (1 + nbytes % 7)

        def fill_byte(self, value, stream=0):
            pass

        def free(self):
            self.ptr = 0


def _faked_launch(monkeypatch, realisation, blocks_per_sm: int = 3):
    """(a MatmulKernel of `realisation` on 132 SMs whose driver calls are recorded, the fake driver)."""
    from aicg.matrix import launch
    fake = _FakeDriver()
    monkeypatch.setattr(launch, "_cu", lambda: fake)
    monkeypatch.setattr(launch.driver, "check", lambda result: result[1] if len(result) > 1 else None)
    monkeypatch.setattr(launch.driver, "Buffer", _FakeDriver.Buffer)
    monkeypatch.setattr(launch.driver, "synchronize", lambda: None)
    kernel = launch.MatmulKernel.__new__(launch.MatmulKernel)
    kernel.real, kernel.rules, kernel.shared_bytes, kernel.sm_count = realisation, RULES["gemv"], 0, 132
    kernel.kernel = type("K", (), {"function": "f"})()
    kernel._scratch, kernel._prepared = {}, {}
    kernel.__dict__["blocks_per_sm"] = blocks_per_sm
    return kernel, fake


def test_a_repeated_launch_is_one_driver_call(monkeypatch):
    from aicg.matrix import launch
    kernel, fake = _faked_launch(monkeypatch, real("gemv"))
    checked = []
    monkeypatch.setattr(launch, "check_arguments", lambda *a: checked.append(a[1]))
    small, large = Problem(1, 4096, 4096), Problem(16, 28672, 4096)
    pointers = {"a": 0x1000, "b": 0x2000, "c": 0x3000}
    for _ in range(3):
        kernel.launch(small, pointers)
    assert len(fake.launches) == 3 and checked == [small]
    assert fake.launches[0][:6] == (32, 12, 1, 256, 1, 1)
    kernel.launch(large, pointers)          # more workspace: the buffer is replaced ...
    kernel.launch(small, pointers)          # ... and the launch that pointed into the old one prepared again
    assert checked == [small, large, small] and len(fake.launches) == 5


def test_an_even_launch_is_one_wave_with_its_workspace_and_no_split(monkeypatch):
    even = real("gemv", i=next(i for i, k in enumerate(TRIED["gemv"]) if k["spread"] == "even"))
    kernel, fake = _faked_launch(monkeypatch, even)
    problem = Problem(16, 28672, 4096)
    g = kernel.launch(problem, {"a": 0x1000, "b": 0x2000, "c": 0x3000})
    assert fake.launches[0][:6] == (396, 1, 1, 128, 1, 1)
    assert kernel._scratch["workspace"].nbytes == g.workspace_bytes > 0
    assert kernel._scratch["tickets"].nbytes == g.ticket_bytes == 4 * 448
    (prepared,) = kernel._prepared.values()
    names = [name for _, name in RULES["gemv"].arguments]
    assert prepared.keep[names.index("k_split")].value == 0       # the even spread reads no split



@pytest.mark.parametrize("m, n, k, parts", [(1, 4096, 4096, 4), (16, 28672, 4096, 4), (3, 520, 8, 1), (1, 7, 64, 2),
                                            (1, 4096, 96, 3)])
def test_a_warps_launch_cuts_k_among_a_ctas_warps_with_no_workspace(monkeypatch, m, n, k, parts):
    """The warps spread: a CTA a warp's columns (tiles x 8), no partial sums in memory, no tickets, the
    K sum in as many parts as the CTA's warps hold steps of it (the bound counts each)."""
    warps = real("gemv", i=next(i for i, k in enumerate(TRIED["gemv"]) if k["spread"] == "warps"))
    rules, problem = RULES["gemv"], Problem(m, n, k)
    assert rules.columns_per_block(warps) == 8 * warps.knob("tiles")
    g = rules.geometry(warps, problem, 132, None)
    assert g.grid == (-(-n // rules.columns_per_block(warps)), 1, 1) and g.block == (32 * warps.knob("warps"), 1, 1)
    assert (g.workspace_bytes, g.ticket_bytes, g.splits) == (0, 0, parts)
    assert rules.k_split(warps, problem, 132) == 0
    kernel, fake = _faked_launch(monkeypatch, warps)
    kernel.launch(problem, {"a": 0x1000, "b": 0x2000, "c": 0x3000})
    assert fake.launches[0][:3] == g.grid and "workspace" not in kernel._scratch


# ---- the wgmma kernel's pipeline protocol, played out on the host

class _Barrier:
    """An mbarrier: `count` arrivals complete a phase; a parity wait passes once the phase of
    that parity is complete, i.e. while the current phase has the other parity (PTX ISA,
    mbarrier.try_wait.parity). A fresh barrier is in phase 0, so a wait for parity 1 passes."""

    def __init__(self, count):
        self.count, self.pending, self.completed = count, count, 0

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.completed, self.pending = self.completed + 1, self.count

    def passed(self, parity):
        return (self.completed & 1) != parity


def play_ring(stages: int, slices: list[int], pingpong: bool, turns: bool = True, seed: int = 0) -> list[str]:
    """One CTA of gemm_wgmma.cuh, its threads interleaved at random: the producer fills the ring
    slot after slot for the CTA's units (`slices`: K slices of each), a copy lands some time after
    it is issued, the consumers wait, read and release as the kernel's loops do (pingpong: units
    in turn, the turn barriers unless `turns` is off). Returns what went wrong: a slice read from
    a slot holding another one, or a deadlock."""
    rng = random.Random(seed)
    full = [_Barrier(2) for _ in range(stages)]     # the producer's arrive_expect, then the bytes landing
    empty = [_Barrier(1 if pingpong else 2) for _ in range(stages)]
    turn = [_Barrier(1), _Barrier(1)]
    held_by_slot = [None] * stages                   # the slice each slot holds
    landings, problems = [], []

    def producer():
        slot = phase = number = 0
        for count in slices:
            for _ in range(count):
                yield lambda s=slot, p=phase: empty[s].passed(p ^ 1)
                full[slot].arrive()
                landings.append((slot, number))
                slot, number = (slot + 1) % stages, number + 1
                phase ^= slot == 0

    def consumer(c):
        slot = phase = number = mine = 0

        def read(s, want, when):
            if held_by_slot[s] != want:
                problems.append(f"consumer {c} {when} slice {want} in slot {s}, found {held_by_slot[s]}")
        for item, count in enumerate(slices):
            if pingpong and item % 2 != c:
                for _ in range(count):
                    slot, number = (slot + 1) % stages, number + 1
                    phase ^= slot == 0
                continue
            if pingpong and turns:
                if c == 1:
                    yield lambda m=mine: turn[1].passed(m & 1)
                elif mine > 0:
                    yield lambda m=mine: turn[0].passed((m - 1) & 1)
                mine += 1
            held = None
            for j in range(count):
                yield lambda s=slot, p=phase: full[s].passed(p)
                read(slot, number, "issued on")
                if j > 0:
                    read(*held, "released")
                    empty[held[0]].arrive()
                held = (slot, number)
                slot, number = (slot + 1) % stages, number + 1
                phase ^= slot == 0
            if pingpong and turns:
                turn[1 - c].arrive()
            read(*held, "released")
            empty[held[0]].arrive()

    threads = [producer(), consumer(0), consumer(1)]
    waiting = {i: next(t) for i, t in enumerate(threads)}
    while waiting or landings:
        ready = [("thread", i) for i, cond in waiting.items() if cond()] + \
            [("landing", j) for j in range(len(landings))]
        if not ready:
            return problems + ["deadlock"]
        kind, i = rng.choice(ready)
        if kind == "landing":
            slot, number = landings.pop(i)
            held_by_slot[slot] = number
            full[slot].arrive()
            continue
        try:
            waiting[i] = next(threads[i])
        except StopIteration:
            del waiting[i]
    return problems


@pytest.mark.parametrize("pingpong", [False, True], ids=["cooperative", "pingpong"])
@pytest.mark.parametrize("stages, slices", [(2, [5, 5, 5, 5, 5]), (3, [1, 1, 1, 1]), (4, [3, 3, 2, 3, 3, 2, 3]),
                                            (4, [64, 64, 64]), (6, [2, 7, 1, 9, 4])])
def test_the_ring_never_hands_a_consumer_a_stale_slot(stages, slices, pingpong):
    for seed in range(40):
        assert play_ring(stages, slices, pingpong, seed=seed) == [], (stages, slices, seed)


def test_pingpong_without_its_turns_reads_stale_slots():
    """The turn barriers are what keeps the second consumer from passing a parity wait on an
    older phase of its first slot: without them the playthrough finds the stale read."""
    found = [p for seed in range(40) for p in play_ring(2, [4, 4, 4, 4], True, turns=False, seed=seed)]
    assert any("found" in p for p in found)


# ---- inputs, reference and bound

def test_stored_images_are_the_layouts_with_nan_padding():
    rng = np.random.default_rng(1)
    p = Problem(3, 5, 7, a_major="mn", b_major="k", epilogue=Epilogue(bias=True, residual=True), lda=8, ldb=16,
                ldr=6)
    logical = reference.draw(p, 0, rng)
    images = reference.stored(p, logical)
    bf16 = DTYPES["bfloat16"]
    a = np.full(7 * 8, reference.POISON_BITS, np.uint16)
    a[:images["a"].size] = images["a"]
    a = a.reshape(7, 8)
    assert np.array_equal(bf16.decode(a[:, :3]), logical["a"].T) and np.all(a[:, 3:] == 0xFFFF)
    b = np.concatenate([images["b"], np.full(16 * 5 - images["b"].size, 0xFFFF, np.uint16)]).reshape(5, 16)
    assert np.array_equal(bf16.decode(b[:, :7]), logical["b"].T) and np.all(b[:, 7:] == 0xFFFF)
    assert images["bias"].size == 5 and images["residual"].size == 2 * 6 + 5
    assert np.all(np.isnan(bf16.decode(np.array([reference.POISON_BITS], np.uint16))))
    assert np.all(np.isnan(DTYPES["float16"].decode(np.array([reference.POISON_BITS], np.uint16))))


def emulate(p: Problem, logical: dict, rows, *, skip_k=None, transpose_b=False, twice=False, no_bias=False,
            shift_rows=0, rounded_sum=False) -> np.ndarray:
    """The kernels' arithmetic in numpy: exact products, an fp32 accumulator taking one k16 step's
    sum at a time, the epilogue in float32, one rounding to the output type (`rounded_sum`: the sums
    rounded to it first, as the handoff store parks them); or a wrong kernel."""
    a = logical["a"][(np.asarray(rows) + shift_rows) % p.m].astype(np.float64)
    b = logical["b"].T.copy() if transpose_b else logical["b"].copy()
    b = b.astype(np.float64)
    if skip_k is not None:
        b[skip_k] = 0.0
    acc = np.zeros((len(rows), p.n), np.float32)
    for k0 in range(0, p.k, 16):
        acc = (acc + (a[:, k0:k0 + 16] @ b[k0:k0 + 16]).astype(np.float32)).astype(np.float32)
    if rounded_sum:
        dtype = DTYPES[p.dtype]
        acc = dtype.decode(dtype.encode(acc)).astype(np.float32).reshape(acc.shape)
    return finish(p, logical, rows, acc, twice=twice, no_bias=no_bias)


def finish(p: Problem, logical: dict, rows, acc: np.ndarray, *, twice=False, no_bias=False) -> np.ndarray:
    """The epilogue on fp32 sums `acc` (rows x N), rounded once to the output type."""
    e = p.epilogue
    x = acc + (logical["bias"].astype(np.float32) if e.bias and not no_bias else np.float32(0))
    for _ in range(2 if twice else 1):
        x = reference.activation(e.activation, x.astype(np.float32)).astype(np.float32)
    if e.residual:
        x = x + logical["residual"][rows].astype(np.float32)
    dtype = DTYPES[p.dtype]
    return dtype.encode(x.astype(np.float32))


@pytest.mark.parametrize("epilogue", [Epilogue(), Epilogue("gelu_tanh", True), Epilogue("gelu_erf", True, True),
                                      Epilogue("silu", residual=True)], ids=lambda e: e.name)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_bound_holds_for_the_kernels_arithmetic_and_catches_wrong_kernels(epilogue, dtype):
    rng = np.random.default_rng(7)
    p = Problem(96, 96, 1000, dtype, epilogue=epilogue)
    rows = np.arange(p.m)
    for trial in (0, 1):
        logical = reference.draw(p, trial, rng)
        cached = reference.expected(p, logical, rows)

        def verdict(bits):
            full = np.full((p.m, p.ldc), reference.POISON_BITS, np.uint16)
            full[:, :p.n] = bits
            return check.compare(p, full, logical, rows, 1, poisoned=True, cached=cached)

        good = verdict(emulate(p, logical, rows))
        assert good["within_bound"], good
        assert 0.0 < good["worst_error_over_bound"] < 1.0
        wrongs = {"skipped k slice": emulate(p, logical, rows, skip_k=slice(64, 128)),
                  "rows shifted": emulate(p, logical, rows, shift_rows=1)}
        if p.m == p.k:
            wrongs["B transposed"] = emulate(p, logical, rows, transpose_b=True)
        if epilogue.activation != "none":
            wrongs["activation twice"] = emulate(p, logical, rows, twice=True)
        if epilogue.bias:
            wrongs["bias left out"] = emulate(p, logical, rows, no_bias=True)
        for what, bits in wrongs.items():
            assert not verdict(bits)["within_bound"], (what, trial)


@pytest.mark.parametrize("epilogue", [Epilogue(), Epilogue("gelu_tanh", True), Epilogue("gelu_erf", True, True),
                                      Epilogue("silu", residual=True)], ids=lambda e: e.name)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_handed_off_sum_is_judged_with_its_extra_rounding(epilogue, dtype):
    """The handoff store rounds each sum to the output type before the epilogue: its arithmetic stays
    within the bound that counts that rounding, and the wrong kernels still fail against it."""
    rng = np.random.default_rng(11)
    p = Problem(96, 96, 1000, dtype, epilogue=epilogue)
    rows = np.arange(p.m)
    for trial in (0, 1):
        logical = reference.draw(p, trial, rng)
        cached = reference.expected(p, logical, rows, rounded_sum=True)
        plain_ref, plain_bound = reference.expected(p, logical, rows)
        assert np.array_equal(cached[0], plain_ref) and np.all(cached[1] > plain_bound)

        def verdict(bits):
            full = np.full((p.m, p.ldc), reference.POISON_BITS, np.uint16)
            full[:, :p.n] = bits
            return check.compare(p, full, logical, rows, 1, poisoned=True, cached=cached)

        good = verdict(emulate(p, logical, rows, rounded_sum=True))
        assert good["within_bound"] and 0.0 < good["worst_error_over_bound"] < 1.0, good
        for what, bits in {"skipped k slice": emulate(p, logical, rows, skip_k=slice(64, 128), rounded_sum=True),
                           "rows shifted": emulate(p, logical, rows, shift_rows=1, rounded_sum=True)}.items():
            assert not verdict(bits)["within_bound"], (what, trial)


def test_a_transposed_operand_fails_on_a_square_problem():
    rng = np.random.default_rng(3)
    p = Problem(128, 128, 128)
    logical = reference.draw(p, 1, rng)
    rows = np.arange(128)
    full = np.full((128, 128), 0, np.uint16)
    full[:] = emulate(p, logical, rows, transpose_b=True)
    assert not check.compare(p, full, logical, rows, 1, poisoned=True)["within_bound"]


def test_a_wrong_block_is_mapped_for_a_single_tile():
    rng = np.random.default_rng(5)
    p = Problem(128, 128, 64)
    logical = reference.draw(p, 0, rng)
    rows = np.arange(128)
    bits = emulate(p, logical, rows)
    bits[:, 64:] = emulate(p, logical, rows, skip_k=slice(0, 16))[:, 64:]    # right half wrong
    bits[120:, :8] = reference.POISON_BITS                                  # a corner left unwritten
    result = check.compare(p, bits, logical, rows, 1, poisoned=True)
    m = result["mismatch"]
    assert not result["within_bound"] and result["unwritten"] == 64
    assert m["unwritten_rows"] == "120-127" and m["unwritten_columns"] == "0-7"
    assert m["columns"].startswith("0-7,64-") or m["columns"].startswith("64-") or "64" in m["columns"]
    assert len(m["map"]) == 16 and all(len(line) == 16 for line in m["map"])
    assert m["map"][0] == "." * 8 + "x" * 8 and m["map"][15][0] == "n"
    assert len(m["examples"]) == 6


def test_checked_rows_sample_every_row_tile():
    rng = np.random.default_rng(0)
    assert np.array_equal(reference.checked_rows(300, rng), np.arange(300))
    rows = reference.checked_rows(16384, rng)
    assert set(range(64)) <= set(rows) and set(range(16384 - 64, 16384)) <= set(rows)
    assert {r // 128 for r in rows} == set(range(128))
    assert len(rows) < 300


def test_nan_bits_are_recognised_in_both_types():
    bits = np.array([0x7FC0, 0xFFFF, 0x7F80, 0x7C01, 0x3F80, 0x7C00], np.uint16)
    assert list(check.nan_bits("bfloat16", bits)) == [True, True, False, False, False, False]
    assert list(check.nan_bits("float16", bits)) == [True, True, True, True, False, False]


# ---- the decode kernel's even spread: shares, the kernel's walk, the workspace, the reduction

EVEN = [i for i, k in enumerate(TRIED["gemv"]) if k["spread"] == "even"]
# (blocks, steps, CTAs): one unit each, a CTA a block, fewer CTAs than blocks (whole blocks between a
# share's ends), more CTAs than blocks (a block in several parts), the large decode weights on an H100
EVEN_CUTS = [(1, 1, 1), (1, 2, 2), (9, 1, 9), (7, 5, 3), (3, 100, 7), (8, 8, 8), (1024, 8, 264), (65, 32, 264),
             (64, 448, 264), (448, 128, 396), (224, 128, 264)]


def kernel_begin(shares: EvenShares, cta: int) -> int:
    """gemv.cuh's EvenShares::begin: in int arithmetic, units = per_cta ctas + extra."""
    per_cta, extra = divmod(shares.units, shares.ctas)
    return cta * per_cta + cta * extra // shares.ctas


def kernel_owner(shares: EvenShares, unit: int, estimate: int) -> int:
    """gemv.cuh's EvenShares::owner from an estimate: walked to the largest p with begin(p) <= unit."""
    p = min(shares.ctas - 1, estimate)
    while p > 0 and kernel_begin(shares, p) > unit:
        p -= 1
    while p + 1 < shares.ctas and kernel_begin(shares, p + 1) <= unit:
        p += 1
    return p


@pytest.mark.parametrize("blocks, steps, ctas", EVEN_CUTS)
def test_even_shares_cover_every_unit_once_and_the_kernels_walk_finds_each_blocks_parts(blocks, steps, ctas):
    s = EvenShares(blocks, steps, ctas)
    lengths = [s.begin(p + 1) - s.begin(p) for p in range(ctas)]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1
    assert all(kernel_begin(s, p) == s.begin(p) for p in range(ctas + 1))
    covered, by_block = Counter(), {}
    for cta in range(ctas):
        segments = s.segments(cta)
        walk = s.walk(cta)
        assert [w[:3] for w in walk] == segments
        for block, lo, hi, first, last, first_slot in walk:
            assert 0 <= lo < hi <= steps
            covered.update((block, step) for step in range(lo, hi))
            by_block.setdefault(block, []).append((cta, lo, hi))
            assert range(first, last + 1) == s.covering(block) and first_slot == s.slot(first, block)
        # a CTA publishes at most two parts, its first block's and its last's, in distinct slots
        published = [s.slot(cta, block) for block, _, _ in segments if len(s.covering(block)) > 1]
        assert len(published) <= 2 and len(set(published)) == len(published)
    assert covered == Counter({(b, step): 1 for b in range(blocks) for step in range(steps)})
    for block, parts in by_block.items():
        # the block's parts in increasing CTA order are its K in increasing order, without a gap
        assert [cta for cta, _, _ in parts] == list(s.covering(block))
        assert [lo for _, lo, _ in parts] == [0] + [hi for _, _, hi in parts[:-1]] and parts[-1][2] == steps
    assert list(s.parts) == [len(s.covering(b)) for b in range(blocks)]
    for unit in sorted({0, s.units - 1, *range(0, s.units, max(1, s.units // 97))}):
        exact = s.owner(unit)
        assert s.begin(exact) <= unit < s.begin(exact + 1)
        for estimate in (0, ctas - 1, exact - 2, exact - 1, exact + 1, exact + 2):
            assert kernel_owner(s, unit, max(0, estimate)) == exact


def test_even_shares_refuse_what_the_kernels_int_arithmetic_cannot_hold():
    with pytest.raises(ValueError, match="5 CTAs for 4 units"):
        EvenShares(2, 2, 5)
    with pytest.raises(ValueError, match="2\\^31 units"):
        EvenShares(2 ** 16, 2 ** 15, 132)
    r = real("gemv", i=EVEN[0])
    assert "the even spread counts them in a 32-bit int" in RULES["gemv"].unsupported(r, Problem(1, 2 ** 22, 2 ** 22))


@pytest.mark.parametrize("i", EVEN)
def test_even_geometry_is_one_wave_with_two_workspace_slots_a_cta(i):
    rules, r = RULES["gemv"], real("gemv", i=i)
    columns = rules.columns_per_block(r)
    for m, n, k in [(16, 28672, 4096), (1, 4096, 14336), (3, 520, 8), (16, 128, 64), (5, 65536, 256), (1, 64, 64)]:
        for blocks_per_sm in (1, 2, 3):
            problem = Problem(m, n, k)
            g = rules.geometry(r, problem, 132, None, blocks_per_sm=blocks_per_sm)
            s = rules.even_shares(r, problem, 132, blocks_per_sm)
            assert (s.blocks, s.steps) == (-(-n // columns), -(-k // 32))
            assert g.grid == (min(132 * blocks_per_sm, s.units), 1, 1) and rules.k_split(r, problem, 132) == 0
            assert g.splits == s.most_parts
            if s.most_parts == 1:
                assert g.workspace_bytes == g.ticket_bytes == 0
                continue
            assert g.ticket_bytes == 4 * s.blocks and g.workspace_bytes == s.ctas * 2 * m * columns * 4
            furthest = max(((2 * cta + s.slot(cta, block)) * m + m - 1) * columns + columns - 1
                           for cta in range(s.ctas) for block, _, _ in s.segments(cta) if s.parts[block] > 1)
            assert furthest < g.workspace_bytes // 4
    # the case the spread is for: 448 blocks of 128 steps on 396 resident CTAs, shares of 144-145 steps,
    # so no block in more than two parts
    g = rules.geometry(real("gemv", i=EVEN[0]), Problem(16, 28672, 4096), 132, None, blocks_per_sm=3)
    assert g.grid == (396, 1, 1) and g.splits == 2


def emulate_even(p: Problem, logical: dict, shares: EvenShares, columns: int, lose=None) -> np.ndarray:
    """The even spread's arithmetic in numpy, in the kernel's order: each CTA walks its segments,
    summing one k16 step at a time into fp32 from zero; a segment that is its block's whole goes to
    the epilogue, another to the workspace at the kernel's index, and the block's last arrival adds
    the parts read back in increasing CTA order. `lose`: a (cta, block) part never published."""
    a, b = logical["a"].astype(np.float64), logical["b"].astype(np.float64)
    workspace = np.full(shares.ctas * 2 * p.m * columns, np.nan, np.float32)
    writes = np.zeros(workspace.size, np.int64)
    acc = np.full((p.m, shares.blocks * columns), np.nan, np.float32)
    arrived = Counter()
    for cta in random.Random(len(p.name)).sample(range(shares.ctas), shares.ctas):    # any arrival order
        for block, lo, hi, first, last, first_slot in shares.walk(cta):
            cols = slice(block * columns, min(p.n, (block + 1) * columns))
            part = np.zeros((p.m, cols.stop - cols.start), np.float32)
            for k0 in range(lo * 32, min(p.k, hi * 32), 16):
                part = (part + (a[:, k0:min(k0 + 16, hi * 32)] @ b[k0:min(k0 + 16, hi * 32), cols])
                        .astype(np.float32)).astype(np.float32)
            if first == last:
                acc[:, cols] = part
                continue

            def at(q):
                slot = first_slot if q == first else 0
                return ((2 * q + slot) * p.m + np.arange(p.m)[:, None]) * columns + np.arange(part.shape[1])

            if (cta, block) != lose:
                workspace[at(cta)] = part
                writes[at(cta)] += 1
            arrived[block] += 1
            if arrived[block] == last - first + 1:
                total = np.zeros_like(part)
                for q in range(first, last + 1):
                    total = (total + workspace[at(q)]).astype(np.float32)
                acc[:, cols] = total
    assert writes.max() <= 1        # no two parts share workspace
    return finish(p, logical, np.arange(p.m), acc[:, :p.n])


@pytest.mark.parametrize("m, n, k, ctas", [(5, 200, 1000, 7), (2, 1024, 64, 5), (16, 1000, 4096, 30), (3, 520, 8, 9),
                                           (7, 130, 136, 11)])
@pytest.mark.parametrize("epilogue", [Epilogue(), Epilogue("gelu_erf", True, True)], ids=lambda e: e.name)
def test_the_even_spreads_walk_and_reduction_pass_the_bound_and_a_lost_part_fails_it(m, n, k, ctas, epilogue):
    rng = np.random.default_rng(11)
    r = real("gemv", i=EVEN[0], epilogue=epilogue)
    p = Problem(m, n, k, epilogue=epilogue)
    rules = RULES["gemv"]
    g = rules.geometry(r, p, ctas, None, blocks_per_sm=1)
    shares = rules.even_shares(r, p, ctas, 1)
    assert g.grid[0] == shares.ctas
    logical = reference.draw(p, 0, rng)
    rows = np.arange(m)

    def verdict(bits):
        full = np.full((m, p.ldc), reference.POISON_BITS, np.uint16)
        full[:, :n] = bits
        return check.compare(p, full, logical, rows, check.splits_of("gemv", g), poisoned=True)

    good = verdict(emulate_even(p, logical, shares, rules.columns_per_block(r)))
    assert good["within_bound"], good
    split = [(cta, block) for cta in range(shares.ctas) for block, *_ in shares.segments(cta) if shares.parts[block] > 1]
    if split:
        assert not verdict(emulate_even(p, logical, shares, rules.columns_per_block(r), lose=split[0]))["within_bound"]
