"""Running matrix realisations in a worker process of their own.

A realisation under test may fault (an illegal address) or hang (a barrier
that never completes): either leaves the process's CUDA context unusable. So
each (realisation, problem) case runs through aicg/validate/isolated.py's
worker: a fault, a hang past the hang guard (check.wait) or a case past the
worker's time limit ends that worker, the case reports what happened, and the
next case gets a fresh worker.

Inside the worker, a problem's inputs, their device copies and their float64
references are kept for the cases that follow on the same problem (the
realisations of one shape see the same fresh draw; a new process draws anew).
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..runtime import driver
from . import check, reference, timing
from .launch import MatmulKernel
from .problem import Problem
from .space import Realisation
from .templates import RULES

TRIALS = 2
CASE_SECONDS = 180.0      # the worker's limit for one case (reference math on the largest shapes included)
_KERNELS_KEPT = 6

_kernels: dict[str, MatmulKernel] = {}
_problem: dict = {}       # the current problem's inputs, operands, references and checked rows
_drawn: dict = {}         # logical operands by reference.operand_key, the latest few
_DRAWN_KEPT = 8
_flush: dict = {}        # the L2 evictions by mode (aicg/matrix/timing.py)


def _kernel(real: Realisation, cubin: bytes) -> MatmulKernel:
    key = hashlib.sha256(cubin).hexdigest()
    if key not in _kernels:
        if len(_kernels) >= _KERNELS_KEPT:
            _kernels.pop(next(iter(_kernels))).close()
        _kernels[key] = MatmulKernel(real, cubin)
    return _kernels[key]


def _inputs(problem: Problem, splits: int, rounded_sum: bool = False) -> dict:
    key = problem.as_dict()
    if _problem.get("key") != key:
        if "operands" in _problem:
            _problem["operands"].free()
        _problem.clear()
        rng = np.random.default_rng()
        trials = [reference.draw(problem, t, rng, _drawn) for t in range(TRIALS)]
        while len(_drawn) > _DRAWN_KEPT:
            _drawn.pop(next(iter(_drawn)))
        _problem.update(key=key, trials=trials, rows=reference.checked_rows(problem.m, rng),
                        operands=check.Operands(problem), references={})
    if (splits, rounded_sum) not in _problem["references"]:
        _problem["references"][splits, rounded_sum] = [
            reference.expected(problem, logical, _problem["rows"], splits, rounded_sum) for logical in _problem["trials"]]
    return _problem


def _l2_flush(mode: str) -> timing.L2Flush:
    if mode not in _flush:
        _flush[mode] = timing.L2Flush(mode)
    return _flush[mode]


def run_case(realisation: dict, cubin: bytes, problem: dict, validate: bool = True, repetitions: int = 0,
             hang_seconds: float = check.HANG_SECONDS, flush: str = "read") -> dict:
    """Validate (and, where it passed and repetitions > 0, time with the L2 evicted by `flush`
    before each repetition) one realisation on one problem, in this process. The worker side of
    `Runner.run`."""
    driver.use_primary_context()
    real, prob = Realisation.from_dict(realisation), Problem.from_dict(problem)
    kernel = _kernel(real, cubin)
    geometry = kernel.geometry(prob)
    splits = check.splits_of(real.template, geometry)
    rounded_sum = RULES[real.template].rounds_sum(real)
    data = _inputs(prob, splits, rounded_sum)
    out = {"realisation": real.name, "problem": prob.name,
           "geometry": {"grid": list(geometry.grid), "block": list(geometry.block), "cluster": geometry.cluster,
                        "shared_bytes": geometry.shared_bytes}}
    if validate:
        out["validation"] = check.validate(kernel, prob, data["trials"], data["rows"], data["operands"],
                                           data["references"][splits, rounded_sum], hang_seconds)
        if out["validation"]["status"] != "passed":
            return out
    if repetitions > 0:
        operands = data["operands"]
        operands.upload(reference.stored(prob, data["trials"][0]))
        pointers = operands.pointers

        def launch():
            kernel.launch(prob, pointers)
        launch()
        check.wait(0, hang_seconds)
        out["timing"] = timing.median_seconds(launch, _l2_flush(flush), repetitions)
        out["timing"]["tflops"] = prob.flops / out["timing"]["median_seconds"] / 1e12
    return out


class Runner:
    """Cases sent to an isolated worker process; a fault or hang becomes the case's result."""

    def __init__(self, seconds: float = CASE_SECONDS):
        from ..validate import isolated
        self.worker = isolated.Worker(seconds)

    def run(self, real: Realisation, cubin: bytes, problem: Problem, validate: bool = True, repetitions: int = 0,
            hang_seconds: float = check.HANG_SECONDS, flush: str = "read") -> dict:
        try:
            reply = self.worker.call("aicg.matrix.worker:run_case", kwargs={
                "realisation": real.as_dict(), "cubin": cubin, "problem": problem.as_dict(), "validate": validate,
                "repetitions": repetitions, "hang_seconds": hang_seconds, "flush": flush})
        except RuntimeError as err:     # an exception in the worker other than a device fault
            return {"realisation": real.name, "problem": problem.name, "error": str(err),
                    "validation": {"status": "failed", "error": str(err), "checks": []}}
        if "fault" in reply:
            return {"realisation": real.name, "problem": problem.name, "fault": reply["fault"],
                    "validation": {"status": "failed", "fault": reply["fault"], "checks": []}}
        return reply["result"]
