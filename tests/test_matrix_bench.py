"""tests/bench/matmul_bench.py's parts that need no GPU: which realisations a run tries on a
GPU of each kind, the ragged problems, the failure report, the JSON record, the arguments."""
from __future__ import annotations

import json

import pytest

from aicg import hw
from aicg.matrix.problem import Problem
from aicg.matrix.templates import RULES, GpuLimits


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("matmul_bench")


def limits(repo, entry):
    return GpuLimits.of_hardware(hw.load(repo / "hwdb" / f"{entry}.toml"))


def test_a_hopper_run_tries_every_template_layout_dtype_and_epilogue(bench, repo):
    reals = bench.realisations((9, 0), limits(repo, "h100-sxm"))
    names = [r.name for r in reals]
    assert len(names) == len(set(names))
    for template in ("wgmma", "mma"):
        ours = [r for r in reals if r.template == template]
        assert {(r.a_major, r.b_major) for r in ours} == {("k", "k"), ("k", "mn"), ("mn", "k"), ("mn", "mn")}
        assert {r.dtype for r in ours} == {"bfloat16", "float16"}
        assert {r.epilogue.activation for r in ours} == {"none", "gelu_tanh", "gelu_erf", "silu"}
        assert any(r.epilogue == bench.FUSED_EPILOGUE for r in ours)
    assert any(r.knob("cluster_m") == 2 for r in reals if r.template == "wgmma")
    assert any(not r.knob("aligned") for r in reals if r.template == "mma")
    assert {r.template for r in reals} == {"wgmma", "mma", "gemv"}
    hopper = limits(repo, "h100-sxm")
    assert all(RULES[r.template].violations(r, hopper) == [] for r in reals)


def test_an_ampere_run_leaves_wgmma_out(bench, repo):
    reals = bench.realisations((8, 0), limits(repo, "a100-sxm4-80gb"))
    assert reals and {r.template for r in reals} == {"mma", "gemv"}


@pytest.mark.parametrize("m, n, k", [(1, 7, 64), (127, 1000, 129), (129, 127, 4097)])
def test_ragged_problems_pad_rows_to_whole_vectors(bench, repo, m, n, k):
    for real in bench.realisations((9, 0), limits(repo, "h100-sxm")):
        p = bench.ragged_problem(real, m, n, k)
        assert p.lda % 8 == 0 and p.ldb % 8 == 0 and p.lda >= p.a_stored[1] and p.ldb >= p.b_stored[1]
        assert p.ldc == n + 3 and p.ldr == n + 5
        reason = RULES[real.template].unsupported(real, p)
        if real.template == "gemv":
            assert (reason is None) == (m <= 16 and k % 8 == 0)
        else:
            assert reason is None


def test_a_failure_prints_where_the_output_is_wrong(bench, capsys):
    result = {"validation": {"status": "failed", "checks": [
        {"passed": True, "trial": 1},
        {"passed": False, "trial": 0, "worst_error_over_bound": 1e4, "unwritten": 0, "repeatable": False,
         "mismatch": {"wrong": 5, "checked": 16384, "rows": "0-63", "columns": "64-127", "unwritten": 0,
                      "examples": [[0, 64, 1.5, -2.0]], "map": [".." + "xx", "...."]}}]}}
    bench.print_failure(result)
    out = capsys.readouterr().out
    assert "trial 0: worst error 1e+04x the bound" in out and "not repeatable" in out
    assert "rows 0-63; columns 64-127" in out and "C[0,64] = 1.5, expected -2" in out and "..xx" in out
    bench.print_failure({"fault": "a launch did not finish within 20 s (hang guard)"})
    assert "hang guard" in capsys.readouterr().out
    assert bench.verdict({"fault": "x"}) == "FAULT" and bench.verdict({"skipped": "m = 17"}) == "n/a"


def test_the_record_is_valid_json_after_every_case(bench, tmp_path):
    path = tmp_path / "m.json"
    rec = bench.Recorder(str(path), {"device": {"name": "x"}})
    rec.case("tiny", {"realisation": "r", "problem": Problem(1, 2, 8).name, "validation": {"status": "passed"}})
    data = json.loads(path.read_text())
    assert data["cases"][0]["stage"] == "tiny" and data["device"]["name"] == "x"
    rec.peer("grid", {"name": "copy", "bytes_per_second": 3e12})
    assert json.loads(path.read_text())["peers"][0]["name"] == "copy"


def test_arguments(bench):
    args = bench.parse(["--grid-m", "1,16", "--grid-nk", "4096x4096", "--stages", "tiny,grid"])
    assert args.grid_m == [1, 16] and args.grid_nk == [(4096, 4096)] and args.stages == ["tiny", "grid"]
    quick = bench.parse(["--quick"])
    assert quick.stages == ["tiny", "ragged"] and quick.reps == 5


def grid_bench(bench, repo, record):
    """A Bench as the grid stage sees it, without a GPU: every K-major realisation compiled and valid."""
    made = object.__new__(bench.Bench)
    made.args = bench.parse([])
    made.record = record
    made.info = type("Info", (), {"sm_count": 132})()
    made.cc, made.limits = (9, 0), limits(repo, "h100-sxm")
    made.reals = bench.realisations(made.cc, made.limits)
    made.built = {r.name: {"cubin": b"", "problems": []} for r in made.reals}
    made.passed, made.square_results, made._planned = {}, {}, None
    return made


