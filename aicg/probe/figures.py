"""What a probe returns: named figures with their spread, and the curves behind them.

A figure is one number for the hwdb's measured section. It is the median of
`repetitions` independent repetitions (each repetition itself a median of
launches); `spread` is the relative range of those repetitions,
(max - min) / median, the band inside which a re-probe of the same GPU is
expected to land. Curves are the raw points a figure was read from (x, y
pairs with units), kept beside the hwdb entry for inspection.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    name: str          # the hwdb fact name, e.g. "dram_copy_bandwidth"
    value: float
    unit: str
    method: str        # how it was measured, in one sentence
    repetitions: int
    spread: float      # relative range of the repetitions

    def as_record(self) -> dict:
        return {"value": self.value, "unit": self.unit, "method": self.method,
                "repetitions": self.repetitions, "spread": self.spread}


def figure(name: str, samples: list[float], unit: str, method: str, scale: float = 1.0) -> Figure:
    """A figure from repeated samples: their median, with their relative range as spread."""
    if not samples:
        raise ValueError(f"figure {name}: no samples")
    median = statistics.median(samples)
    spread = (max(samples) - min(samples)) / median if median else 0.0
    return Figure(name, float(median * scale), unit, method, len(samples), round(float(spread), 4))


def exact(name: str, value: float, unit: str, method: str) -> Figure:
    """A figure read, not timed (a device attribute): one repetition, no spread."""
    return Figure(name, value, unit, method, 1, 0.0)


@dataclass(frozen=True)
class Curve:
    x_label: str
    y_label: str
    points: tuple[tuple[float, float], ...]

    def as_record(self) -> dict:
        return {"x": self.x_label, "y": self.y_label, "points": [list(p) for p in self.points]}


@dataclass
class ProbeResult:
    figures: list[Figure] = field(default_factory=list)
    curves: dict[str, Curve] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # what the probe saw that a number does not say
