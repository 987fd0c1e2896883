"""GPU: wrong matrix kernels, made from the real templates with one edit each
(tests/matrix_mutants.py: a skipped k tile, B read transposed, GELU applied twice, a bias left out
of half the columns, a kernel that keeps a previous result), each rejected by the validation the
build runs (aicg/matrix/check.py through aicg/matrix/worker.py), and the unedited kernels accepted
on the same problems. Skipped without a GPU that hwdb/ has an entry for; `pytest -m gpu`.
"""
from __future__ import annotations

import pytest

from aicg.matrix import build, codegen, space, worker
from aicg.matrix.problem import Problem
from matrix_mutants import MUTANTS, compile_mutant

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("device_target")]

# More than one k tile (the skipped one is the second), ragged edges; M of the decode kernel at most 16.
PROBLEMS = {"wgmma": ((256, 256, 512), (129, 200, 1000)), "gemv": ((16, 256, 512), (3, 200, 1000))}


@pytest.fixture(scope="module")
def runner():
    return worker.Runner()


def _results(runner, real, cubin) -> list[dict]:
    return [runner.run(real, cubin, Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue))
            for m, n, k in PROBLEMS[real.template]]


def _runs_here(real, device_target) -> str:
    if not space.templates()[real.template].runs_on(tuple(device_target.compute_capability)):
        pytest.skip(f"{real.template} does not run on compute capability {device_target.compute_capability}")
    return build.arch_for(real, tuple(device_target.compute_capability))


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_validation_rejects_the_wrong_matrix_kernel(mutant, device_target, runner):
    arch = _runs_here(mutant.realisation(), device_target)
    built = compile_mutant(mutant, arch)
    assert build.healthy(built) == []
    statuses = [r["validation"]["status"] for r in _results(runner, mutant.realisation(), built.cubin)]
    assert any(s != "passed" for s in statuses), f"{mutant.name} passed validation: {statuses}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_kernel_it_was_made_from_passes_the_same_problems(mutant, device_target, runner):
    real = mutant.realisation()
    arch = _runs_here(real, device_target)
    built = build.compile_source(real, codegen.source(real), f"{real.name}.cu", build.headers(real), arch)
    statuses = [r["validation"]["status"] for r in _results(runner, real, built.cubin)]
    assert statuses == ["passed"] * len(statuses)
