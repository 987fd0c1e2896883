"""Compiling a backward candidate with NVRTC, and what ptxas made of each of its entries.

One program holds every entry of a candidate (aicg/backward/codegen.py), so ptxas reports each
in turn; the report is split per entry. With a bare `__launch_bounds__(threads)`, ptxas picks a
register budget for occupancy and, for a few held rows, spills to keep it (layernorm float32 t256
c4: 64 registers, 24 bytes spilled; asked for one block, 95 and none). So where the plain build
spills, a second asks for one resident block (`__launch_bounds__(threads, 1)`: the whole budget)
and is kept where it does not. A candidate whose report is missing, or where an entry still spills
or needs a stack frame, is not used: nothing has measured what the spill would cost.

Where ptxas' log says nothing of an entry (the driver's compute cache served it: see
aicg/cubin_resources.py), its registers and stack frame come from the cubin instead; a frame there
may hold spills, so it also asks for the one-block build.
"""
from __future__ import annotations

import re
from pathlib import Path

from .. import cubin_resources, digest, nvrtc
from . import codegen
from .space import Candidate, Space

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
POLICY = ("one resident block where the plain build spills; "   # part of the compile key
          "an entry ptxas does not report, from the cubin")


def entry_reports(log: str, cubin: bytes = b"") -> dict[str, dict]:
    """nvrtc.parse_report of each entry's part of ptxas's log; an entry the log does not report,
    from the cubin (registers and stack frame; `from_cubin`), where the cubin lists it."""
    marks = list(_ENTRY.finditer(log))
    reports = {m.group(1): nvrtc.parse_report(log[m.start():marks[i + 1].start() if i + 1 < len(marks) else len(log)])
               for i, m in enumerate(marks)}
    for entry, found in (cubin_resources.entry_resources(cubin) if cubin else {}).items():
        if entry.startswith("aicg_") and not reports.get(entry, {}).get("reported"):
            reports[entry] = {**nvrtc.parse_report(""), **found, "reported": True, "from_cubin": True}
    return reports


def unhealthy(candidate: Candidate, reports: dict[str, dict]) -> list[str]:
    """What rules a build out: an entry with no report, a spill, a stack frame."""
    found = []
    for entry in codegen.entries(candidate):
        r = reports.get(entry)
        if r is None or not r["reported"]:
            found.append(f"{entry}: ptxas gave no resource report")
        elif r["spill_store_bytes"] or r["spill_load_bytes"]:
            found.append(f"{entry}: spills ({r['spill_store_bytes']} bytes stored, {r['spill_load_bytes']} loaded)")
        elif r["stack_bytes"]:
            found.append(f"{entry}: a stack frame of {r['stack_bytes']} bytes"
                         + (" (spills or a stack: the cubin does not say which)" if r.get("from_cubin") else ""))
    return found


def may_spill(candidate: Candidate, reports: dict[str, dict]) -> bool:
    """Whether an entry spills, or has a frame the cubin alone reported (spills, perhaps)."""
    return any(r["spill_store_bytes"] or r["spill_load_bytes"] or (r.get("from_cubin") and r["stack_bytes"])
               for entry in codegen.entries(candidate) if (r := reports.get(entry)) and r["reported"])


def compile_key(space: Space, candidate: Candidate, arch: str, kernels_dir: Path = codegen.KERNELS_DIR) -> str:
    """What decides the cubin (aicg/nvrtc.py): the source, the headers' bytes, the target and toolchain."""
    headers = codegen.headers(space, candidate, kernels_dir)
    return digest.of_value({"compile": nvrtc.compile_key(codegen.source(space, candidate),
                                                         {name: digest.of_bytes(data) for name, data in headers.items()},
                                                         arch),
                            "policy": POLICY})


def one_block_bounds(source: str) -> str:
    """`source` with every entry's launch bound asking for one resident block of its threads."""
    return re.sub(r"__launch_bounds__\((\d+)\)", r"__launch_bounds__(\1, 1)", source)


def program(space: Space, candidate: Candidate, arch: str,
            kernels_dir: Path = codegen.KERNELS_DIR) -> tuple[str, str, dict[str, bytes], str]:
    """(source, source name, headers, arch) of the candidate's plain build, as NVRTC takes them."""
    return (codegen.source(space, candidate), f"backward/{candidate.id}.cu", codegen.headers(space, candidate, kernels_dir),
            arch)


def compile_candidate(space: Space, candidate: Candidate, arch: str,
                      kernels_dir: Path = codegen.KERNELS_DIR) -> tuple[bytes, dict[str, dict], str]:
    """(cubin, ptxas's report per entry, log); CompileError naming the header's file and line. The
    reports say `one_block: True` where the kept build is the one asking for one resident block."""
    source, name, headers, _ = program(space, candidate, arch, kernels_dir)
    cubin, _, log = nvrtc.compile_cubin(source, name, headers, arch)
    reports = entry_reports(log, cubin)
    if may_spill(candidate, reports):
        bounded, _, bounded_log = nvrtc.compile_cubin(one_block_bounds(source), name, headers, arch)
        bounded_reports = entry_reports(bounded_log, bounded)
        if not unhealthy(candidate, bounded_reports):
            return bounded, {e: {**r, "one_block": True} for e, r in bounded_reports.items()}, bounded_log
    return cubin, {e: {**r, "one_block": False} for e, r in reports.items()}, log
