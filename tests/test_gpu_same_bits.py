"""GPU test of check.same_bits, which check_candidates.py --same-bits runs on a kernel change that
claims to keep the bits: a cubin against itself is the same, and softmax_rounded_exps, which rounds
a long held bfloat16 row's exps once more, is not softmax_twopass.

Compiled for this machine's GPU (its hwdb entry); skipped without a GPU that hwdb/ has an entry for.
Run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import pytest

from aicg import codegen, nvrtc
from aicg.validate import check

pytestmark = pytest.mark.gpu

PARAMS = {"threads": 512, "vec_bytes": 16, "topology": "block", "fast_exp": False, "cache_packs": 8}
SHAPES = ((8, 32768), (37, 1000), (9, 4096, 4099))   # held untested and tested, and streamed rows apart


def cubin_of(repo, ruleset, family: str, arch: str) -> bytes:
    fam = ruleset.families[family]
    return nvrtc.compile_cubin(codegen.source(family, fam, "bfloat16", PARAMS), f"{family}.cu",
                               nvrtc.include_closure(fam.header, repo / "kernels"), arch)[0]


def test_a_kernel_writes_the_same_bits_as_itself_and_a_rounding_more_does_not(repo, shipped_ruleset, device_target):
    twopass = cubin_of(repo, shipped_ruleset, "softmax_twopass", device_target.arch)
    rounded = cubin_of(repo, shipped_ruleset, "softmax_rounded_exps", device_target.arch)
    assert check.same_bits([(twopass, PARAMS), (twopass, PARAMS)], "softmax", "bfloat16", SHAPES) == [True] * 3
    differs = check.same_bits([(twopass, PARAMS), (rounded, PARAMS)], "softmax", "bfloat16", SHAPES)
    # held rows round their exps once more; a streamed row computes them as softmax_twopass does
    assert differs == [False, False, True]
