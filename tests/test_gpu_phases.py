"""GPU test of tests/bench/phases.py: the marks of kernels/phases.cuh come back in the order the
kernel reaches them, each step taking cycles.

Compiled for this machine's GPU (its hwdb entry); skipped without a GPU that hwdb/ has an entry for.
Run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("candidate, expected", [
    ("rmsnorm_tree.bfloat16.t512.v16.block.c4", ["set-up", "sweep", "reduction", "write"]),
    ("layernorm_twopass.float32.t256.v16.block", ["set-up", "sweep", "reduction", "sweep", "reduction", "write"]),
    ("softmax_rounded_exps.bfloat16.t512.v16.block.c8", ["set-up", "sweep", "reduction", "sweep", "reduction", "write"])])
def test_the_marks_come_back_in_order(repo, shipped_ruleset, bench_module, device_target, gpu_device, candidate,
                                      expected):
    phases = bench_module("phases")
    _, runs = phases.measure(candidate, (1, 4096), 3, "memset", repo / "kernels", shipped_ruleset, device_target,
                             gpu_device)
    for who in phases.THREADS:
        for run in runs[who]:
            assert [name for name, _ in run] == expected and all(cycles > 0 for _, cycles in run), (who, run)
