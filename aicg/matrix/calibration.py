"""A GPU's matrix profile (hwdb/<gpu>.matrix.json) and the calibration it gives the matrix prior.

The profile holds one record per (realisation, shape) timed on the device and
validated against float64 in the same run, with the run's provenance. What it
gives the planner is the structural model of aicg/matrix/prior.py *calibrated*
by measurement, as the row families' realisation profile calibrates theirs
(aicg/primitives/realisation.py). The model carries what the shape changes
(waves of tiles, bytes to move, the split-K partials); the measurements carry
what it cannot know: how fast this GPU runs a schedule, an epilogue store, a
cluster, a tile shape.

Per template, the log of measured over modelled time is fitted by ridge
regression (RIDGE) on the realisation's features: each knob's value, the dtype,
the layouts, the epilogue's parts, and log2 M, N, K with (log2 M)^2 (how far the
model's regime is off as M goes from decode to prefill), in two layers: the
plain records (no epilogue) fit the knobs' effects, and the fused records fit
what an epilogue adds over that (their residuals from the plain fit). So a fused
run, few cases at one shape, says what an epilogue costs on each design without
moving a single plain prediction. A realisation then carries the effect of each
of its knobs' values whether or not its combination was measured: on the H100's
profile, held out one realisation at a time, the model alone predicted the
held-out times within 0.29 (root mean square of the log error), the fit within
0.18 (tests/bench/matmul_plan_accuracy.py).
A measured realisation adds its own records' residuals, weighted by how near
their shapes are (shape_weight) and shrunk a little (OWN_SHRINK): what it
measured at a shape is what it will measure there. A template the profile has
no record of borrows the mean log ratio of all the records: the model's
overall error on this GPU, so that its predictions stand beside the calibrated
templates' on the same footing.

A GPU with no matrix profile of its own borrows that of a GPU of the same
compute capability and SM count (for_target): the same SMs run the same
schedules, stores and clusters alike, and the model, read with each GPU's own
facts (memory bandwidth, clocks), carries what differs between them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import hw, measurements
from ..errors import InputError
from . import prior, space
from .problem import Problem
from .space import Realisation

RECORD_KEYS = {"realisation": dict, "m": int, "n": int, "k": int, "seconds": float}
# The ridge penalty on the features' effects (each 0 or 1, or a log2 size): held out one realisation at
# a time on the H100's profile, 0.3, 1 and 3 gave 0.172, 0.164 and 0.161; 1 keeps more of what one
# measurement says.
RIDGE = 1.0
# A measured realisation's own residuals are shrunk by this weight: one record at the very shape
# predicted gives 1 / 1.1 of its residual (the plan ranks measured realisations by their measurements).
OWN_SHRINK = 0.1
# Where the size features are centred (log2 of M, N, K): a prefill of 1024 tokens on 4096-wide weights.
CENTRE = (10.0, 12.0, 12.0)


def path_for(hwdb_dir: Path, target: str) -> Path:
    return Path(hwdb_dir) / f"{target}.matrix.json"


class Profile(measurements.Measurements):
    def source(self) -> str:
        return f"matrix profile {self.path.name} ({self.provenance['device']}, {self.provenance['date']})"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_record(path: Path, i: int, r: dict) -> None:
    where = f"records[{i}]"
    for key, kind in RECORD_KEYS.items():
        value = r.get(key)
        ok = _is_number(value) if kind is float else isinstance(value, kind) and not isinstance(value, bool)
        if not ok:
            raise InputError(path, f"{where}.{key}", kind.__name__, value)
    if not all(r[d] > 0 for d in "mnk"):
        raise InputError(path, f"{where}", "m, n and k of at least 1", [r["m"], r["n"], r["k"]])
    if not (math.isfinite(r["seconds"]) and r["seconds"] > 0):
        raise InputError(path, f"{where}.seconds", "a positive finite number of seconds", r["seconds"])
    try:
        Realisation.from_dict(r["realisation"])
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(path, f"{where}.realisation", "a realisation of aicg/matrix/space.toml "
                                                       "(template, dtype, a_major, b_major, epilogue, knobs)",
                         str(err)) from None


def load(path: Path) -> Profile | None:
    """The profile at `path`, None if there is none; a malformed one is an error naming the key."""
    found = measurements.read(path, "matrix profile")
    if found is None:
        return None
    provenance, records = found
    for i, r in enumerate(records):
        _check_record(path, i, r)
    return Profile(Path(path), provenance, tuple(records))


def save(path: Path, provenance: dict, records: list[dict]) -> None:
    measurements.save(path, provenance, records)


@dataclass(frozen=True)
class Found:
    """The matrix profile a target is planned with, and the hwdb entry it was measured on."""
    profile: Profile
    measured_on: hw.Hardware
    borrowed: bool

    def source(self, target: str) -> str:
        if not self.borrowed:
            return self.profile.source()
        kin = self.measured_on
        return (f"{self.profile.source()}, borrowed: {target} has none of its own, and {kin.target} has its compute "
                f"capability {'.'.join(map(str, kin.compute_capability))} and {kin.fact('sm_count')} SMs")


def for_target(hwdb_dir: Path, hardware: hw.Hardware) -> Found | None:
    """The target's own matrix profile, else that of the first hwdb entry (by name) of the same
    compute capability and SM count that has one, else None."""
    own = load(path_for(hwdb_dir, hardware.target))
    if own is not None:
        return Found(own, hardware, False)
    for path in sorted(Path(hwdb_dir).glob("*.matrix.json")):
        target = path.name.removesuffix(".matrix.json")
        try:
            kin = hw.load_target(Path(hwdb_dir), target)
        except (InputError, OSError):
            continue   # a profile whose entry is missing or malformed lends nothing
        if tuple(kin.compute_capability) == tuple(hardware.compute_capability) and \
                kin.fact("sm_count") == hardware.fact("sm_count"):
            return Found(load(path), kin, True)
    return None


def of_target(hwdb_dir: Path, hardware: hw.Hardware) -> tuple["Calibration | None", Found | None]:
    """The target's calibration of the matrix prior, and the profile it came from ((None, None): no
    profile to use). A borrowed profile's ratios are of the model read with the facts of the GPU it
    measured, so that is the model it is fitted to."""
    found = for_target(hwdb_dir, hardware)
    if found is None:
        return None, None
    values = prior.values(prior.inputs(found.measured_on))
    return Calibration(found.profile, lambda real, problem: prior.predict_seconds(real, problem, values)), found


def ranking_seconds(hwdb_dir: Path, hardware: hw.Hardware):
    """(realisation, problem) -> seconds on `hardware` as the planner ranks them: the model read with
    its facts, calibrated by its matrix profile where it has one (Calibration.cautious_seconds)."""
    values = prior.values(prior.inputs(hardware))
    measured, _ = of_target(hwdb_dir, hardware)

    def seconds(real: Realisation, problem: Problem) -> float:
        modelled = prior.predict_seconds(real, problem, values)
        return measured.cautious_seconds(real, problem, modelled) if measured else modelled
    return seconds


def shape_weight(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """1 at the same shape, 1/25 at twice or half one of its sizes: what a kernel measured at one shape
    says of it at another fades fast (waves and tails change with every size)."""
    d2 = sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a, b))
    return 1.0 / (1.0 + 4.0 * d2) ** 2


def feature_names(template: str) -> list[str]:
    tpl = space.templates()[template]
    return (["1"] + [f"{k}={v}" for k in sorted(tpl.knobs) for v in tpl.knobs[k]]
            + [f"dtype={d}" for d in space.DTYPES] + [f"a={x}" for x in tpl.a_layouts]
            + [f"b={x}" for x in tpl.b_layouts] + ["bias", "activation", "residual", "log2 m", "log2 n", "log2 k",
                                                    "(log2 m)^2"])


def features(names: list[str], real: Realisation, shape: tuple[float, float, float]) -> np.ndarray:
    on = {"1", f"dtype={real.dtype}", f"a={real.a_major}", f"b={real.b_major}",
          *(f"{k}={v}" for k, v in real.knobs)}
    e = real.epilogue
    on |= {name for name, flag in (("bias", e.bias), ("activation", e.activation != "none"),
                                   ("residual", e.residual)) if flag}
    x = np.array([1.0 if n in on else 0.0 for n in names])
    lm, ln, lk = (math.log2(v) - c for v, c in zip(shape, CENTRE))
    x[-4:] = (lm, ln, lk, lm * lm / 10.0)
    return x


@dataclass(frozen=True)
class _Fit:
    """One template's ridge fit: the features' effects, and the sizes its records span."""
    names: list
    effects: np.ndarray
    ranges: tuple

    @classmethod
    def of(cls, template: str, points: list[tuple[Realisation, tuple[int, int, int], float]]) -> "_Fit":
        names = feature_names(template)
        x = np.array([features(names, real, shape) for real, shape, _ in points])
        penalty = RIDGE * np.eye(len(names))
        penalty[0, 0] = 0.0          # the intercept: the model's overall error on this GPU, not shrunk
        effects = np.linalg.solve(x.T @ x + penalty, x.T @ np.array([ratio for _, _, ratio in points]))
        ranges = tuple((min(s[d] for _, s, _ in points), max(s[d] for _, s, _ in points)) for d in range(3))
        return cls(names, effects, ranges)

    def __call__(self, real: Realisation, shape: tuple[int, int, int]) -> float:
        # within the sizes measured: the curve in log M is not extrapolated to M it never saw
        held = tuple(min(max(v, low), high) for v, (low, high) in zip(shape, self.ranges))
        return float(features(self.names, real, held) @ self.effects)


def kind(real: Realisation) -> str:
    """"plain" or "fused": the calibration's two layers."""
    return "plain" if real.epilogue.name == "plain" else "fused"


