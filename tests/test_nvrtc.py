import os
import re
import shutil
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from aicg import codegen, hw, nvrtc, plan, plan_inputs
from aicg import planning as planning_inputs
from aicg.errors import CompileError

ARCH_TARGET = {"sm_80": "a100-sxm4-80gb", "sm_90": "h100-sxm"}   # an hwdb entry of each arch
SPILL_WITHOUT_PRESSURE = 48   # bytes stored and loaded
PARAMS = {"threads": 256, "vec_bytes": 16, "topology": "block", "fast_exp": False, "cache_packs": 0}


@pytest.fixture(scope="session")
def kernels(repo):
    return repo / "kernels"


@pytest.fixture(scope="session")
def planned(repo, shipped_ruleset):
    """The candidates `doit build` would compile for a shipped profile (or `per_family` of each)."""
    def candidates(name, per_family=None):
        rs = shipped_ruleset
        planning = planning_inputs.load(repo / "rulesets", repo / "rulesets" / "profiles" / f"{name}.toml", repo / "hwdb")
        return [c for _, cands in plan.plan_workload(rs, planning.prof, planning.hw_facts, per_family,
                                                     planning.measured).values() for c in cands]
    return candidates


def compile_candidate(rs, kernels, c, arch):
    family = rs.families[c.family]
    src = codegen.source(c.id, family, c.dtype, c.params)
    return nvrtc.compile_cubin(src, f"{c.id}.cu", nvrtc.include_closure(family.header, kernels), arch)


@pytest.mark.parametrize("arch", sorted(ARCH_TARGET))
def test_every_planned_candidate_compiles(repo, shipped_ruleset, kernels, planned, arch):
    """Every candidate of the default and the fast profile, and 8 per family of
    the fast one (fast_exp and held rows included)."""
    regs_per_sm = hw.load_target(repo / "hwdb", ARCH_TARGET[arch]).fact("registers_per_sm")
    candidates = {c.id: c for name, k in [("default", None), ("fast", None), ("fast", 8)] for c in planned(name, k)}
    if arch == "sm_80":   # the profiles plan for the H200; an sm_80 target has no thread-block clusters
        candidates = {i: c for i, c in candidates.items() if codegen.blocks_per_row(c.params["topology"]) == 1}
    assert any(c.params["fast_exp"] for c in candidates.values())
    assert any(c.params["cache_packs"] for c in candidates.values())

    def check(c):
        try:
            cubin, report, _ = compile_candidate(shipped_ruleset, kernels, c, arch)
        except CompileError as err:
            return [f"{c.id}: {err}"]
        problems = []
        if not cubin.startswith(b"\x7fELF"):
            problems.append(f"{c.id}: not an ELF cubin")
        # a held row may spill under register pressure (the build times what it costs);
        # without one, ptxas at times parks a few values in local memory far below the
        # register limit (40 of 128 registers), never more than SPILL_WITHOUT_PRESSURE bytes
        spills = report["spill_store_bytes"] + report["spill_load_bytes"]
        if report["registers"] <= 0 or (spills > SPILL_WITHOUT_PRESSURE and not c.params["cache_packs"]):
            problems.append(f"{c.id}: {report}")
        if report["registers"] * c.params["threads"] > regs_per_sm:
            problems.append(f"{c.id}: {report['registers']} registers x {c.params['threads']} threads")
        return problems

    with ThreadPoolExecutor(os.cpu_count()) as pool:      # NVRTC compiles separate programs concurrently
        problems = [p for found in pool.map(check, candidates.values()) for p in found]
    assert not problems, "\n".join(problems)


def _family_including(rs, kernels, header):
    return next(f for f in rs.families.values() if header in nvrtc.include_closure(f.header, kernels))


