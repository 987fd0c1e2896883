"""The phase marks of kernels/phases.cuh: nothing in a kernel compiled without AICG_PHASES, a clock
read at each mark with it, and tests/bench/phases.py's reading of the marks. CPU only."""
from __future__ import annotations

import numpy as np
import pytest

from aicg import codegen, nvrtc, occupancy
from ptx import ptx_of

CANDIDATES = ["rmsnorm_tree.bfloat16.t512.v16.block.c4", "layernorm_twopass.float32.t256.v16.block",
              "softmax_twopass.bfloat16.t128.v16.cluster4.c8", "layernorm_twopass.float32.t1024.v16.block_prefetch.c8",
              "softmax_rounded_exps.bfloat16.t512.v16.block.c8", "row_sum_tree.float32.t128.v4.warp"]


@pytest.fixture(scope="module")
def phases(bench_module):
    return bench_module("phases")


@pytest.mark.parametrize("candidate", CANDIDATES)
def test_the_marks_read_the_clock_only_when_asked_for(repo, shipped_ruleset, phases, candidate):
    family_name, dtype, params = phases.params_of(candidate)
    family = shipped_ruleset.families[family_name]
    headers = nvrtc.include_closure(family.header, repo / "kernels")
    plain = ptx_of(codegen.source(candidate, family, dtype, params), headers)
    marked = ptx_of(phases.instrumented_source(candidate, family, dtype, params), headers)
    assert "%clock64" not in plain and "aicg_phase_clocks" not in plain
    assert "%clock64" in marked and ".global .align 8 .b8 aicg_phase_clocks" in marked


def test_an_instrumented_kernel_compiles_to_a_cubin(repo, shipped_ruleset, phases):
    candidate = CANDIDATES[0]
    family_name, dtype, params = phases.params_of(candidate)
    family = shipped_ruleset.families[family_name]
    cubin, report = occupancy.compile_candidate(
        phases.instrumented_source(candidate, family, dtype, params), f"{candidate}.cu",
        nvrtc.include_closure(family.header, repo / "kernels"), "sm_90", params, 65536)[:2]
    assert cubin and report["registers"] > 0


def test_steps_end_where_the_clocks_do_and_medians_skip_other_paths(phases):
    clocks = np.array([100, 970, 2000, 2450, 3100, 0, 0], dtype=np.int64)
    kinds = np.array([0, 1, 2, 3, 4, 0, 0], dtype=np.int32)
    run = phases.steps(clocks, kinds)
    assert run == [("set-up", 870), ("sweep", 1030), ("reduction", 450), ("write", 650)]
    other = [("set-up", 10), ("write", 20)]
    names, cycles, skipped = phases.medians([run, [(n, c + 2) for n, c in run], other])
    assert names == ["set-up", "sweep", "reduction", "write"] and cycles == [871, 1031, 451, 651] and skipped == 1
