"""Reading figures off measured curves: plateaus, saturation points, knees.

Probes sweep one variable (working-set size, bytes in flight, stride) and
measure another. What the planner needs is a few numbers from each curve:
the level it settles at, the least x that reaches most of that level, and
where it steps from one level to the next (a cache capacity, say). The
analysis is pure and deterministic, so CI checks it on synthetic curves
with known answers.

Knees: the curve is cut into levels by binary segmentation in log(y) (a cut
is kept only where the two sides differ by at least `min_step`); levels of
at least `min_points` points are plateaus; between two neighbouring
plateaus the knee is where the curve crosses their geometric mean,
interpolated in log(x). Transitions in real hardware are gradual (hashing,
partitions, replacement), and the midpoint is the one place on them that
does not depend on how densely the sweep sampled the slope.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Level:
    value: float      # geometric mean of the level's y
    first_x: float
    last_x: float
    points: int


@dataclass(frozen=True)
class Knee:
    x: float          # where the curve crosses between the two levels
    before: Level
    after: Level

    @property
    def ratio(self) -> float:
        return self.after.value / self.before.value


def _check(xs, ys) -> tuple[list[float], list[float]]:
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("a curve needs at least two (x, y) points of equal count")
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError("a curve's x must increase strictly")
    if any(y <= 0 or not math.isfinite(y) for y in ys):
        raise ValueError("a curve's y must be positive and finite")
    return xs, ys


def plateau(xs, ys, top: int = 3) -> float:
    """The level a rising curve settles at: the median of its `top` highest points
    (one lucky point does not make the plateau)."""
    _, ys = _check(xs, ys)
    best = sorted(ys, reverse=True)[:top]
    return best[len(best) // 2]


def saturation_point(xs, ys, fraction: float = 0.9) -> float:
    """The least x whose y reaches `fraction` of the plateau."""
    xs, ys = _check(xs, ys)
    target = fraction * plateau(xs, ys)
    return next(x for x, y in zip(xs, ys) if y >= target)


def _segments(logs: list[float], lo: int, hi: int, min_step: float) -> list[tuple[int, int]]:
    """[lo, hi) cut recursively where a split lowers the squared error most and
    the two sides' means differ by at least log(min_step)."""
    if hi - lo < 2:
        return [(lo, hi)]
    best, best_cut = None, None
    prefix = [0.0]
    for v in logs[lo:hi]:
        prefix.append(prefix[-1] + v)
    total = prefix[-1]
    for cut in range(1, hi - lo):
        left, right = prefix[cut] / cut, (total - prefix[cut]) / (hi - lo - cut)
        gain = cut * (hi - lo - cut) / (hi - lo) * (left - right) ** 2  # drop in squared error
        if abs(left - right) >= math.log(min_step) and (best is None or gain > best):
            best, best_cut = gain, lo + cut
    if best_cut is None:
        return [(lo, hi)]
    return _segments(logs, lo, best_cut, min_step) + _segments(logs, best_cut, hi, min_step)


def levels(xs, ys, min_step: float = 1.25, min_points: int = 3) -> list[Level]:
    """The plateaus of a step-like curve, in x order."""
    xs, ys = _check(xs, ys)
    logs = [math.log(y) for y in ys]
    found = []
    for lo, hi in _segments(logs, 0, len(xs), min_step):
        if hi - lo >= min_points:
            mean = sum(logs[lo:hi]) / (hi - lo)
            found.append(Level(math.exp(mean), xs[lo], xs[hi - 1], hi - lo))
    # Neighbouring plateaus closer than min_step are one level split by a transition's points.
    merged: list[Level] = []
    for level in found:
        if merged and max(level.value, merged[-1].value) / min(level.value, merged[-1].value) < min_step:
            prev = merged.pop()
            value = math.exp((math.log(prev.value) * prev.points + math.log(level.value) * level.points)
                             / (prev.points + level.points))
            level = Level(value, prev.first_x, level.last_x, prev.points + level.points)
        merged.append(level)
    return merged


def knees(xs, ys, min_step: float = 1.25, min_points: int = 3) -> list[Knee]:
    """Where the curve steps from one plateau to the next."""
    xs, ys = _check(xs, ys)
    plateaus = levels(xs, ys, min_step, min_points)
    found = []
    for before, after in zip(plateaus, plateaus[1:]):
        middle = math.sqrt(before.value * after.value)
        rising = after.value > before.value
        start = xs.index(before.last_x)
        stop = xs.index(after.first_x)
        x = after.first_x
        for i in range(start, stop):
            crossed = ys[i + 1] >= middle if rising else ys[i + 1] <= middle
            if crossed:
                # interpolate in log(x) between the points either side of the midpoint
                y0, y1 = math.log(ys[i]), math.log(ys[i + 1])
                t = 0.5 if y1 == y0 else min(1.0, max(0.0, (math.log(middle) - y0) / (y1 - y0)))
                x = math.exp(math.log(xs[i]) + t * (math.log(xs[i + 1]) - math.log(xs[i])))
                break
        found.append(Knee(x, before, after))
    return found
