"""GPU test of check.same_bits, which check_candidates.py --same-bits runs on a kernel change that
claims to keep the bits: a cubin against itself is the same, and softmax_rounded_exps, which rounds
a long held bfloat16 row's exps once more, is not softmax_twopass.

Skipped without a GPU; run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import pytest

from aicg import codegen, nvrtc
from aicg.runtime import driver
from aicg.validate import check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(driver.probe_device() is None, reason="needs a CUDA GPU")]

PARAMS = {"threads": 512, "vec_bytes": 16, "topology": "block", "fast_exp": False, "cache_packs": 8}
SHAPES = ((8, 32768), (37, 1000), (9, 4096, 4099))   # held untested and tested, and streamed rows apart


def cubin_of(repo, ruleset, family: str) -> bytes:
    info = driver.probe_device()
    fam = ruleset.families[family]
    return nvrtc.compile_cubin(codegen.source(family, fam, "bfloat16", PARAMS), f"{family}.cu",
                               nvrtc.include_closure(fam.header, repo / "kernels"),
                               "sm_%d%d" % info.compute_capability)[0]


def test_a_kernel_writes_the_same_bits_as_itself_and_a_rounding_more_does_not(repo, shipped_ruleset):
    twopass = cubin_of(repo, shipped_ruleset, "softmax_twopass")
    rounded = cubin_of(repo, shipped_ruleset, "softmax_rounded_exps")
    assert check.same_bits([(twopass, PARAMS), (twopass, PARAMS)], "softmax", "bfloat16", SHAPES) == [True] * 3
    differs = check.same_bits([(twopass, PARAMS), (rounded, PARAMS)], "softmax", "bfloat16", SHAPES)
    # held rows round their exps once more; a streamed row computes them as softmax_twopass does
    assert differs == [False, False, True]
