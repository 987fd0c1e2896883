"""GPU test of prefetching blocks (block_prefetch): one wave of resident blocks, each serving
several rows, holding one in registers while the next is copied into shared memory.

Its rows must come out with the bits of one block per row holding the row (`block`, same
parameters): where each block serves two or three rows, where the row fills every slot or not,
and where it is streamed instead (a pack too long for the slots, or not whole packs). Then the
build's validation against float64, awkward shapes included.

Compiled for this machine's GPU (its hwdb entry); skipped without a GPU that hwdb/ has an entry for.
Run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import numpy as np
import pytest

from aicg import codegen, nvrtc, occupancy, validate
from aicg.dtypes import DTYPES
from aicg.ops import OPERATORS
from aicg.runtime import driver
from aicg.validate import check

pytestmark = pytest.mark.gpu


def _kernel(repo, family, dtype: str, params: dict, target):
    source = codegen.source("prefetch", family, dtype, params)
    cubin = occupancy.compile_candidate(source, "prefetch.cu", nvrtc.include_closure(family.header, repo / "kernels"),
                                        target.arch, params, target.fact("registers_per_sm"))[0]
    return cubin, driver.Kernel(cubin, codegen.ENTRY)


@pytest.mark.parametrize("family, dtype, threads, cache_packs", [
    ("layernorm_twopass", "float32", 1024, 8), ("rmsnorm_tree", "float32", 256, 8),
    ("softmax_twopass", "bfloat16", 512, 8), ("log_softmax_twopass", "float16", 1024, 4),
    ("log_softmax_online", "bfloat16", 256, 4)])
def test_prefetched_rows_have_the_bits_of_one_block_per_row(repo, shipped_ruleset, device_target, family, dtype,
                                                           threads, cache_packs):
    target = device_target
    fam = shipped_ruleset.families[family]
    params = {"threads": threads, "vec_bytes": 16, "topology": "block_prefetch", "fast_exp": False,
              "cache_packs": cache_packs}
    cubin, prefetching = _kernel(repo, fam, dtype, params, target)
    _, one_per_row = _kernel(repo, fam, dtype, {**params, "topology": "block"}, target)
    op, dt = OPERATORS[fam.op], DTYPES[dtype]
    pack = 16 // dt.size
    held = threads * pack * cache_packs
    resident = prefetching.resident_blocks(threads, held * dt.size)
    rows = 2 * resident + 3        # every block serves two rows, three of them a third
    rng = np.random.default_rng()
    try:
        for cols in (held, held - pack, held + pack, held - 1):
            buffers = check.Buffers(op, dt, rows, cols)
            try:
                buffers.upload(check.draw(op, dt, rows, cols, 1, rng))
                want = buffers.run_poisoned(one_per_row, {**params, "topology": "block"})
                got = buffers.run_poisoned(prefetching, params)
                split = buffers.run_poisoned(prefetching, params, split=rows // 2 + 1)
                assert np.isfinite(dt.decode(got)).all(), f"{cols} columns: a row left unwritten"
                assert got.tobytes() == want.tobytes(), f"{cols} columns: not the bits of one block per row"
                assert split.tobytes() == want.tobytes(), f"{cols} columns: a split launch differs"
                assert not buffers.wrote_outside
            finally:
                buffers.free()
    finally:
        prefetching.unload()
        one_per_row.unload()
    preset = shipped_ruleset.presets["deterministic"]
    report = validate.validate_on_device(cubin, target, fam.op, dtype, params, tolerance=preset.tolerance[dtype],
                                         deterministic=True, bitwise=False,
                                         check_shapes=validate.AWKWARD_SHAPES + ((rows, held), (5, held + pack)),
                                         timed_shapes=(), trials=2, repetitions=3)
    assert report["status"] == "passed", validate.why_failed(report)
