"""softmax_rounded_exps keeps a long held 16-bit row's exps, rounded to the row's type, so that its
write sweep computes none (kernels/softmax.cuh); everywhere else it is softmax_twopass. Checked by
counting the exps (ex2 instructions: expf is a range reduction around one) in the PTX NVRTC makes
of both families' kernels. CPU only."""
from __future__ import annotations

import pytest

from aicg import codegen, nvrtc
from ptx import ptx_of


def exps(repo, ruleset, family: str, dtype: str, threads: int, topology: str, cache_packs: int) -> int:
    fam = ruleset.families[family]
    params = {"threads": threads, "vec_bytes": 16, "topology": topology, "fast_exp": False, "cache_packs": cache_packs}
    ptx = ptx_of(codegen.source("exps", fam, dtype, params), nvrtc.include_closure(fam.header, repo / "kernels"))
    return ptx.count("ex2.approx")


@pytest.mark.parametrize("dtype, threads, topology", [("bfloat16", 512, "block"), ("float16", 1024, "block_prefetch"),
                                                      ("bfloat16", 128, "cluster4")])
def test_a_long_held_16_bit_row_computes_each_exp_once(repo, shipped_ruleset, dtype, threads, topology):
    twice = exps(repo, shipped_ruleset, "softmax_twopass", dtype, threads, topology, 8)
    once = exps(repo, shipped_ruleset, "softmax_rounded_exps", dtype, threads, topology, 8)
    # each held path (eight packs of eight) drops its write sweep's 64 exps; the streamed path keeps its own
    assert 0 < once <= twice - 64, (once, twice)


@pytest.mark.parametrize("dtype, cache_packs", [("float32", 8), ("bfloat16", 4), ("bfloat16", 0)])
def test_rows_that_keep_their_exps_as_floats_are_softmax_twopass(repo, shipped_ruleset, dtype, cache_packs):
    assert exps(repo, shipped_ruleset, "softmax_rounded_exps", dtype, 512, "block", cache_packs) == \
        exps(repo, shipped_ruleset, "softmax_twopass", dtype, 512, "block", cache_packs)