def test_the_grid_times_at_each_shape_what_the_calibrated_prior_ranks_first_there(bench, repo):
    made = grid_bench(bench, repo, hw.load(repo / "hwdb/h100-sxm.toml"))
    predicted = made.predicted()
    tops = made.candidates("wgmma", "k", "k")[:1]
    few_tiles = made.shape_candidates(Problem(128, 4096, 4096), tops, predicted)
    assert few_tiles[0] == tops[0] and len(few_tiles) <= 1 + 2 * (made.args.grid_ranked + 1)   # two pools
    wide_decode = made.shape_candidates(Problem(1, 28672, 4096), tops, predicted)
    # the decode kernel's first of each pool (and those the prior ranks among the firsts), not every one
    assert 1 <= [r.template for r in wide_decode].count("gemv") < len(made.candidates("gemv", "k", "k"))
    assert any(r.template == "wgmma" and r.knob("split_k") > 1 for r in few_tiles)   # 16 tiles of 128 x 256
    decode = made.shape_candidates(Problem(1, 4096, 4096), tops, predicted)
    assert any(r.template == "gemv" for r in decode)
    large = made.shape_candidates(Problem(4096, 4096, 4096), tops, predicted)
    assert not any(r.template == "gemv" or r.template == "wgmma" and r.knob("split_k") > 1 for r in large)
    pool = [r for r in made.planned_pool() if r.template != "gemv" and made.worth_timing(r, Problem(4096, 4096, 4096))]
    best = min(pool, key=lambda r: predicted(r, Problem(4096, 4096, 4096)))
    assert best in large
    # without the GPU's hwdb entry: the square stage's best and, for M <= 16, every decode realisation
    blind = grid_bench(bench, repo, None)
    assert blind.predicted() is None
    assert blind.shape_candidates(Problem(1, 4096, 4096), tops, None) == tops + blind.candidates("gemv", "k", "k")
    assert blind.shape_candidates(Problem(4096, 4096, 4096), tops, None) == tops


def test_the_grid_ranks_the_planners_settings_unless_told_the_tried_ones(bench, repo):
    made = grid_bench(bench, repo, hw.load(repo / "hwdb/h100-sxm.toml"))
    predicted, problem = made.predicted(), Problem(128, 6144, 4096)
    both = made.shape_candidates(problem, [], predicted)
    tried_names = {r.name for r in made.reals}
    assert any(r.name not in tried_names for r in both)      # a setting no tried one has: compiled as needed
    assert all(r.a_major == r.b_major == "k" and r.dtype == "bfloat16" for r in both)
    made.args = bench.parse(["--grid-pool", "tried"])
    tried = made.shape_candidates(problem, [], predicted)
    assert all(r.name in tried_names for r in tried) and set(tried) < set(both)   # the tried ranking stays


def test_decode_floor_variants_still_find_the_lines_they_replace(bench_module, repo):
    """tests/bench/decode_floor.py's variants edit gemv.cuh by its text: each must still apply, and
    leave out only what it says (the reduction returns before its fence; A's loads in the loop the
    split-K, even and warps spreads run become a constant)."""
    floor = bench_module("decode_floor")
    text = (repo / "kernels/matrix/gemv.cuh").read_text()
    assert floor.variant_header(text, "base") == text
    noreduce = floor.variant_header(text, "noreduce")
    assert noreduce.count("  return;\n" + floor.REDUCE_START) == 1
    no_a = floor.variant_header(text, "noA")
    assert not any(line in no_a for line in floor.A_LOADS) and all(line in no_a for line in floor.A_CONSTANT)
    both = floor.variant_header(text, "noA+noreduce")
    assert floor.A_LOADS[0] not in both and "  return;\n" + floor.REDUCE_START in both
    for variant in ("chunked", "onefence", "chunked+onefence"):
        changed = floor.variant_header(text, variant)
        assert (floor.READ_BACK_CHUNKED in changed) == ("chunked" in variant)
        assert (floor.FENCE_ONE in changed) == ("onefence" in variant)
    with pytest.raises(ValueError):
        floor.variant_header(text, "nomath")
    with pytest.raises(ValueError):
        floor.variant_header(text.replace(floor.REDUCE_START, ""), "noreduce")


def test_decode_inflight_compiles_its_reads_on_the_matrix_headers(bench_module):
    """tests/bench/decode_inflight.py's kernels (its bulk ring on mbarrier.cuh) compile for sm_90 on
    a machine without a GPU, each kernel the run launches by name present."""
    inflight = bench_module("decode_inflight")
    cubin = inflight.compile_source((9, 0))
    names = [f"read_grid_{loads}" for _, _, loads in inflight.READ_GRID] + \
        [name for name, _ in inflight.READ_ROWS] + [t[0] for t in inflight.READ_BULK + inflight.BULK_GEMV]
    assert all(name.encode() in cubin for name in names)
