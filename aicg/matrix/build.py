"""Compiling a matrix realisation with NVRTC (aicg/nvrtc.py), and what ptxas made of it.

The target is the GPU's own (`sm_90a` on compute capability 9.0: wgmma and
setmaxnreg exist only there, and the other templates are built for it too so
that one compile key covers a Hopper instance; `sm_XY` elsewhere). The
report is ptxas's (registers, spills, stack) plus the warnings that mean a
kernel will not run as written: setmaxnreg ignored, wgmma serialized.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .. import cli_layout, nvrtc
from . import codegen
from .space import Realisation, templates
from .templates import RULES

KERNELS_DIR = cli_layout.shipped("kernels")   # the checkout's, or the installed package's
# ptxas warnings that void a realisation's design (each one seen in NVIDIA's toolchain docs and forums):
# setmaxnreg ignored for want of a register cap (C7508), wgmma serialized (C7510 and its kin).
FATAL_WARNINGS = (re.compile(r"setmaxnreg.*ignored", re.I), re.compile(r"wgmma.*serializ", re.I))


@dataclass(frozen=True)
class Built:
    realisation: Realisation
    arch: str
    source: str
    cubin: bytes
    report: dict      # nvrtc.parse_report's, plus `warnings`: ptxas lines that void the design
    log: str


def arch_for(real: Realisation, compute_capability: tuple[int, int]) -> str:
    return RULES[real.template].arch(tuple(compute_capability))


def headers(real: Realisation, kernels_dir: Path = KERNELS_DIR) -> dict[str, bytes]:
    return nvrtc.include_closure(templates()[real.template].header, kernels_dir)


def compile_realisation(real: Realisation, arch: str, kernels_dir: Path = KERNELS_DIR) -> Built:
    """NVRTC's cubin and report for `real` on `arch`; CompileError (with the log, pointing at the
    header's lines) if it does not compile."""
    return compile_source(real, codegen.source(real), f"{real.name}.cu", headers(real, kernels_dir), arch)


def compile_source(real: Realisation, src: str, source_name: str, included: dict[str, bytes], arch: str) -> Built:
    """As compile_realisation, for codegen's source of `real` and the headers it includes, as given."""
    cubin, report, log = nvrtc.compile_cubin(src, source_name, included, arch)
    report = dict(report, warnings=[line for line in log.splitlines() if any(w.search(line) for w in FATAL_WARNINGS)])
    return Built(real, arch, src, cubin, report, log)


def healthy(built: Built) -> list[str]:
    """What in ptxas's report rules the build out: no report, spills, a stack frame, fatal warnings."""
    return report_problems(built.report)


def report_problems(report: dict) -> list[str]:
    """healthy()'s verdict on a report as compile_source made it."""
    r, found = report, []
    if not r["reported"]:
        found.append("ptxas gave no resource report")
    if r["spill_store_bytes"] or r["spill_load_bytes"]:
        found.append(f"spills ({r['spill_store_bytes']} bytes stored, {r['spill_load_bytes']} loaded)")
    if r["stack_bytes"]:
        found.append(f"a stack frame of {r['stack_bytes']} bytes")
    found += r["warnings"]
    return found
