"""The recorded benchmark runs of docs/bench/, read as cases against their peers.

Two kinds of run are recorded: the memory-bound benchmark of the row operators
(tests/bench/test_memory_bound.py: `rows`, each timed beside PyTorch eager,
torch.compile, Triton and a copy of the same bytes) and the matrix-multiply
benchmark (tests/bench/matmul_bench.py: `table`, each case beside cuBLAS or
eager PyTorch). "The latest" row-operator figures are every run of the latest
date, each case taken from the last run of that day that holds it (runs sort
by date, then by name, numbers as numbers: acceptance-21 after
acceptance-20-norms). The matrix benchmark's stages and cases are often run
apart, a few at a time, on different days: each of its cases comes from the
last run that holds it, whatever its date.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

ROWS, MATRIX, OTHER = "rows", "matrix", "other"
PEERS = ("eager", "compile", "triton")
PEER_NAMES = {"aicg": "aicg", "eager": "PyTorch eager", "compile": "torch.compile", "triton": "Triton",
              "copy": "copy of the same bytes"}
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Run:
    path: Path
    date: str
    device: str
    kind: str
    data: dict

    @property
    def name(self) -> str:
        return self.path.name


def _natural(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def read(path: Path) -> Run:
    """One recorded run; an unreadable one is an InputError naming the file and what is missing."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(path, "(file)", "a recorded benchmark run as JSON", str(err)) from None
    if not isinstance(data, dict):
        raise InputError(path, "(file)", "a JSON object", type(data).__name__)
    # other records (a check of the L2 flush, say) are kept beside the runs and read by their own scripts
    kind = ROWS if "rows" in data else MATRIX if "table" in data else OTHER
    if kind == MATRIX and (data.get("args") or {}).get("flush") == "write":
        kind = OTHER    # a matrix run under the memset flush, kept to compare the flushes, not a current figure
    if kind == MATRIX and data.get("exploration"):
        kind = OTHER    # a run that timed some settings to learn about them, not the best the bench knows
    device = data.get("device")
    device = device.get("name") if isinstance(device, dict) else device
    if not isinstance(device, str):
        raise InputError(path, "device", "the name of the GPU it ran on", device)
    date = data.get("date") or (DATE.match(Path(path).name) or [None])[0]
    if not isinstance(date, str) or not DATE.fullmatch(date):
        raise InputError(path, "date", "a date YYYY-MM-DD (in the run, or as its file name's start)", date)
    return Run(Path(path), date, device, kind, data)


def runs(bench_dir: Path) -> list[Run]:
    return sorted((read(p) for p in Path(bench_dir).glob("*.json")), key=lambda r: (r.date, _natural(r.name)))


def latest(all_runs: list[Run], kind: str, device: str | None = None) -> list[Run]:
    """The runs of `kind` (on `device`, if given) that hold its current figures, oldest first: for the
    row operators every run of the latest date; for the matrix benchmark every run that is the last
    to hold one of its cases (see matrix_cases)."""
    mine = [r for r in all_runs if r.kind == kind and (device is None or r.device == device)]
    if not mine:
        return []
    if kind != MATRIX:
        last = max(r.date for r in mine)
        return [r for r in mine if r.date == last]
    current = {case["run"] for case in matrix_cases(mine)}
    return [r for r in mine if r.name in current]


def row_cases(day: list[Run], suite: str | None = "acceptance") -> list[dict]:
    """The memory-bound cases of a day's runs (of `suite`), each from the last run holding it."""
    cases = {}
    for run in day:
        for row in run.data["rows"]:
            if suite is None or row.get("suite") == suite:
                cases[(row["suite"], row["op"], row["dtype"], tuple(row["shape"]))] = {**row, "run": run.name}
    return [cases[k] for k in sorted(cases)]


def stage_dates(day: list[Run]) -> dict[str, list[str]]:
    """stage -> the dates, oldest first, of the runs holding its current cases."""
    dates: dict[str, set[str]] = {}
    by_name = {run.name: run for run in day}
    for case in matrix_cases(day):
        dates.setdefault(case["stage"], set()).add(by_name[case["run"]].date)
    return {stage: sorted(found) for stage, found in dates.items()}


def stage_runs(day: list[Run], stage: str) -> list[Run]:
    """The runs of `day` holding current cases of `stage`, oldest first."""
    holding = {case["run"] for case in matrix_cases(day) if case["stage"] == stage}
    return [r for r in day if r.name in holding]


def matrix_cases(day: list[Run]) -> list[dict]:
    """The matrix-multiply cases of the runs, each (stage, problem, peer) from the last run holding it
    (runs in date and name order): a case measured again replaces its earlier figure, and a run of a
    few cases leaves the stage's others as they were."""
    cases = {}
    for run in sorted(day, key=lambda r: (r.date, _natural(r.name))):
        for row in run.data["table"]:
            cases[(row["stage"], row["problem"], row["peer"])] = {**row, "run": run.name}
    order = {"square": 0, "fused": 1, "grid": 2}
    return sorted(cases.values(), key=lambda c: (order.get(c["stage"], 3), _problem_key(c["problem"]), c["peer"]))


def _problem_key(problem: str) -> tuple:
    dims = problem.split()[0].split("x")
    return tuple(int(d) for d in dims if d.isdigit()), problem


def matrix_validations(day: list[Run]) -> dict[str, int]:
    """How the day's matrix kernels fared against float64: status -> count of cases."""
    counts: dict[str, int] = {}
    for run in day:
        for case in run.data.get("cases", []):
            status = (case.get("validation") or {}).get("status", "not validated")
            counts[status] = counts.get(status, 0) + 1
    return counts


def flops(problem: str) -> float:
    """2 M N K of a problem named "MxNxK dtype ...": the multiply-adds, counted twice."""
    m, n, k = (int(d) for d in problem.split()[0].split("x"))
    return 2.0 * m * n * k


def geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def tb_per_s(row: dict, who: str) -> float | None:
    seconds = row["seconds"].get(who)
    return row["bytes"] / seconds / 1e12 if seconds else None


def peer_ratio(row: dict, peer: str) -> float | None:
    """How many times longer the peer took than aicg (above 1: aicg is faster)."""
    return row.get("peer_over_aicg", {}).get(peer)
