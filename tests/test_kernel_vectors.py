"""The norms' per-column vectors (w, b) are not tested for null at run time (kernels/row_access.cuh):
with such a test, ptxas put each vector's load in a branch of its own and waited for w before it
issued b's load, two memory latencies in every write sweep (docs/performance.md, 2026-12-04).
Checked in the PTX NVRTC makes of the kernels: no pointer read from w's or b's parameter is compared
with zero. CPU only."""
from __future__ import annotations

import re

import pytest

from aicg import codegen, nvrtc
from ptx import ptx_of


def null_tests(ptx: str, param: int) -> list[str]:
    """The comparisons with zero of a register holding the kernel's parameter `param`, or its global
    address."""
    loaded = set(re.findall(rf"ld\.param\.u64\s+(%rd\d+), \[{codegen.ENTRY}_param_{param}\];", ptx))
    held = loaded | {to for to, frm in re.findall(r"cvta\.to\.global\.u64\s+(%rd\d+), (%rd\d+);", ptx)
                     if frm in loaded}
    compared = re.findall(r"(setp\.\w+\.[su]64\s+%p\d+, (%rd\d+), 0;)", ptx)
    return [line for line, register in compared if register in held]


def parameters(source: str) -> list[str]:
    """The entry's parameter names, in order."""
    signature = source.split(codegen.ENTRY, 1)[1]
    return re.findall(r"^\s+(?:const\s+)?[\w:]+(?:\s*\*\s*__restrict__)?\s+(\w+)[,)]", signature, re.M)


@pytest.mark.parametrize("family, dtype, threads, vec_bytes, topology, cache_packs", [
    ("layernorm_twopass", "bfloat16", 512, 16, "block", 4), ("layernorm_twopass", "float32", 256, 4, "warp", 0),
    ("layernorm_welford", "float16", 128, 16, "lanes4", 8), ("rmsnorm_tree", "bfloat16", 512, 16, "block", 0),
    ("rmsnorm_tree", "float32", 1024, 16, "block_prefetch", 8),
    ("residual_rmsnorm_tree", "bfloat16", 256, 16, "warp", 8)])
def test_the_norms_read_w_and_b_with_no_null_test(repo, shipped_ruleset, family, dtype, threads, vec_bytes,
                                                   topology, cache_packs):
    fam = shipped_ruleset.families[family]
    params = {"threads": threads, "vec_bytes": vec_bytes, "topology": topology, "fast_exp": False,
              "cache_packs": cache_packs}
    source = codegen.source("vectors", fam, dtype, params)
    ptx = ptx_of(source, nvrtc.include_closure(fam.header, repo / "kernels"))
    names = parameters(source)
    vectors = [names.index(v) for v in ("w", "b") if v in names]
    assert vectors, f"no w or b among {names}"
    for param in vectors:
        assert re.search(rf"\[{codegen.ENTRY}_param_{param}\]", ptx), f"{names[param]} is never read"
        assert not null_tests(ptx, param), f"{names[param]} is tested for null: {null_tests(ptx, param)[:3]}"
