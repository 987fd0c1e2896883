"""Timing a case's contenders round by round, all of them in every round.

Timed one after another, twenty rounds each, a transient of the run falls on whichever contender
runs while it lasts: row_sum float32 32768x4096, timed first after its inputs were drawn, ran ten
rounds at 135 us and ten at 118 in the eighteenth acceptance run, while alone (rounds_check.py)
every round after the first was 119-122 us. Interleaved, such a transient costs each contender
a round or two alike, and the medians stay the kernels'.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

CASE_PARAMS = ("suite", "op", "dtype", "shape")


def selected(items: Iterable, case: tuple, contenders: Iterable[str]) -> list[str]:
    """The contenders of `case` (its values of CASE_PARAMS) whose tests the run's `items` hold (-k may
    leave some out), in the order of `contenders`."""
    chosen = set()
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "contender" in params and tuple(params.get(k) for k in CASE_PARAMS) == case:
            chosen.add(params["contender"])
    return [c for c in contenders if c in chosen]


def rounds(calls: Mapping[str, Callable], count: int, seconds_of: Callable[[Callable], float]) -> dict[str, list[float]]:
    """Each contender's seconds in each of `count` rounds. Every round times every contender once, in
    an order turned on by one each round, so that none always follows the same other."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(count):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            times[name].append(seconds_of(calls[name]))
    return times