@pytest.mark.parametrize("header", [
    "aicg_types.cuh", "reduce.cuh", "row_access.cuh", "norms.cuh", "welford.cuh", "softmax.cuh",
    "row_reduce.cuh",
    "online_softmax.cuh", "ieee.cuh",
])
def test_a_syntax_error_in_a_header_names_its_file_and_line(tmp_path, shipped_ruleset, kernels, header):
    broken = shutil.copytree(kernels, tmp_path / "kernels")
    lines = (broken / header).read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("namespace aicg {")) + 1
    lines.insert(at, "__device__ int aicg_broken = ;\n")
    (broken / header).write_text("".join(lines))

    family = _family_including(shipped_ruleset, kernels, header)
    src = codegen.source("broken", family, "float32", PARAMS)
    with pytest.raises(CompileError) as info:
        nvrtc.compile_cubin(src, "broken.cu", nvrtc.include_closure(family.header, broken), "sm_90")
    message = str(info.value)
    assert "broken.cu for sm_90" in message
    first = re.search(r"^(\S+)\((\d+)\): error", message, re.M)
    assert first and (first.group(1), int(first.group(2))) == (f"kernels/{header}", at + 1), message


def test_include_closure_follows_includes_transitively(kernels):
    # From the #include lines of kernels/*.cuh.
    assert set(nvrtc.include_closure("softmax.cuh", kernels)) == {
        "softmax.cuh", "ieee.cuh", "online_softmax.cuh", "reduce.cuh", "row_access.cuh", "aicg_types.cuh", "phases.cuh"}
    assert set(nvrtc.include_closure("norms.cuh", kernels)) == {
        "norms.cuh", "ieee.cuh", "reduce.cuh", "row_access.cuh", "welford.cuh", "aicg_types.cuh", "phases.cuh"}
    closure = nvrtc.include_closure("row_reduce.cuh", kernels)
    assert set(closure) == {"row_reduce.cuh", "reduce.cuh", "row_access.cuh", "aicg_types.cuh", "phases.cuh"}
    assert all(closure[name] == (kernels / name).read_bytes() for name in closure)


def test_include_closure_on_a_cycle_and_comments(tmp_path):
    (tmp_path / "a.cuh").write_text('#include "b.cuh"\n// #include "commented.cuh"\n#include <system.h>\n')
    (tmp_path / "b.cuh").write_text('  #  include "c.cuh"\n')
    (tmp_path / "c.cuh").write_text('#include "a.cuh"\n')
    assert list(nvrtc.include_closure("a.cuh", tmp_path)) == ["a.cuh", "b.cuh", "c.cuh"]
    (tmp_path / "c.cuh").write_text('#include "missing.cuh"\n')
    with pytest.raises(CompileError, match="missing.cuh"):
        nvrtc.include_closure("a.cuh", tmp_path)


def test_compiling_twice_gives_identical_artifacts(shipped_ruleset, kernels):
    family = shipped_ruleset.families["layernorm_welford"]
    src = codegen.source("det", family, "bfloat16", PARAMS)
    headers = nvrtc.include_closure(family.header, kernels)
    before = nvrtc.compilations
    first = nvrtc.compile_cubin(src, "det.cu", headers, "sm_90")
    nvrtc.compile_cubin(codegen.source("other", shipped_ruleset.families["row_sum_tree"], "float32", PARAMS),
                        "other.cu", nvrtc.include_closure("row_reduce.cuh", kernels), "sm_90")
    second = nvrtc.compile_cubin(src, "det.cu", headers, "sm_90")
    assert nvrtc.compilations == before + 3
    assert first[0] == second[0]            # byte-identical cubin
    assert first[1] == second[1] and first[2] == second[2]
    assert "Compile time" not in first[2]


def test_parse_report_reads_ptxas_lines():
    log = ("ptxas info    : Function properties for aicg_kernel\n"
           "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 136 bytes smem, 400 bytes cmem[0]\n")
    assert nvrtc.parse_report(log) == {"reported": True, "registers": 40, "shared_bytes": 136, "stack_bytes": 24,
                                       "spill_store_bytes": 8, "spill_load_bytes": 12, "barriers": 1}


def test_a_log_without_a_ptxas_report_says_so():
    # what NVRTC returns for a program it found in its cache
    assert nvrtc.parse_report("")["reported"] is False


def test_an_empty_log_leaves_the_interpreters_one_byte_bytes_alone():
    # without ptxas -v the log is one NUL: read into b" " * 1 it overwrote the shared b" "
    bindings = nvrtc.bindings()
    prog = nvrtc._check(bindings.nvrtcCreateProgram(b'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }',
                                                    b"k.cu", 0, [], []), "create program")
    try:
        (err,) = bindings.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
        assert err == bindings.nvrtcResult.NVRTC_SUCCESS
        assert nvrtc._check(bindings.nvrtcGetProgramLogSize(prog), "log size") == 1
        assert nvrtc._program_log(prog) == ""
    finally:
        bindings.nvrtcDestroyProgram(prog)
    assert bytes([32])[0] == 32 and bytes([0])[0] == 0


