"""Validating a planned matrix candidate on the target GPU, and timing it, for the build.

A candidate is checked (aicg/matrix/check.py: fresh inputs, poisoned
outputs, guard bytes, NaN row padding, repeated and fresh-input runs, a
float64 reference within the arithmetic's own bound) on

  awkward problems  a single tile, and shapes off every tile and vector size
                    with padded leading dimensions (those the template takes)
  workload shapes   each class shape it serves, tightly packed; there it is
                    also timed (aicg/matrix/timing.py: CUDA events, the L2 evicted by a read,
                    the median of the profile's timing repetitions)

in a worker process of its own (aicg/matrix/worker.py): a fault or a hang
fails the candidate with what happened, and the build goes on. The first
failing problem ends its validation. A realisation whose ptxas report voids
its design (spills, a stack frame, setmaxnreg ignored, wgmma serialized:
aicg/matrix/build.py) fails without running.

Without a GPU of the target's kind nothing runs and the outcome is
"unvalidated", which is not a fact and is never stored.
"""
from __future__ import annotations

from ..hw import Hardware
from ..runtime import driver
from . import build
from .problem import Problem
from .space import Realisation
from .templates import RULES

PROTOCOL = 1
# (m, n, k): one tile of each template; then M, N, K off every tile (64..256) and vector (8
# elements), K past one 64-wide slice and not a multiple of 8 (whose operands get padded rows),
# decode rows (M <= 16) among them
AWKWARD_SHAPES = ((128, 128, 64), (16, 128, 64), (1, 7, 64), (7, 129, 1000), (127, 1000, 129), (129, 127, 4097),
                  (1000, 1000, 1000), (4097, 264, 136), (1, 4097, 1000), (16, 1000, 4096), (3, 520, 8))
HANG_SECONDS = {"awkward": 10.0, "workload": 20.0}   # a launch not done by then is a hang
MAX_FAILURES_SHOWN = 1

_runner: list = []


def padded(n: int) -> int:
    return -(-n // 8) * 8


def awkward_problem(real: Realisation, m: int, n: int, k: int) -> Problem:
    """`real`'s layouts and epilogue at (m, n, k), every leading dimension padded to whole 16-byte
    vectors, A's by one vector more where it was whole (so padding is always there to be misread)."""
    base = Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue)
    lda = padded(base.a_stored[1]) + (8 if base.a_stored[1] % 8 == 0 else 0)
    return Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue, lda=lda,
                   ldb=padded(base.b_stored[1]), ldc=n + 3, ldr=n + 5)


def awkward_problems(real: Realisation) -> list[Problem]:
    found = [awkward_problem(real, *shape) for shape in AWKWARD_SHAPES]
    return [p for p in found if RULES[real.template].unsupported(real, p) is None]


def workload_problems(real: Realisation, shapes) -> list[Problem]:
    return [Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue) for m, n, k in shapes]


def not_the_target(device, hardware: Hardware) -> str | None:
    """Why this machine's GPU cannot stand for the target; None where it can."""
    if device is None:
        return "no GPU on this machine"
    if device.name != hardware.name or tuple(device.compute_capability) != tuple(hardware.compute_capability):
        return (f"this machine's GPU is {device.name} (compute capability {tuple(device.compute_capability)}), "
                f"not the target {hardware.name}")
    return None


def _worker():
    if not _runner:
        from .worker import Runner
        _runner.append(Runner())
    return _runner[0]


def _summary(problem: Problem, out: dict) -> dict:
    """One problem's verdict, as the build keeps it: what failed and where, not every row checked."""
    v = out.get("validation") or {}
    checks = v.get("checks") or []
    found = {"problem": problem.name, "shape": [problem.m, problem.n, problem.k],
             "passed": v.get("status") == "passed" and bool(checks),
             "worst_error_over_bound": max((c.get("worst_error_over_bound", 0.0) for c in checks), default=None),
             "splits": v.get("splits")}
    for key in ("fault", "error"):
        if out.get(key) or v.get(key):
            found[key] = out.get(key) or v.get(key)
    failed = [c for c in checks if not c.get("passed")][:MAX_FAILURES_SHOWN]
    if failed:
        found["failed_check"] = failed[0]
    return found


def why_failed(summary: dict) -> str:
    if summary.get("fault"):
        return f"{summary['problem']}: the kernel faulted ({summary['fault']})"
    if summary.get("error"):
        return f"{summary['problem']}: {summary['error'].strip().splitlines()[-1]}"
    c = summary.get("failed_check") or {}
    flags = [k for k in ("within_bound", "guards_intact", "padding_intact", "inputs_intact", "repeatable")
             if c.get(k) is False]
    return (f"{summary['problem']} trial {c.get('trial', '?')}: not {', '.join(flags) or 'passed'} (worst error "
            f"{c.get('worst_error_over_bound', float('nan')):.3g}x the bound, {c.get('unwritten', 0)} outputs unwritten)")


def validate_on_device(real: Realisation, cubin: bytes, report: dict, hardware: Hardware, shapes,
                       repetitions: int) -> dict:
    """The candidate's verdict: {"status", "reason", "device", "checks", "timings"} (see above)."""
    problems = build.report_problems(report)
    if problems:
        return {"status": "failed", "reason": "ptxas: " + "; ".join(problems), "checks": [], "timings": []}
    device = driver.probe_device()
    reason = not_the_target(device, hardware)
    if reason:
        return {"status": "unvalidated", "reason": reason}
    runner = _worker()
    checks, timings = [], []
    cases = [(p, "awkward", 0) for p in awkward_problems(real)] + \
            [(p, "workload", repetitions) for p in workload_problems(real, shapes)]
    for problem, kind, reps in cases:
        out = runner.run(real, cubin, problem, validate=True, repetitions=reps, hang_seconds=HANG_SECONDS[kind])
        summary = _summary(problem, out)
        checks.append(summary)
        if not summary["passed"]:
            return {"status": "failed", "reason": why_failed(summary), "device": device.name, "checks": checks,
                    "timings": timings}
        if reps:
            t = out["timing"]
            timings.append({"shape": [problem.m, problem.n, problem.k], "median_seconds": t["median_seconds"],
                            "min_seconds": t["min_seconds"], "tflops": t["tflops"], "repetitions": t["repetitions"]})
    return {"status": "passed", "reason": None, "device": device.name, "checks": checks, "timings": timings}


def settings(prof) -> dict:
    """What a profile asks of matrix validation (its part of a validate step's key)."""
    from .worker import TRIALS
    return {"protocol": PROTOCOL, "awkward_shapes": [list(s) for s in AWKWARD_SHAPES], "trials": TRIALS,
            "repetitions": prof.timing_repetitions, "hang_seconds": HANG_SECONDS}
