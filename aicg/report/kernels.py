"""Each packaged kernel's figures, as the build measured them: its time at each workload shape,
the bandwidth that is and its share of the copy ceiling, and the candidates it was chosen over.

Times are the validation's medians (validation/<candidate>.json, the same the manifest and
select/<op>.json hold); bytes are what the validation counted a launch to move at the least (each
input read once, the output written once: aicg/validate/check.py moved_bytes); the ceiling is the
target's copy bandwidth as the build's hw step resolved it (measured where the hwdb entry has it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .instance import Instance

CEILING_FACT = "dram_copy_bandwidth"


@dataclass(frozen=True)
class Ceiling:
    bytes_per_second: float
    fact: str
    source: str          # "measured" or "datasheet"

    def describe(self) -> str:
        return f"{self.bytes_per_second / 1e12:.2f} TB/s ({self.fact}, {self.source})"


@dataclass(frozen=True)
class ShapeTime:
    rows: int
    cols: int
    candidate: str | None          # the kernel that runs at this shape (dispatch), None where none was timed
    seconds: float | None
    bytes: int | None
    share: float | None            # of the ceiling

    @property
    def bytes_per_second(self) -> float | None:
        return self.bytes / self.seconds if self.bytes and self.seconds else None


@dataclass(frozen=True)
class CandidateRow:
    id: str
    family: str
    status: str
    reason: str | None
    seconds: float | None          # geometric mean over the shapes it was timed at
    times: dict                    # (rows, cols) -> seconds
    chosen: bool


@dataclass(frozen=True)
class KernelFigures:
    name: str
    op: str
    dtype: str
    entry: dict                    # the manifest's
    shapes: list[ShapeTime]
    candidates: list[CandidateRow]

    @property
    def valid(self) -> list[CandidateRow]:
        return [c for c in self.candidates if c.status == "passed" and c.seconds]

    @property
    def largest(self) -> ShapeTime | None:
        timed = [s for s in self.shapes if s.seconds]
        return max(timed, key=lambda s: (s.bytes or 0, s.rows * s.cols)) if timed else None


def ceiling(instance: Instance) -> Ceiling | None:
    fact = instance.fact(CEILING_FACT)
    if not fact:
        return None
    return Ceiling(float(fact["value"]), CEILING_FACT, fact.get("source", "datasheet"))


def _timing(instance: Instance, candidate: str, rows: int, cols: int) -> dict | None:
    for t in (instance.validations.get(candidate) or {}).get("timings") or []:
        if tuple(t["shape"]) == (rows, cols):
            return t
    return None


def figures(instance: Instance, name: str) -> KernelFigures:
    entry = instance.manifest["kernels"][name]
    op, dtype = entry["op"], entry["dtype"]
    top = ceiling(instance)
    dispatch = {(d["rows"], d["cols"]): d for d in entry.get("dispatch") or []}
    shapes = []
    for rows, cols in instance.manifest["workload"][op]["shapes"]:
        runs = dispatch.get((rows, cols))
        timing = _timing(instance, runs["candidate"], rows, cols) if runs else None
        seconds = runs["measured_seconds"] if runs else None
        moved = timing["bytes"] if timing else None
        share = moved / seconds / top.bytes_per_second if top and moved and seconds else None
        shapes.append(ShapeTime(rows, cols, runs["candidate"] if runs else None, seconds, moved, share))
    pick = instance.selections[op]["dtypes"][dtype]
    candidates = []
    for c in pick["candidates"]:
        times = {(r, k): s for r, k, s in c.get("timings") or []}
        candidates.append(CandidateRow(c["id"], c["family"], c["status"], c.get("reason"), c.get("measured_seconds"),
                                       times, c["id"] == entry["candidate"]))
    # a candidate timed at fewer shapes serves only the rows its order keeps the bound on: its mean
    # is over those, so it ranks after those timed everywhere
    candidates.sort(key=lambda c: (not c.chosen, -len(c.times), c.seconds is None, c.seconds or math.inf, c.id))
    return KernelFigures(name, op, dtype, entry, shapes, candidates)


def all_figures(instance: Instance) -> list[KernelFigures]:
    return [figures(instance, name) for name in sorted(instance.manifest["kernels"])]