def test_nvrtc_first_runs_with_its_cache_off_and_the_switch_is_given_back(monkeypatch, shipped_ruleset, kernels):
    seen, module = [], nvrtc.bindings()
    real = module.nvrtcCompileProgram

    def compiling(*args):
        seen.append(os.environ.get("CUDA_CACHE_DISABLE"))
        return real(*args)
    monkeypatch.setattr(module, "nvrtcCompileProgram", compiling)
    # as in a process that has not called NVRTC yet, where the user had set the switch to 0
    monkeypatch.setattr(nvrtc, "_started", False)
    monkeypatch.setattr(nvrtc, "_switch_before", None)
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "0")
    for name in ("one.cu", "two.cu"):
        report = nvrtc.compile_cubin(codegen.source("k", shipped_ruleset.families["row_sum_tree"], "float32", PARAMS),
                                     name, nvrtc.include_closure("row_reduce.cuh", kernels), "sm_90")[1]
        assert report["reported"] and report["registers"] > 0
    assert seen == ["1", "0"] and os.environ["CUDA_CACHE_DISABLE"] == "0"


@pytest.mark.parametrize("topology, threads, per_block", [("warp", 128, 4), ("warp", 1024, 32), ("block", 256, 1),
                                                        ("block_staged", 512, 1), ("thread", 128, 128),
                                                        ("thread_rows8", 256, 2048)])
@pytest.mark.parametrize("rows", [1, 3, 4, 32, 1000, 4097])
def test_launch_geometry_covers_every_row_once(topology, threads, per_block, rows):
    blocks, block_threads = codegen.launch_geometry({"threads": threads, "topology": topology, "vec_bytes": 16},
                                                    rows, 4096, 2)
    assert block_threads == threads
    assert (blocks - 1) * per_block < rows <= blocks * per_block


@pytest.mark.parametrize("rows, cols, vec_bytes, dtype_size", [(1, 65536, 16, 2), (4194304, 1, 16, 2), (3, 33, 4, 4),
                                                               (1, 1, 16, 4), (1000, 1000, 16, 4)])
