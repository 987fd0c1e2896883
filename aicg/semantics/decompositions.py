"""Streaming decompositions named in the atlas, in float64.

An atlas property `<name>_decomposable` claims that an operator's row result
can be computed from partial states over any split of the row, merged by an
associative operation. Each entry here is that claim made executable: the
state of a chunk, the merge, and the result; the tests check, on random
splits and merge orders, that merging equals computing directly (in real
arithmetic, which float64 approximates closely enough to tell). The kernels
in kernels/online_softmax.cuh and kernels/welford.cuh implement the same
merges in float32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Decomposition:
    state: Callable[[np.ndarray], tuple]
    merge: Callable[[tuple, tuple], tuple]
    finish: Callable[[tuple], np.ndarray]
    direct: Callable[[np.ndarray], np.ndarray]


def _softmax_state(x):
    m = float(np.max(x))
    return (m, float(np.sum(np.exp(x - m))))


def _softmax_merge(a, b):
    m = max(a[0], b[0])
    return (m, a[1] * math.exp(a[0] - m) + b[1] * math.exp(b[0] - m))


def _welford_state(x):
    mean = float(np.mean(x))
    return (float(len(x)), mean, float(np.sum((x - mean) ** 2)))


def _welford_merge(a, b):
    n = a[0] + b[0]
    d = b[1] - a[1]
    return (n, a[1] + d * b[0] / n, a[2] + b[2] + d * d * a[0] * b[0] / n)


DECOMPOSITIONS: dict[str, Decomposition] = {
    # (max, sum of exp(x - max)) -> log-sum-exp, from which softmax and log-softmax follow
    "online_decomposable": Decomposition(_softmax_state, _softmax_merge,
                                         lambda s: np.array([s[0] + math.log(s[1])]),
                                         lambda x: np.array([np.log(np.sum(np.exp(x - x.max()))) + x.max()])),
    # (count, mean, M2) -> (mean, variance)
    "welford_decomposable": Decomposition(_welford_state, _welford_merge,
                                          lambda s: np.array([s[1], s[2] / s[0]]),
                                          lambda x: np.array([np.mean(x), np.var(x)])),
    # partial sums over k-ranges, merged by addition
    "split_k_decomposable": Decomposition(lambda x: (float(np.sum(x)),), lambda a, b: (a[0] + b[0],),
                                          lambda s: np.array([s[0]]), lambda x: np.array([np.sum(x)])),
}
