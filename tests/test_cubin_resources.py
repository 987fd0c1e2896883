"""A cubin's own record of its entries' registers and stack frames (aicg/cubin_resources.py), held to
ptxas' report of the same compile; and the backward build taking it where ptxas' log is silent on an
entry, as it is when the driver's compute cache served that entry. CPU only."""
from __future__ import annotations

import re

import pytest

from aicg import cubin_resources, nvrtc
from aicg.backward import build, codegen, space

SPACE = space.shipped()

SPILLS_AND_STACK = r'''
extern "C" __global__ void __launch_bounds__(1024, 2) spills(float* out, const float* in, int n) {
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = in[threadIdx.x + i * n];
  float s = 0;
#pragma unroll
  for (int j = 0; j < 64; ++j)
#pragma unroll
    for (int i = 0; i < 64; ++i) s += v[i] * v[(i * 7 + j) % 64];
  out[threadIdx.x] = s;
}
extern "C" __global__ void stack(float* out, int k) {
  float a[100];
  for (int i = 0; i < 100; ++i) a[i] = i * out[i];
  out[0] = a[k];
}
extern "C" __global__ void plain(float* out) { out[threadIdx.x] += 1.0f; }
'''


def _norm_two_pass():
    """A bfloat16 rmsnorm backward in two passes: three entries in one program."""
    family = SPACE.families["rmsnorm_backward_rows"]
    columns = SPACE.families["column_sum_two_pass"]
    return space.Candidate(family.op, "bfloat16", family.name, dict(family.ladder[0].params), columns.name,
                           dict(columns.ladder[0].params), False)


def test_registers_and_frames_match_ptxas():
    cubin, _, log = nvrtc.compile_cubin(SPILLS_AND_STACK, "resources.cu", {}, "sm_90")
    found = cubin_resources.entry_resources(cubin)
    reported = {m.group(1): m for m in re.finditer(
        r"Function properties for (\w+)\n.*?(\d+) bytes stack frame.*?Used (\d+) registers", log, re.S)}
    assert set(found) == set(reported) == {"spills", "stack", "plain"}
    for name, m in reported.items():
        assert found[name] == {"registers": int(m.group(3)), "stack_bytes": int(m.group(2))}, name
    assert found["spills"]["stack_bytes"] > 0 and found["stack"]["stack_bytes"] >= 400 and found["plain"]["stack_bytes"] == 0


def test_what_is_not_a_cubin_is_refused():
    with pytest.raises(cubin_resources.NotACubin):
        cubin_resources.entry_resources(b"not an ELF image at all")
    cubin, _, _ = nvrtc.compile_cubin(SPILLS_AND_STACK, "resources.cu", {}, "sm_90")
    with pytest.raises(cubin_resources.NotACubin):
        cubin_resources.entry_resources(cubin[:len(cubin) // 3])


def _silent_on(log: str, entries: set[str]) -> str:
    """ptxas' log with nothing said of `entries`, as when the compute cache served them."""
    parts = re.split(r"(?=ptxas info    : Compiling entry function ')", log)
    return "".join(p for p in parts if not any(f"'{e}'" in p for e in entries))


def test_the_backward_build_reads_an_entry_ptxas_did_not_report_from_the_cubin(monkeypatch):
    candidate = _norm_two_pass()
    entries = set(codegen.entries(candidate))
    assert len(entries) == 3
    cubin, reports, log = build.compile_candidate(SPACE, candidate, "sm_90")
    assert not build.unhealthy(candidate, reports)
    columns = {e for e in entries if "column" in e}
    silent = _silent_on(log, columns)
    without = " ".join(build.unhealthy(candidate, build.entry_reports(silent)))
    assert all(f"{e}: ptxas gave no resource report" in without for e in columns)
    filled = build.entry_reports(silent, cubin)
    assert not build.unhealthy(candidate, filled)
    for e in columns:
        assert filled[e]["from_cubin"] and filled[e]["registers"] == reports[e]["registers"]
    # through the compile itself: NVRTC's log silent on the column entries
    real = nvrtc.compile_cubin

    def compile_served_from_cache(*args, **kwargs):
        cubin, report, log = real(*args, **kwargs)
        return cubin, report, _silent_on(log, columns)
    monkeypatch.setattr(nvrtc, "compile_cubin", compile_served_from_cache)
    again, again_reports, _ = build.compile_candidate(SPACE, candidate, "sm_90")
    assert again == cubin and not build.unhealthy(candidate, again_reports)


def test_a_frame_only_the_cubin_reports_is_not_taken_for_a_healthy_entry():
    candidate = _norm_two_pass()
    rows = next(e for e in codegen.entries(candidate) if "rows" in e)
    reports = {e: {**nvrtc.parse_report(""), "reported": True, "registers": 40} for e in codegen.entries(candidate)}
    reports[rows].update(stack_bytes=64, from_cubin=True)
    assert build.may_spill(candidate, reports)
    assert any("64 bytes" in why and "does not say" in why for why in build.unhealthy(candidate, reports))
