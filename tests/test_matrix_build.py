"""Codegen and NVRTC for the matrix family (aicg/matrix/codegen.py, build.py), CPU only.

A sample covering every template with each operand layout, both dtypes and every epilogue
(activation, bias, residual) at least once is compiled for sm_90a (and the sm_80+ templates
for sm_80 too); ptxas's report is read (registers, no spills, no stack frame, no warning that
voids the design) and the SASS is checked for the instructions each design rests on:
HGMMA, UTMALDG (.MULTICAST where clustered) and USETMAXREG for the wgmma kernel, HMMA with
LDSM and LDGSTS for mma.sync, HMMA with 16-byte streaming loads for the decode kernel. Every tried
setting of the decode kernel compiles with every spread of its work, and the even spread's K
loop keeps the loads in flight of the splits' one.

The whole legal space compiles under AICG_MATRIX_FULL_SPACE=1 (minutes on two cores).
"""
from __future__ import annotations

import os
import re
from collections import Counter

import pytest

from aicg import hw
from aicg.errors import CompileError
from aicg.matrix import build, codegen, space
from aicg.matrix.space import Epilogue
from aicg.matrix.templates import RULES, GpuLimits
from aicg.matrix.templates.wgmma import STATIC_SHARED_ALLOWANCE

TRIED = {name: tpl.tried for name, tpl in space.templates().items()}
GELU_T = Epilogue("gelu_tanh", bias=True)
SILU_R = Epilogue("silu", residual=True)
FUSED = Epilogue("gelu_erf", bias=True, residual=True)



def tried_index(template="wgmma", **knobs) -> int:
    """The first tried setting of `template` with these knob values."""
    return next(i for i, k in enumerate(TRIED[template]) if all(k[n] == v for n, v in knobs.items()))


# (template, dtype, A layout, B layout, epilogue, index of the tried setting)
SAMPLE = [
    ("wgmma", "bfloat16", "k", "k", Epilogue(), 0),
    ("wgmma", "bfloat16", "k", "mn", Epilogue(), 1),        # 2-CTA cluster, B boxes multicast
    ("wgmma", "bfloat16", "mn", "k", GELU_T, 4),            # 256 x 128: two m64 row blocks a consumer
    ("wgmma", "float16", "mn", "mn", SILU_R, 5),
    ("wgmma", "bfloat16", "k", "k", FUSED, 2),              # cluster, K-major B halves multicast
    ("wgmma", "bfloat16", "k", "mn", Epilogue(), 3),        # N = 192
    ("wgmma", "float16", "k", "k", Epilogue(), 6),          # N = 64
    ("wgmma", "bfloat16", "k", "k", FUSED, tried_index(block_n=32, schedule="cooperative", cluster_n=4)),
    ("wgmma", "bfloat16", "mn", "k", Epilogue(), tried_index(cluster_n=2)),   # A's boxes multicast along N
    ("mma", "bfloat16", "k", "k", Epilogue(), 0),
    ("mma", "float16", "k", "mn", GELU_T, 1),
    ("mma", "bfloat16", "mn", "k", SILU_R, 2),
    ("mma", "bfloat16", "mn", "mn", FUSED, 3),             # element-wise copies (any strides)
    ("gemv", "bfloat16", "k", "k", Epilogue(), 0),
    ("gemv", "float16", "k", "k", Epilogue("gelu_tanh", bias=True, residual=True), 1),
    ("gemv", "bfloat16", "k", "k", Epilogue("silu"), 2),
]


def sample_id(case) -> str:
    template, dtype, a, b, epilogue, i = case
    return f"{template}-{dtype}-{a}{b}-{epilogue.name}-{i}"


def realisation_of(case) -> space.Realisation:
    template, dtype, a, b, epilogue, i = case
    return space.realisation(template, dtype, a, b, epilogue, **TRIED[template][i])


def archs(template: str) -> list[str]:
    return ["sm_90a"] if template == "wgmma" else ["sm_90a", "sm_80"]


@pytest.fixture(scope="module")
def sass(bench_module):
    return bench_module("sass")


@pytest.fixture(scope="module")
def hopper(repo):
    return GpuLimits.of_hardware(hw.load(repo / "hwdb" / "h100-sxm.toml"))


_built: dict = {}


def built(case, arch: str) -> build.Built:
    key = (sample_id(case), arch)
    if key not in _built:
        _built[key] = build.compile_realisation(realisation_of(case), arch)
    return _built[key]


def opcodes(sass, cubin: bytes) -> Counter:
    instructions, _ = sass.parse(sass.disassemble(cubin))
    return Counter(i.opcode for i in instructions)


def count(ops: Counter, prefix: str) -> int:
    return sum(n for op, n in ops.items() if op.startswith(prefix))


