"""Proposals, the skeleton a source proposal fills, and the checks before compiling.

A source proposal supplies only the body of the fixed entry point
`aicg_kernel` (signature from aicg/ops.py) and may use the primitive headers.
It is rejected, with the reason, when it declares an unknown or illegal
rule, when its source reveals a rule it did not declare (each rule's
`detect` patterns in rulesets/rules.toml), or when it reaches outside
device code.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .. import codegen
from ..dtypes import DTYPES
from ..ops import OPERATORS
from ..semantics.legality import Preservation, RuleChoice, decide_rule
from ..semantics.ruleset import RuleSet

SKELETON_HEADERS = ("aicg_types.cuh", "reduce.cuh", "row_access.cuh", "online_softmax.cuh", "welford.cuh")
# A skeleton's entry is launched without a cluster, so a body splits a row within one block at most,
# and its body serves the one row RowGroup::row() names.
TOPOLOGIES = tuple(t for t in codegen.TOPOLOGIES
                   if codegen.blocks_per_row(t) == 1 and codegen.rows_per_thread(t) == 1)

# What a body may not contain: it is device code inside a fixed entry point.
FORBIDDEN = {
    r"#\s*include": "an #include (the skeleton provides the headers)",
    r"<<<": "a kernel launch from device code",
    r"\bcuda[A-Z]\w*\s*\(": "a CUDA runtime call",
    r"__host__|__global__": "a host function or another entry point",
    r"\basm\b": "inline assembly (its effect cannot be checked)",
    r"#\s*line": "a #line directive",
    # map_row and store read every pointer they are given: an absent w or b is the literal nullptr
    r"\(\s*(?:const\s+)?[\w:]+\s*\*\s*\)\s*(?:nullptr|NULL|0)\b":
        "a null pointer cast to a pointer type (an absent w or b is the literal nullptr; a pointer is read)",
}


@dataclass(frozen=True)
class Proposal:
    proposer: str
    kind: str                          # "family" or "source"
    declares: tuple[str, ...]
    params: dict                       # threads, topology (and vec_bytes, fast_exp for a family)
    family: str | None = None
    body: str | None = None
    note: str = ""
    candidate: str | None = None       # the planner's candidate a family proposal is

    def as_record(self) -> dict:
        return {"proposer": self.proposer, "kind": self.kind, "declares": list(self.declares),
                "params": self.params, "family": self.family, "body": self.body, "note": self.note,
                "candidate": self.candidate}


@dataclass(frozen=True)
class Request:
    """What a proposer is asked: one operator in one dtype, with the history so far."""
    op: str
    dtype: str
    round: int
    legal_rules: tuple[str, ...]
    trajectory: tuple = field(default=())     # earlier rounds' records, oldest first


def check(p: Proposal, op: str, dtype: str, ruleset: RuleSet, pres: Preservation, choice: RuleChoice) -> list[str]:
    """Why the proposal may not be compiled; empty if it may."""
    reasons = []
    if p.params.get("topology") not in TOPOLOGIES:
        reasons.append(f"topology must be one of {', '.join(TOPOLOGIES)}, not {p.params.get('topology')!r}")
    threads = p.params.get("threads")
    if not isinstance(threads, int) or isinstance(threads, bool) or not 32 <= threads <= 1024 or threads % 32:
        reasons.append(f"threads must be a multiple of 32 from 32 to 1024, not {threads!r}")
    if p.kind == "family":
        if p.family not in ruleset.families or ruleset.families[p.family].op != op:
            reasons.append(f"{p.family!r} is not a family of {op}")
    elif p.kind == "source":
        for pattern, what in FORBIDDEN.items():
            if re.search(pattern, p.body or ""):
                reasons.append(f"the body contains {what}")
        for rule in ruleset.rules.values():
            hits = [pat for pat in rule.detect if re.search(pat, p.body or "")]
            if hits and rule.name not in p.declares:
                reasons.append(f"the body uses {rule.name} (it matches {hits[0]!r}) without declaring it")
    else:
        reasons.append(f"unknown proposal kind {p.kind!r}")
    for name in p.declares:
        if name not in ruleset.rules:
            reasons.append(f"declares {name!r}, which is not a rule")
            continue
        decision = decide_rule(ruleset.rules[name], ruleset.ops[op], dtype, ruleset, pres, choice)
        if not decision.legal:
            reasons.append(f"declares {name}, which is not legal here: " + "; ".join(f.text() for f in decision.blocking()))
    return reasons


def render(p: Proposal, op: str, dtype: str, ruleset: RuleSet, label: str) -> tuple[str, str]:
    """(source, main header) of the proposal: a family's generated source, or the skeleton filled."""
    if p.kind == "family":
        family = ruleset.families[p.family]
        return codegen.source(label, family, dtype, p.params), family.header
    dt, operator = DTYPES[dtype], OPERATORS[op]
    includes = "".join(f'#include "{h}"\n' for h in SKELETON_HEADERS)
    signature = ",\n    ".join(operator.kernel_params("T"))
    source = (f"// aicg skeleton: {op} in {dtype}, {label}, proposed by {p.proposer}\n"
              f"// declares: {', '.join(p.declares) or 'nothing'}\n"
              f"{includes}\nusing T = {dt.ctype};\nconstexpr int THREADS = {p.params['threads']};\n"
              f"constexpr int TOPOLOGY = {codegen.TOPOLOGIES[p.params['topology']]};\n\n"
              f'extern "C" __global__ void __launch_bounds__({p.params["threads"]})\n'
              f"{codegen.ENTRY}(\n    {signature}) {{\n"
              f'#line 1 "proposal"\n{p.body}\n}}\n')
    return source, SKELETON_HEADERS[-1]


def headers_for(p: Proposal, main_header: str) -> tuple[str, ...]:
    return (main_header,) if p.kind == "family" else SKELETON_HEADERS