def test_a_flat_launch_gives_a_thread_to_each_pack_of_the_matrix(rows, cols, vec_bytes, dtype_size):
    blocks, threads = codegen.launch_geometry({"threads": 256, "topology": "flat", "vec_bytes": vec_bytes},
                                              rows, cols, dtype_size)
    packs = -(-rows * cols // (vec_bytes // dtype_size))
    assert threads == 256 and (blocks - 1) * 256 < packs <= blocks * 256


@pytest.mark.parametrize("topology, cols, expected", [("block_staged", 32768, 65536), ("block_staged", 116224, 232448),
                                                     ("block_staged", 116232, 0), ("block_staged", 32767, 0),
                                                     ("block_prefetch", 32768, 65536), ("block_prefetch", 116232, 0),
                                                     ("block_prefetch", 32767, 0), ("block", 32768, 0)])
def test_a_staged_launch_asks_for_its_row_of_shared_memory_where_the_kernel_may_have_it(topology, cols, expected):
    kernel = types.SimpleNamespace(shared_bytes_limit=232448)   # the H200's opt-in limit, 227 KiB
    assert codegen.shared_bytes(kernel, {"topology": topology, "vec_bytes": 16}, cols, 2) == expected


@pytest.mark.parametrize("rows, resident, blocks", [(1, 132, 1), (131, 132, 131), (132, 132, 132),
                                                    (4097, 132, 132), (4097, 528, 528)])
def test_a_prefetching_launch_is_one_wave_of_resident_blocks(rows, resident, blocks):
    kernel = types.SimpleNamespace(shared_bytes_limit=232448, asked=[],
                                   resident_blocks=lambda threads, shared: kernel.asked.append((threads, shared))
                                   or resident)
    params = {"threads": 1024, "topology": "block_prefetch", "vec_bytes": 16}
    # the occupancy asked for is that of the launch itself: its threads and its row of shared memory
    assert codegen.launch_of(kernel, params, rows, 32768, 4) == (blocks, 1024, 131072)
    assert kernel.asked == [(1024, 131072)]
    assert codegen.launch_of(kernel, params, rows, 32767, 4) == (blocks, 1024, 0)
    with pytest.raises(ValueError, match="blocks the GPU holds at once"):
        codegen.launch_geometry(params, rows, 32768, 4)


def test_every_family_compiles_with_every_parameter_set_the_h200_can_run(repo, shipped_ruleset):
    """All realisations of every family, in every dtype (the lab's set, float16 added), for sm_90."""
    from aicg.primitives import lab
    target = hw.load_target(repo / "hwdb", "nvidia-h200")
    configs = lab.configurations(shipped_ruleset, plan_inputs.values(plan_inputs.resolve(target)),
                                 ("float32", "bfloat16", "float16"))
    assert {c.family for c in configs} == set(shipped_ruleset.families)
    cubins = lab.compile_all(configs, shipped_ruleset, repo / "kernels", "sm_90", target.fact("registers_per_sm"))
    assert set(cubins) == {c.id for c in configs}
    assert all(cubin[:4] == b"\x7fELF" for cubin in cubins.values())


def test_the_lab_takes_a_cubin_it_compiled_before_from_the_store_and_compiles_a_damaged_one_again(
        repo, shipped_ruleset, tmp_path, monkeypatch):
    from aicg import cas
    from aicg.primitives import lab
    target = hw.load_target(repo / "hwdb", "nvidia-h200")
    configs = lab.configurations(shipped_ruleset, plan_inputs.values(plan_inputs.resolve(target)))[:3]
    store = cas.Store(tmp_path / "cache")
    registers = target.fact("registers_per_sm")
    first = lab.compile_all(configs, shipped_ruleset, repo / "kernels", "sm_90", registers, 2, store)

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")
    monkeypatch.setattr(lab, "ProcessPoolExecutor", no_compiler)
    assert lab.compile_all(configs, shipped_ruleset, repo / "kernels", "sm_90", registers, 2, store) == first

    blob = next((tmp_path / "cache" / "objects").glob("*/*"))
    blob.write_bytes(b"damaged")
    monkeypatch.undo()
    assert lab.compile_all(configs, shipped_ruleset, repo / "kernels", "sm_90", registers, 2, store) == first


def test_a_compile_that_comes_back_without_a_report_is_compiled_again_uncached(monkeypatch):
    """NVRTC's cache, set up on by another library first, returns a program without ptxas' report:
    the second compile differs by a comment only, so the cache misses and the code is the same."""
    sources = []
    real = nvrtc._compile_once

    def cached_first(source, name, headers, arch, header_dir):
        sources.append(source)
        cubin, report, log = real(source, name, headers, arch, header_dir)
        return (cubin, {**report, "reported": False}, "") if len(sources) == 1 else (cubin, report, log)

    monkeypatch.setattr(nvrtc, "_compile_once", cached_first)
    source = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'
    cubin, report, _ = nvrtc.compile_cubin(source, "twice.cu", {}, "sm_90")
    assert report["reported"] and report["registers"] > 0
    assert len(sources) == 2 and sources[1].startswith(source) and sources[1] != source
    assert cubin == real(source, "twice.cu", {}, "sm_90", "kernels")[0]


def test_nvrtc_warms_up_once_a_process_on_a_thread_and_uncounted(monkeypatch):
    """A JIT's instance pays NVRTC's first-compile start ahead (aicg/runtime/instance.py)."""
    monkeypatch.setattr(nvrtc, "_warming", None)
    before = nvrtc.compilations
    nvrtc.warm_up_in_background()
    first = nvrtc._warming
    nvrtc.warm_up_in_background()
    assert first is not None and nvrtc._warming is first
    first.join(120)
    assert not first.is_alive() and nvrtc.compilations == before
    cubin, report, _ = nvrtc._compile_once(nvrtc.WARM_UP_SOURCE, "w.cu", {}, "sm_80", "kernels", counted=False)
    assert cubin and report["reported"] and nvrtc.compilations == before