def test_source_is_one_include_and_one_entry():
    real = realisation_of(SAMPLE[1])
    src = codegen.source(real)
    assert src.count("#include") == 1 and '#include "matrix/gemm_wgmma.cuh"' in src
    assert src.count('extern "C"') == 1 and f"{codegen.ENTRY}(" in src
    assert "__launch_bounds__(384, 1)" in src
    assert ("aicg::matrix::gemm_wgmma<aicg::bf16, 128, 256, 4, 2, aicg::matrix::K_MAJOR, aicg::matrix::MN_MAJOR, "
            "aicg::matrix::RASTER_M, 8, aicg::matrix::ACT_NONE, false, false>(&a_map, &b_map,") in src
    assert "const __grid_constant__ aicg::matrix::TmaDescriptor a_map" in src
    gemv = codegen.source(realisation_of(SAMPLE[-2]))
    assert "__launch_bounds__(128)\n" in gemv and "ACT_GELU_TANH, true, true>" in gemv and "aicg::f16" in gemv


@pytest.mark.parametrize("case", SAMPLE, ids=sample_id)
def test_sample_compiles_with_a_healthy_report(case, hopper):
    real = realisation_of(case)
    assert RULES[real.template].violations(real, hopper) == []
    for arch in archs(real.template):
        b = built(case, arch)
        assert build.healthy(b) == [], (arch, b.report, b.log)
        assert b.report["registers"] <= hopper.registers_per_thread
        if real.template == "wgmma":
            # setmaxnreg needs the entry's count to be the launch bound's: 65536 / 384 rounded down to 8
            assert b.report["registers"] == 168
            assert b.report["shared_bytes"] <= STATIC_SHARED_ALLOWANCE


