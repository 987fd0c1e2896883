"""GPU test of the rounding bound (aicg/semantics/accuracy.py): one thread per row, the longest
chain of roundings any topology has, keeps the tolerance preset's float32 bound on the awkward
shapes cut to its longest row and on many rows of that length, trial after trial; validation
then is no draw.

Skipped without a GPU that hwdb/ has an entry for; run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import pytest

from aicg import codegen, nvrtc, validate
from aicg.semantics import accuracy

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family, topology", [
    ("softmax_online", "thread_rows8"), ("softmax_twopass", "thread"), ("log_softmax_online", "thread_rows8"),
    ("row_sum_sequential", "thread"), ("rmsnorm_tree", "thread_rows8"), ("layernorm_twopass", "thread"),
    ("layernorm_welford", "thread_rows8"), ("residual_rmsnorm_tree", "thread")])
def test_a_thread_per_row_keeps_float32_rtol_up_to_its_longest_row(repo, shipped_ruleset, device_target, family,
                                                                    topology):
    fam = shipped_ruleset.families[family]
    preset = shipped_ruleset.presets["tolerance"]
    rtol = preset.tolerance["float32"][0]
    params = {"threads": 128, "vec_bytes": 16, "topology": topology, "fast_exp": False, "cache_packs": 0}
    longest = accuracy.longest_row(shipped_ruleset, fam.op, "float32", params, rtol)
    assert 256 < longest < 4097
    cubin = nvrtc.compile_cubin(codegen.source("bounded", fam, "float32", params), "bounded.cu",
                                nvrtc.include_closure(fam.header, repo / "kernels"), device_target.arch)[0]
    shapes = accuracy.clip_shapes(validate.AWKWARD_SHAPES + ((4096, longest), (4096, longest - 1)), longest)
    report = validate.validate_on_device(cubin, device_target, fam.op, "float32",
                                         params, tolerance=preset.tolerance["float32"], deterministic=False,
                                         bitwise=False, check_shapes=shapes, timed_shapes=(), trials=6,
                                         repetitions=3)
    if report["status"] == "unvalidated":
        pytest.skip(report["reason"])
    assert report["status"] == "passed", validate.why_failed(report)
