"""GPU tests of the matrix family: every template that runs on the GPU present, both layouts of
each operand, both dtypes and every epilogue, validated against float64 (aicg/matrix/check.py:
poisoned outputs, guard bytes, NaN row padding, repeated and fresh-input runs) on one tile,
ragged shapes and a mid-size square, each case in a worker process of its own (a fault or a
hang fails the case, not the session). The target is the device's compute capability; its
limits come from the hwdb entry naming the device, or the driver.

Skipped without a GPU; run on a GPU node with `pytest -m gpu tests/test_gpu_matrix.py` (the wgmma
kernel's later designs alone: `-k "staged or split_k"`).
"""
from __future__ import annotations

import pytest

from aicg.matrix import build, space
from aicg.matrix.problem import Problem
from aicg.matrix.space import Epilogue
from aicg.matrix.templates import RULES
from aicg.runtime import driver

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(driver.probe_device() is None, reason="needs a CUDA GPU")]

TRIED = {name: tpl.tried for name, tpl in space.templates().items()}
EPILOGUES = [Epilogue(), Epilogue("gelu_tanh", bias=True), Epilogue("gelu_erf", bias=True, residual=True),
             Epilogue("silu", residual=True)]
# (m, n, k): a tile, off every tile and vector size, K not a multiple of 8 (padded rows), a mid square,
# more tiles than a GPU has SMs with a short ragged K (persistent CTAs take several, pingpong consumers
# take turns), and many split-K units a CTA (K in 32 slices, cut 2-8 ways)
SHAPES = [(128, 128, 64), (1, 7, 64), (7, 129, 1000), (127, 1000, 129), (129, 127, 4097), (1000, 1000, 1000),
          (3, 520, 8), (4000, 3000, 300), (1000, 4000, 2000)]
# the decode kernel's also: many short column blocks, so that an even share holds whole blocks between
# the parts of its first and last
DECODE_SHAPES = [(16, 128, 64), (1, 7, 64), (3, 520, 8), (16, 1000, 4096), (1, 4096, 4096), (9, 4104, 1000),
                 (5, 65536, 256)]
FUSED = Epilogue("gelu_erf", bias=True, residual=True)
# The handed-off epilogue (store = "handoff") in a 2-CTA cluster, which the space does not try first: checked
# with the tried handoff setting's design (its first setting takes every epilogue, dtype and layout).
HANDOFF = [dict(block_m=256, block_n=128, stages=3, cluster_m=2, cluster_n=1, raster="m", group=8,
                schedule="cooperative", store="handoff", split_k=1)]


def _new_design(template: str, knobs: dict) -> tuple | None:
    """Which of the later designs a setting combines (wgmma: staged store, pingpong, split-K, each
    with or without a cluster; the decode kernel: the cp.async ring, the even or warps spread); None for the
    first design."""
    if template == "gemv":
        found = (("ring",) if knobs["ring"] else ()) + ((knobs["spread"],) if knobs["spread"] != "splits" else ())
        return found or None
    if template != "wgmma":
        return None
    found = tuple(name for name, default in (("store", "direct"), ("schedule", "cooperative"), ("split_k", 1))
                  if knobs[name] != default) + (("handoff",) if knobs["store"] == "handoff" else ())
    return found + (("cluster",) if knobs["cluster_m"] > 1 else ()) if found else None


def cases():
    found, seen = [], set()
    for template in ("wgmma", "mma", "gemv"):
        tpl = space.templates()[template]
        for i, knobs in enumerate((*tpl.tried, *(HANDOFF if template == "wgmma" else ()))):
            design = _new_design(template, knobs)
            first_of_design = design is not None and design not in seen
            seen.add(design)
            for a in tpl.a_layouts:
                for b in tpl.b_layouts:
                    # the first setting: every epilogue and both dtypes in every layout; the first of each
                    # later design: so in K-major layouts, the fused epilogue in MN-major ones, plain output
                    # in the others; other settings of a later design: plain and fused K-major, plain
                    # MN-major; the first design's other settings: plain output in every layout
                    every = [(d, e) for d in ("bfloat16", "float16") for e in EPILOGUES]
                    if i == 0:
                        combos = every
                    elif design is None:
                        combos = [("bfloat16", Epilogue())]
                    elif (a, b) == ("k", "k"):
                        combos = every if first_of_design else [("bfloat16", Epilogue()), ("bfloat16", FUSED)]
                    elif (a, b) == ("mn", "mn"):
                        combos = [("bfloat16", Epilogue())] + ([("bfloat16", FUSED)] if first_of_design else [])
                    else:
                        combos = [("bfloat16", Epilogue())] if first_of_design else []
                    for dtype, epilogue in combos:
                        found.append(space.realisation(template, dtype, a, b, epilogue, **knobs))
    return found


@pytest.fixture(scope="module")
def device():
    from aicg.matrix import device as device_mod
    info = driver.probe_device()
    limits, _ = device_mod.limits()
    return info, limits


