"""tests/bench/sass.py reads the SASS ptxas made: the held path of a row in registers, found by its
shape, and its instructions counted between the row's reductions. Checked on kernels whose exps are
known (a long held 16-bit softmax row computes each twice, softmax_rounded_exps once) and on a
listing written by hand. CPU only: NVRTC compiles, nvdisasm (the `test` extra) disassembles."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def sass(bench_module):
    return bench_module("sass")


@pytest.fixture(scope="module")
def h200(sass):
    return sass.hw.load(sass.ROOT / "hwdb" / "nvidia-h200.toml")


def counted(sass, shipped_ruleset, h200, candidate: str):
    cubin, _ = sass.build(candidate, sass.ROOT / "kernels", shipped_ruleset, h200)
    return sass.census(candidate, *sass.parse(sass.disassemble(cubin)))


def exps(c) -> int:
    return sum(p["MUFU.EX2"] for p in c.parts)


@pytest.mark.parametrize("family, exps_per_element", [("softmax_twopass", 2), ("softmax_rounded_exps", 1),
                                                      ("log_softmax_twopass", 1)])
def test_a_long_held_bfloat16_row_computes_its_exps_as_its_family_says(sass, shipped_ruleset, h200, family,
                                                                       exps_per_element):
    paths = counted(sass, shipped_ruleset, h200, f"{family}.bfloat16.t512.v16.block.c8")
    assert any(c.path.tested for c in paths)   # the untested path goes where two blocks are asked for
    for held in paths:
        assert held.elements == 64 and exps(held) == exps_per_element * held.elements
        assert len(held.parts) == 3   # two block reductions (max, sum), then the write


def test_a_kernel_with_both_held_paths_has_both_counted(sass, shipped_ruleset, h200):
    # 56 registers: no second block asked, so a row that fills every slot has its untested path
    paths = counted(sass, shipped_ruleset, h200, "softmax_twopass.bfloat16.t128.v16.block.c4")
    assert sorted(c.path.tested for c in paths) == [False, True]
    for c in paths:   # 32 elements a lane: exps kept as floats, one each
        assert c.elements == 32 and exps(c) == 32
    tested, full = sorted(paths, key=lambda c: not c.path.tested)
    assert full.per_element < tested.per_element


def test_a_streamed_family_has_no_held_path(sass, shipped_ruleset, h200):
    assert counted(sass, shipped_ruleset, h200, "row_sum_tree.float32.t512.v16.block") == []


LISTING = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/               @P0 BRA `(.L_x_2) ;
.L_x_1:
        /*0020*/                   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*0030*/                   LDG.E.128.CONSTANT R8, desc[UR4][R2.64+0x800] ;
        /*0040*/                   FADD R12, R4, R5 ;
        /*0050*/              @!P1 BRA `(.L_x_1) ;
        /*0060*/                   EXIT ;
.L_x_2:
        /*0070*/               @P2 LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
        /*0080*/               @P3 LDG.E.128.CONSTANT R8, desc[UR4][R2.64+0x800] ;
        /*0090*/                   FMNMX R12, R4, R5, !PT ;
        /*00a0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00b0*/                   BSSY B0, `(.L_x_3) ;
        /*00c0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00d0*/                   MUFU.EX2 R13, R12 ;
        /*00e0*/              @!P4 EXIT ;
        /*00f0*/                   STG.E.128 desc[UR4][R2.64], R4 ;
.L_x_3:
        /*0100*/                   EXIT ;
"""


def test_a_loop_is_no_held_path_and_a_held_one_runs_to_its_unconditional_exit(sass):
    instructions, labels = sass.parse(LISTING)
    assert len(instructions) == 17 and labels == {".L_x_1": 2, ".L_x_2": 7, ".L_x_3": 16}
    assert instructions[7].guard == "@P2" and instructions[7].opcode == "LDG.E.128.CONSTANT"
    # the first pair of loads lies in a loop (a branch back to .L_x_1): a streamed sweep
    (path,) = sass.held_paths(instructions, labels, slots=2, pack_bytes=16)
    assert (path.start, path.end, path.tested) == (7, 16, True)
    before, after = sass.segments(instructions, path)
    assert before == {"LDG.E.128.CONSTANT": 2, "FMNMX": 1, "BAR": 2}   # the reconvergence mark uncounted
    assert after == {"MUFU.EX2": 1, "STG.E.128": 1}
    assert sass.held_paths(instructions, labels, slots=3, pack_bytes=16) == []


def test_the_issue_share_grows_with_the_instructions_and_the_bytes_they_serve(sass, h200):
    float32 = sass.issue_share(10.0, "softmax", "float32", h200)
    assert sass.issue_share(20.0, "softmax", "float32", h200) == pytest.approx(2 * float32)
    # half the bytes an element: twice the elements a second at the same bandwidth
    assert sass.issue_share(10.0, "softmax", "bfloat16", h200) == pytest.approx(2 * float32)
    # 128 lanes an SM at 1970 MHz, the copy's 4.25 TB/s over 8 bytes an element of 132 SMs
    assert float32 == pytest.approx(4.2513e12 / 8 / 132 / 1970.27e6 * 10 / 128, rel=1e-3)
