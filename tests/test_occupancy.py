"""aicg/occupancy.py: where a row-holding kernel is left one block to an SM, a second build asks
for two and is kept when ptxas spills (almost) nothing there. NVRTC only: runs in CI."""
import pytest

from aicg import codegen, nvrtc, occupancy

REGISTERS_PER_SM = 65536   # the H200's (hwdb/nvidia-h200.toml)


def held(threads, cache_packs):
    return {"threads": threads, "vec_bytes": 16, "topology": "block", "fast_exp": False, "cache_packs": cache_packs}


def both_builds(shipped_ruleset, kernels, family_name, dtype, params):
    family = shipped_ruleset.families[family_name]
    source = codegen.source("occupancy", family, dtype, params)
    headers = nvrtc.include_closure(family.header, kernels)
    plain = nvrtc.compile_cubin(source, "occupancy.cu", headers, "sm_90")
    before = nvrtc.compilations
    kept = occupancy.compile_candidate(source, "occupancy.cu", headers, "sm_90", params, REGISTERS_PER_SM)
    return plain, kept, nvrtc.compilations - before


def test_a_held_row_left_one_block_to_an_sm_is_built_again_asking_for_two(shipped_ruleset, repo):
    params = held(512, 8)
    plain, kept, runs = both_builds(shipped_ruleset, repo / "kernels", "layernorm_twopass", "bfloat16", params)
    assert occupancy.resident_blocks(plain[1]["registers"], 512, REGISTERS_PER_SM) == 1
    assert kept[1]["asked_blocks"] == kept[1]["min_blocks"] == 2
    assert kept[1]["registers"] <= REGISTERS_PER_SM // (2 * 512)
    assert 0 < kept[1]["spill_store_bytes"] <= occupancy.SPILL_KEPT_BYTES   # 4 bytes under NVRTC 13.0.88
    assert kept[0] != plain[0] and runs == 2


def test_a_kernel_with_room_for_two_blocks_is_built_once(shipped_ruleset, repo):
    params = held(512, 8)
    plain, kept, runs = both_builds(shipped_ruleset, repo / "kernels", "rmsnorm_tree", "float32", params)
    assert occupancy.resident_blocks(plain[1]["registers"], 512, REGISTERS_PER_SM) >= 2
    assert kept[1]["asked_blocks"] == 0 and kept[0] == plain[0] and runs == 1


def test_a_build_that_spills_where_asked_is_not_kept(shipped_ruleset, repo):
    # residual + rmsnorm holds x + r as floats (64 a thread at c8): two blocks of 512 leave it 64 registers
    params = held(512, 8)
    plain, kept, runs = both_builds(shipped_ruleset, repo / "kernels", "residual_rmsnorm_tree", "bfloat16", params)
    assert kept[1]["asked_blocks"] == 2 and kept[1]["min_blocks"] == 0
    assert (kept[0], kept[1]["registers"], runs) == (plain[0], plain[1]["registers"], 2)


@pytest.mark.parametrize("family_name,dtype", [("layernorm_twopass", "bfloat16"),    # asked and kept
                                               ("rmsnorm_tree", "float32"),            # not asked
                                               ("residual_rmsnorm_tree", "bfloat16")])  # asked, not kept
def test_the_concurrent_build_keeps_what_the_sequential_one_keeps(shipped_ruleset, repo, family_name, dtype):
    family = shipped_ruleset.families[family_name]
    source = codegen.source("occupancy", family, dtype, held(512, 8))
    headers = nvrtc.include_closure(family.header, repo / "kernels")
    one_after_other = occupancy.compile_candidate(source, "occupancy.cu", headers, "sm_90", held(512, 8),
                                                  REGISTERS_PER_SM)
    side_by_side = occupancy.compile_candidate(source, "occupancy.cu", headers, "sm_90", held(512, 8),
                                               REGISTERS_PER_SM, concurrent=True)
    assert side_by_side[:2] == one_after_other[:2]

def test_a_streamed_row_and_a_block_of_1024_are_not_asked():
    one_block = {"reported": True, "registers": 100}
    assert not occupancy.worth_asking(held(512, 0), one_block, REGISTERS_PER_SM)
    assert not occupancy.worth_asking(held(1024, 4), {"reported": True, "registers": 60}, REGISTERS_PER_SM)
    assert occupancy.worth_asking(held(512, 8), one_block, REGISTERS_PER_SM)
    assert not occupancy.worth_asking(held(512, 8), {"reported": False, "registers": 0}, REGISTERS_PER_SM)


def test_the_launch_bound_is_rewritten_only_where_the_source_has_exactly_one():
    source = '// aicg candidate x\n#include "norms.cuh"\nextern "C" __global__ void __launch_bounds__(512)\naicg_kernel() {}\n'
    asked = codegen.with_min_blocks(source, 512, 2)
    assert "__launch_bounds__(512, 2)" in asked and '#define AICG_MIN_BLOCKS 2\n#include "norms.cuh"' in asked
    with pytest.raises(ValueError, match="has 0"):
        codegen.with_min_blocks(source, 256, 2)


def test_the_compile_key_names_the_policy_and_the_register_file():
    key = occupancy.compile_key("src", {"a.cuh": "d"}, "sm_90", held(512, 8), REGISTERS_PER_SM)
    assert key != occupancy.compile_key("src", {"a.cuh": "d"}, "sm_90", held(512, 8), REGISTERS_PER_SM // 2)
    assert key != occupancy.compile_key("src", {"a.cuh": "d"}, "sm_90", held(512, 4), REGISTERS_PER_SM)


def _compile_concurrently(source, headers, params) -> None:
    occupancy.compile_candidate(source, "occupancy.cu", headers, "sm_90", params, REGISTERS_PER_SM, concurrent=True)


def test_a_process_forked_after_a_concurrent_build_builds_concurrently_too(shipped_ruleset, repo):
    """The second build runs on a thread of its own: a forked child has no pool worker to wait on."""
    import multiprocessing
    family = shipped_ruleset.families["layernorm_twopass"]
    source = codegen.source("occupancy", family, "bfloat16", held(512, 8))
    headers = nvrtc.include_closure(family.header, repo / "kernels")
    _compile_concurrently(source, headers, held(512, 8))
    child = multiprocessing.get_context("fork").Process(target=_compile_concurrently,
                                                        args=(source, headers, held(512, 8)))
    child.start()
    child.join(120)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0