@pytest.fixture(scope="module")
def runner():
    from aicg.matrix.worker import Runner
    return Runner()


@pytest.fixture(scope="module")
def compiled(request, device):
    """name -> {cubin, problems} for each collected case of this module the GPU runs, compiled up front
    in processes of their own (aicg/matrix/lab.compile_all): one at a time they would take a second or
    more each of the GPU node's time, 234 cases in a row."""
    from aicg.matrix import lab
    info, limits = device
    reals = [item.callspec.params["real"] for item in request.session.items
             if item.module is request.module and "real" in getattr(getattr(item, "callspec", None), "params", {})]
    by_arch: dict[str, list] = {}
    for real in dict.fromkeys(reals):
        if space.templates()[real.template].runs_on(info.compute_capability) and \
                not RULES[real.template].violations(real, limits):
            by_arch.setdefault(build.arch_for(real, info.compute_capability), []).append(real)
    found = {}
    for arch, group in by_arch.items():
        found.update(lab.compile_all(group, arch, build.KERNELS_DIR))
    return found


# At or above this many outputs a shape's C and residual get leading dimensions of whole 16-byte
# vectors: the epilogues' vector paths (whole blocks inside C, clipped ones at its edges); below it,
# odd ones: the paths that move an element or a pair at a time.
VECTOR_OUTPUTS = 1_000_000


def padded_problem(real, m, n, k) -> Problem:
    base = Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue)
    pad = lambda x: -(-x // 8) * 8   # noqa: E731
    ldc, ldr = (pad(n), pad(n) + 8) if m * n >= VECTOR_OUTPUTS else (n + 1, n + 3)
    return Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue,
                   lda=pad(base.a_stored[1]), ldb=pad(base.b_stored[1]), ldc=ldc, ldr=ldr)


@pytest.mark.parametrize("real", cases(), ids=lambda r: r.name)
def test_realisation_matches_float64(real, device, runner, compiled):
    info, limits = device
    if not space.templates()[real.template].runs_on(info.compute_capability):
        pytest.skip(f"{real.template} does not run on compute capability {info.compute_capability}")
    if RULES[real.template].violations(real, limits):
        pytest.skip("; ".join(RULES[real.template].violations(real, limits)))
    built = compiled[real.name]
    assert built["problems"] == []
    failures, ran = [], 0
    for m, n, k in (DECODE_SHAPES if real.template == "gemv" else SHAPES):
        problem = padded_problem(real, m, n, k)
        if RULES[real.template].unsupported(real, problem):
            continue
        result = runner.run(real, built["cubin"], problem)
        ran += 1
        validation = result.get("validation", {})
        if validation.get("status") != "passed":
            failing = [c for c in validation.get("checks", []) if not c.get("passed")]
            failures.append((problem.name, result.get("fault") or result.get("error") or failing[:1]))
    assert ran > 0
    assert failures == []


@pytest.mark.parametrize("spread", ["splits", "even", "warps", "bulk"])
def test_split_k_decode_is_deterministic_across_launches(device, runner, spread):
    """The decode kernel's parts of a sum (its splits, the even shares' segments, a CTA's warps' runs) are added in a
    fixed order: the bits repeat (check.validate runs it twice on the same inputs and compares), at a
    shape that cuts K many ways."""
    info, _ = device
    knobs = next(k for k in TRIED["gemv"] if k["spread"] == spread)
    real = space.realisation("gemv", "bfloat16", "k", "k", Epilogue(), **knobs)
    built = build.compile_realisation(real, build.arch_for(real, info.compute_capability))
    result = runner.run(real, built.cubin, Problem(16, 4096, 14336))
    assert result["validation"]["status"] == "passed", result
    assert result["validation"]["splits"] > 1
    assert all(c.get("repeatable", True) for c in result["validation"]["checks"])


@pytest.mark.parametrize("store", ["direct", "staged"])
def test_split_k_wgmma_is_deterministic_across_launches(device, runner, store):
    """The wgmma kernel's split-K parts are added in split order by whichever unit finishes a tile
    last: the bits repeat (check.validate runs it twice on the same inputs and compares), at a
    shape whose 32 tiles are each cut 4 ways and with every epilogue term."""
    info, limits = device
    if not space.templates()["wgmma"].runs_on(info.compute_capability):
        pytest.skip(f"wgmma does not run on compute capability {info.compute_capability}")
    knobs = next(k for k in TRIED["wgmma"] if k["split_k"] == 4 and k["block_n"] == 128)
    real = space.realisation("wgmma", "bfloat16", "k", "k", FUSED, **dict(knobs, store=store))
    problem = Problem(128, 4096, 4096, "bfloat16", "k", "k", FUSED)
    assert RULES["wgmma"].geometry(real, problem, info.sm_count, None).splits == 4
    built = build.compile_realisation(real, build.arch_for(real, info.compute_capability))
    result = runner.run(real, built.cubin, problem)
    assert result["validation"]["status"] == "passed", result
    assert all(c.get("repeatable", True) for c in result["validation"]["checks"])
