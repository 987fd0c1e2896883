"""A packaged matrix kernel's time at a shape its build did not time.

The build timed each packaged kernel at its class's workload shapes (without
the target GPU, predicted it there). At another shape, the prior's model
(aicg/matrix/prior.py) says how the time moves with the sizes, and the
kernel's own times say how far off the model is for that kernel: the log of
time over model at each class shape, averaged with the weights of
calibration.shape_weight, so that the nearest shapes speak for it. This is how
a matrix profile calibrates the plan, with the instance's own times as the
profile; the runtime runs the kernel so estimated fastest.
"""
from __future__ import annotations

import math

from . import prior
from .calibration import shape_weight
from .problem import Problem
from .space import Realisation


def known_seconds(kernel: dict, shapes) -> list[tuple[tuple[int, int, int], float]]:
    """A manifest kernel's times at its class's shapes: measured where the build measured any, else predicted."""
    for key in ("measured_seconds", "predicted_seconds"):
        found = [(tuple(s), t) for s, t in zip(shapes, kernel.get(key) or ()) if t is not None and 0 < t < math.inf]
        if found:
            return found
    return []


def seconds_at(real: Realisation, problem: Problem, known, model_inputs: dict) -> float:
    """The kernel's estimated seconds at `problem`; infinite where nothing is known of it."""
    if not known:
        return math.inf
    at = (problem.m, problem.n, problem.k)
    weights, logs = [], []
    for shape, seconds in known:
        there = Problem(*shape, problem.dtype, problem.a_major, problem.b_major, problem.epilogue)
        weights.append(shape_weight(at, shape))
        logs.append(math.log(seconds / prior.predict_seconds(real, there, model_inputs)))
    off = sum(w * g for w, g in zip(weights, logs)) / sum(weights)
    return prior.predict_seconds(real, problem, model_inputs) * math.exp(off)
