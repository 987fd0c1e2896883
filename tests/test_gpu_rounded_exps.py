"""GPU test of softmax_rounded_exps: a held 16-bit row keeping its exps rounded to its type is
within the tolerance preset's bounds against float64, whether its slots are all full (rows of
exactly lanes x 64 elements), partly full, or the row is streamed (too long to hold).

Compiled for this machine's GPU (its hwdb entry); skipped without a GPU that hwdb/ has an entry for.
Run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import pytest

from aicg import codegen, nvrtc, validate

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype, threads, topology", [
    ("bfloat16", 512, "block"), ("float16", 512, "block"), ("bfloat16", 1024, "block_prefetch"),
    ("float16", 128, "cluster4")])
def test_rounded_exps_keep_the_tolerance(repo, shipped_ruleset, device_target, dtype, threads, topology):
    fam = shipped_ruleset.families["softmax_rounded_exps"]
    params = {"threads": threads, "vec_bytes": 16, "topology": topology, "fast_exp": False, "cache_packs": 8}
    cubin = nvrtc.compile_cubin(codegen.source("rounded", fam, dtype, params), "rounded.cu",
                                nvrtc.include_closure(fam.header, repo / "kernels"), device_target.arch)[0]
    held = threads * (4 if topology == "cluster4" else 1) * 64   # the elements a row group holds
    preset = shipped_ruleset.presets["tolerance"]
    report = validate.validate_on_device(cubin, device_target, fam.op, dtype, params, tolerance=preset.tolerance[dtype],
                                         deterministic=preset.axes["deterministic"], bitwise=False,
                                         check_shapes=validate.AWKWARD_SHAPES + ((7, held), (5, held - 72), (3, 2 * held)),
                                         timed_shapes=(), trials=2, repetitions=3)
    assert report["status"] == "passed", validate.why_failed(report)
