"""The adversarial suite's wrong matrix kernels (tests/matrix_mutants.py) without a GPU: each edit
still applies to today's templates and NVRTC compiles the result cleanly, so the GPU suite
(tests/test_gpu_matrix_adversarial.py) tests what it says."""
from __future__ import annotations

import pytest

from aicg.matrix import build, codegen
from matrix_mutants import MUTANTS, compile_mutant, sources


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_is_an_edit_of_the_right_kernel_and_compiles(mutant):
    real = mutant.realisation()
    src, headers = sources(mutant)
    right = (codegen.source(real), build.headers(real))
    changed = (["the source"] if src != right[0] else []) + [h for h in headers if headers[h] != right[1][h]]
    assert changed == [mutant.where if mutant.where != "source" else "the source"]
    built = compile_mutant(mutant, "sm_90a")
    assert built.cubin and build.healthy(built) == []
