"""GPU tests of the matrix family: every template that runs on the GPU present, both layouts of
each operand, both dtypes and every epilogue, validated against float64 (aicg/matrix/check.py:
poisoned outputs, guard bytes, NaN row padding, repeated and fresh-input runs) on one tile,
ragged shapes and a mid-size square, each case in a worker process of its own (a fault or a
hang fails the case, not the session). The target is the device's compute capability; its
limits come from the hwdb entry naming the device, or the driver.

Skipped without a GPU; run on a GPU node with `pytest -m gpu tests/test_gpu_matrix.py`.
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
# (m, n, k): a tile, off every tile and vector size, K not a multiple of 8 (padded rows), a mid square
SHAPES = [(128, 128, 64), (1, 7, 64), (7, 129, 1000), (127, 1000, 129), (129, 127, 4097), (1000, 1000, 1000),
          (3, 520, 8)]
DECODE_SHAPES = [(16, 128, 64), (1, 7, 64), (3, 520, 8), (16, 1000, 4096), (1, 4096, 4096), (9, 4104, 1000)]


def cases():
    found = []
    for template in ("wgmma", "mma", "gemv"):
        tpl = space.templates()[template]
        for i, knobs in enumerate(tpl.tried):
            for a in tpl.a_layouts:
                for b in tpl.b_layouts:
                    # every setting with plain output in every layout; the first setting with every
                    # epilogue and both dtypes
                    combos = [("bfloat16", Epilogue())] if i else \
                        [(d, e) for d in ("bfloat16", "float16") for e in EPILOGUES]
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


def padded_problem(real, m, n, k) -> Problem:
    base = Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue)
    pad = lambda x: -(-x // 8) * 8   # noqa: E731
    return Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue,
                   lda=pad(base.a_stored[1]), ldb=pad(base.b_stored[1]), ldc=n + 1, ldr=n + 3)


@pytest.mark.parametrize("real", cases(), ids=lambda r: r.name)
def test_realisation_matches_float64(real, device, runner):
    info, limits = device
    if not space.templates()[real.template].runs_on(info.compute_capability):
        pytest.skip(f"{real.template} does not run on compute capability {info.compute_capability}")
    if RULES[real.template].violations(real, limits):
        pytest.skip("; ".join(RULES[real.template].violations(real, limits)))
    built = build.compile_realisation(real, build.arch_for(real, info.compute_capability))
    assert build.healthy(built) == []
    failures, ran = [], 0
    for m, n, k in (DECODE_SHAPES if real.template == "gemv" else SHAPES):
        problem = padded_problem(real, m, n, k)
        if RULES[real.template].unsupported(real, problem):
            continue
        result = runner.run(real, built.cubin, problem)
        ran += 1
        validation = result.get("validation", {})
        if validation.get("status") != "passed":
            failing = [c for c in validation.get("checks", []) if not c.get("passed")]
            failures.append((problem.name, result.get("fault") or result.get("error") or failing[:1]))
    assert ran > 0
    assert failures == []


def test_split_k_decode_is_deterministic_across_launches(device, runner):
    """The decode kernel's split-K sum is added in a fixed order: the bits repeat (check.validate
    runs it twice on the same inputs and compares), at a shape that splits K many ways."""
    info, _ = device
    real = space.realisation("gemv", "bfloat16", "k", "k", Epilogue(), **TRIED["gemv"][0])
    built = build.compile_realisation(real, build.arch_for(real, info.compute_capability))
    result = runner.run(real, built.cubin, Problem(16, 4096, 14336))
    assert result["validation"]["status"] == "passed", result
    assert result["validation"]["splits"] > 1
    assert all(c.get("repeatable", True) for c in result["validation"]["checks"])