@pytest.mark.parametrize("case", [c for c in SAMPLE if c[0] == "wgmma"], ids=sample_id)
def test_wgmma_sass_has_the_hopper_pipeline(case, sass):
    real = realisation_of(case)
    k = real.settings
    ops = opcodes(sass, built(case, "sm_90a").cubin)
    # one HGMMA per m64 row block and k16 step of a 64-wide K slice, in the consumer's unrolled loop
    assert count(ops, "HGMMA") == (k["block_m"] // 2 // 64) * 4
    assert ops["USETMAXREG.DEALLOC.CTAPOOL"] == 1 and ops["USETMAXREG.TRY_ALLOC.CTAPOOL"] == 1
    a_copies = 1 if real.a_major == "k" else k["block_m"] // 64
    b_copies = 1 if real.b_major == "k" else k["block_n"] // 64
    if k["cluster_m"] == k["cluster_n"] == 1:
        assert ops["UTMALDG.2D"] == a_copies + b_copies and ops["UTMALDG.2D.MULTICAST"] == 0
    elif k["cluster_n"] > 1:      # A's shares multicast, B's slice this CTA's own
        assert ops["UTMALDG.2D"] == b_copies and ops["UTMALDG.2D.MULTICAST"] >= 1
    else:
        assert ops["UTMALDG.2D"] == a_copies and ops["UTMALDG.2D.MULTICAST"] >= 1
    assert count(ops, "LDL") == 0 and count(ops, "STL") == 0


@pytest.mark.parametrize("case", [c for c in SAMPLE if c[0] != "wgmma"], ids=sample_id)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_mma_sync_sass(case, arch, sass):
    real = realisation_of(case)
    ops = opcodes(sass, built(case, arch).cubin)
    assert count(ops, "HMMA.16816.F32") > 0 and count(ops, "HGMMA") == 0
    assert count(ops, "LDL") == 0 and count(ops, "STL") == 0
    if real.template == "mma":
        k = real.settings
        per_slice = (k["block_m"] // k["warps_m"] // 16) * (k["block_n"] // k["warps_n"] // 8) * (k["block_k"] // 16)
        assert count(ops, "HMMA") == per_slice
        # ldmatrix, transposing for an MN-major operand
        assert (ops["LDSM.16.MT88.4"] > 0) == ("mn" in (real.a_major, real.b_major))
        assert (ops["LDSM.16.M88.4"] > 0) == ("k" in (real.a_major, real.b_major))
        assert (count(ops, "LDGSTS.E.BYPASS.128") > 0) == k["aligned"]
    else:
        k = real.settings
        assert count(ops, "HMMA") >= 2 * k["tiles"] * k["unroll"]
        assert count(ops, "LDG.E.NA.128") >= k["tiles"] * k["unroll"]   # the weight: 16 bytes, not kept in L1


def gemv_settings() -> list[dict]:
    """Every tried decode setting with each spread, once; the bulk spread's settings (whose ring is
    a ring of stages a CTA, not a warp's) with their own spread only."""
    found = {}
    register_spreads = [s for s in space.templates()["gemv"].knobs["spread"] if s != "bulk"]
    for knobs in TRIED["gemv"]:
        for spread in ["bulk"] if knobs["spread"] == "bulk" else register_spreads:
            setting = dict(knobs, spread=spread)
            found[tuple(sorted(setting.items()))] = setting
    return list(found.values())


def k_loop(sass, cubin: bytes, without: str = "") -> Counter:
    """The opcodes of the innermost loop that holds MMAs (and no `without` opcode): the decode
    kernel's K loop. (A backward branch's span may take in blocks ptxas laid out inside it: the bulk
    spread's consumer loop is told from such a span by its lack of the producer's bulk copy.)"""
    instructions, labels = sass.parse(sass.disassemble(cubin))
    loops = []
    for end, i in enumerate(instructions):
        target = re.search(r"`\((\.L_x_\d+)\)", i.operands)
        if i.opcode == "BRA" and target and labels[target.group(1)] <= end:
            body = Counter(x.opcode for x in instructions[labels[target.group(1)]:end + 1])
            if count(body, "HMMA") and not (without and count(body, without)):
                loops.append((end - labels[target.group(1)], body))
    assert loops, "no loop with MMAs"
    return min(loops, key=lambda loop: loop[0])[1]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("knobs", gemv_settings(), ids=lambda k: "_".join(f"{n}{v}" for n, v in sorted(k.items())))
def test_every_tried_decode_setting_compiles_with_every_spread(knobs, dtype, hopper, sass):
    real = space.realisation("gemv", dtype, "k", "k", Epilogue(), **knobs)
    rules = RULES["gemv"]
    assert rules.violations(real, hopper) == []
    b = build.compile_realisation(real, "sm_90a")
    assert build.healthy(b) == [], (b.report, b.log)
    assert b.report["spill_store_bytes"] == b.report["spill_load_bytes"] == 0
    assert b.report["registers"] <= rules.registers_estimate(real)
    k = real.settings
    loop = k_loop(sass, b.cubin, without="UBLKCP" if k["spread"] == "bulk" else "")
    # a group of unroll steps a pass: tiles 16-byte vectors of W a step, two MMAs a vector
    if k["spread"] == "bulk":
        # a stage a pass: W from shared memory (and, at a block's end, the other warps' sums), A from
        # L1 for all the pass's steps at once; the producer's copies are bulk copies
        weight = count(loop, "LDS.128") - (k["warps"] - 1) * k["tiles"]
        assert count(loop, "LDG.E.128.CONSTANT") == 2 * k["unroll"]
        assert "UBLKCP" in sass.disassemble(b.cubin)
    else:
        weight = count(loop, "LDGSTS") if k["ring"] else count(loop, "LDG.E.NA.128")
    assert weight == k["tiles"] * k["unroll"] and count(loop, "HMMA") == 2 * k["tiles"] * k["unroll"]
    assert count(loop, "LDL") == 0 and count(loop, "STL") == 0


def test_a_compile_error_points_at_the_header():
    # 256 x 256 gives a consumer 256 accumulators: the header's static_assert says so
    real = space.Realisation("wgmma", "bfloat16", "k", "k", Epilogue(),
                             tuple(sorted(dict(TRIED["wgmma"][0], block_m=256).items())))
    with pytest.raises(CompileError) as err:
        build.compile_realisation(real, "sm_90a")
    assert re.search(r"kernels/matrix/gemm_wgmma\.cuh\(\d+\): error: static assertion failed", str(err.value))


def test_the_hopper_header_refuses_plain_sm_90():
    with pytest.raises(CompileError, match="needs the sm_90a target"):
        build.compile_realisation(realisation_of(SAMPLE[0]), "sm_90")


def test_arch_follows_the_device():
    real = realisation_of(SAMPLE[7])
    assert build.arch_for(real, (9, 0)) == "sm_90a"
    assert build.arch_for(real, (8, 0)) == "sm_80" and build.arch_for(real, (8, 9)) == "sm_89"


@pytest.mark.skipif(not os.environ.get("AICG_MATRIX_FULL_SPACE"), reason="the whole space: AICG_MATRIX_FULL_SPACE=1")
@pytest.mark.parametrize("template", ["wgmma", "mma", "gemv"])
def test_full_space_compiles(template, hopper):
    failures = []
    for knobs in space.knob_settings(template):
        real = space.realisation(template, "bfloat16", "k", "k", Epilogue(), **knobs)
        if RULES[template].violations(real, hopper):
            continue
        b = build.compile_realisation(real, "sm_90a")
        if build.healthy(b):
            failures.append((real.name, build.healthy(b)))
    assert failures == []
