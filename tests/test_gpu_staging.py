"""GPU test of rows staged in shared memory (block_staged): validated against float64 where the
row is staged and where it falls back to global memory (too long, or not in whole packs).

Compiled for this machine's GPU (its hwdb entry); skipped without a GPU that hwdb/ has an entry for.
Run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import pytest

from aicg import codegen, nvrtc, validate
from aicg.dtypes import DTYPES
from aicg.runtime import driver

pytestmark = pytest.mark.gpu

# (rows, cols): a row staged whole; one of 65536, staged in 16-bit types (128 KiB) and too long
# in float32 (256 KiB); and one a single element short of a 16-byte pack multiple (not staged).
SHAPES = ((64, 32768), (3, 65536), (5, 32767))


@pytest.mark.parametrize("family, dtype, threads", [
    ("softmax_twopass", "bfloat16", 256), ("log_softmax_twopass", "float32", 512),
    ("softmax_online", "float16", 128), ("rmsnorm_tree", "float32", 1024), ("layernorm_twopass", "bfloat16", 512),
    ("layernorm_welford", "float16", 256)])
def test_staged_rows_validate_staged_and_not(repo, shipped_ruleset, device_target, family, dtype, threads):
    fam = shipped_ruleset.families[family]
    params = {"threads": threads, "vec_bytes": 16, "topology": "block_staged", "fast_exp": False, "cache_packs": 0}
    cubin = nvrtc.compile_cubin(codegen.source("staged", fam, dtype, params), "staged.cu",
                                nvrtc.include_closure(fam.header, repo / "kernels"), device_target.arch)[0]
    kernel = driver.Kernel(cubin, codegen.ENTRY)
    size = DTYPES[dtype].size
    # the long rows do reach shared memory where they fit
    assert codegen.shared_bytes(kernel, params, 32768, size) == 32768 * size
    assert codegen.shared_bytes(kernel, params, 65536, size) == (65536 * size if size == 2 else 0)
    kernel.unload()
    preset = shipped_ruleset.presets["deterministic"]
    report = validate.validate_on_device(cubin, device_target, fam.op, dtype, params, tolerance=preset.tolerance[dtype],
                                         deterministic=True, bitwise=False,
                                         check_shapes=validate.AWKWARD_SHAPES + SHAPES, timed_shapes=(), trials=2,
                                         repetitions=3)
    assert report["status"] == "passed", validate.why_failed(report)