@dataclass(frozen=True)
class _Layered:
    """One template's fit in two layers: `plain` fitted to the plain records, `fused` to the fused
    records' residuals from it (or to their ratios, where the template has no plain record). A
    plain realisation reads the first layer only; None where a layer had no record."""
    plain: _Fit | None
    fused: _Fit | None

    @classmethod
    def of(cls, template: str, points: list[tuple[Realisation, tuple[int, int, int], float]]) -> "_Layered":
        plain = [p for p in points if kind(p[0]) == "plain"]
        fused = [p for p in points if kind(p[0]) == "fused"]
        base = _Fit.of(template, plain) if plain else None
        if base is not None:
            fused = [(real, shape, ratio - base(real, shape)) for real, shape, ratio in fused]
        return cls(base, _Fit.of(template, fused) if fused else None)

    def __call__(self, real: Realisation, shape: tuple[int, int, int]) -> float | None:
        """The log ratio, or None where the layers `real` reads hold no record."""
        base = self.plain(real, shape) if self.plain is not None else None
        if kind(real) == "plain" or self.fused is None:
            return base
        return (base or 0.0) + self.fused(real, shape)


class Calibration:
    """The log of measured over modelled time of a realisation at a shape, fitted to the profile's
    records; `model(real, problem)` is the prior's uncalibrated seconds.

    `spread` is how far off the fit was for realisations it had not measured, for plain and for fused
    ones: the root mean square of the log error of each realisation's records predicted by a fit made
    without them (at most SPREAD_SAMPLES realisations of each kind a template, evenly taken).
    cautious_seconds() adds a realisation's kind's, in part as a realisation's
    own records near the shape vouch for it, so that the plan prefers a measured kernel to an
    unmeasured one predicted a little faster: the fastest of many uncertain predictions is the most
    likely to be too fast."""

    def __init__(self, profile: Profile, model):
        self.profile = profile
        by_template: dict[str, list[tuple[Realisation, tuple[int, int, int], float]]] = {}
        ratios = []
        for r in profile.records:
            real = Realisation.from_dict(r["realisation"])
            shape = (r["m"], r["n"], r["k"])
            problem = Problem(*shape, real.dtype, real.a_major, real.b_major, real.epilogue)
            ratios.append(math.log(r["seconds"] / model(real, problem)))
            by_template.setdefault(real.template, []).append((real, shape, ratios[-1]))
        # what a template without records borrows: the model's error on plain records where there are
        # any (a fused run moves no plain prediction)
        plain = [ratio for r, ratio in zip(profile.records, ratios)
                 if kind(Realisation.from_dict(r["realisation"])) == "plain"] or ratios
        self._overall = sum(plain) / len(plain)
        self._fits = {template: _Layered.of(template, points) for template, points in sorted(by_template.items())}
        self._residuals: dict[Realisation, list[tuple[tuple[int, int, int], float]]] = {}
        for template, points in by_template.items():
            for real, shape, ratio in points:
                self._residuals.setdefault(real, []).append((shape, ratio - self._fits[template](real, shape)))
        self.spread = _held_out_spread(by_template)
        self._cache: dict[tuple, tuple[float, float]] = {}

    def _at(self, real: Realisation, shape: tuple[int, int, int]) -> tuple[float, float]:
        """(log ratio, the weight of the realisation's own records near `shape`)."""
        key = (real, shape)
        if key not in self._cache:
            fit = self._fits.get(real.template)
            fitted = fit(real, shape) if fit is not None else None
            found, vouched = self._overall if fitted is None else fitted, 0.0
            own = self._residuals.get(real)
            if fitted is not None and own:
                weights = [shape_weight(shape, s) for s, _ in own]
                vouched = sum(weights)
                found += sum(w * e for w, (_, e) in zip(weights, own)) / (vouched + OWN_SHRINK)
            self._cache[key] = (found, vouched)
        return self._cache[key]

    def log_ratio(self, real: Realisation, shape: tuple[int, int, int]) -> float:
        """The calibration of `real` at `shape`."""
        return self._at(real, shape)[0]

    def seconds(self, real: Realisation, problem: Problem, modelled: float) -> float:
        return modelled * math.exp(self.log_ratio(real, (problem.m, problem.n, problem.k)))

    def cautious_seconds(self, real: Realisation, problem: Problem, modelled: float) -> float:
        """seconds() with the fit's spread added where the realisation's own records do not vouch for
        it: all of it unmeasured, a tenth of it at a shape it measured (OWN_SHRINK's share)."""
        found, vouched = self._at(real, (problem.m, problem.n, problem.k))
        return modelled * math.exp(found + self.spread[kind(real)] * OWN_SHRINK / (vouched + OWN_SHRINK))


SPREAD_SAMPLES = 64


def _held_out_spread(by_template: dict[str, list]) -> dict[str, float]:
    """{"plain": ..., "fused": ...}: a kind with no realisation to hold out takes the other's errors."""
    errors: dict[str, list[float]] = {"plain": [], "fused": []}
    for template, points in by_template.items():
        for this in errors:
            reals = list(dict.fromkeys(real for real, _, _ in points if kind(real) == this))
            step = max(1, len(reals) // SPREAD_SAMPLES)
            for held in reals[::step]:
                rest = [p for p in points if p[0] != held]
                if not rest:
                    continue
                fit = _Layered.of(template, rest)
                guesses = [(ratio, fit(real, shape)) for real, shape, ratio in points if real == held]
                errors[this] += [ratio - guess for ratio, guess in guesses if guess is not None]

    def rms(es: list[float]) -> float:
        return math.sqrt(sum(e * e for e in es) / len(es)) if es else 0.0
    every = errors["plain"] + errors["fused"]
    return {this: rms(es or every) for this, es in errors.items()}
