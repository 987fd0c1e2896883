"""A GPU's realisation profile (hwdb/<gpu>.realisation.json) and the measured prior it gives.

The profile holds one record per (realisation, row length, row count)
measured by the lab, with the provenance of the run. The prior it gives the
planner is the structural model of plan.predict_seconds *calibrated* by
measurement: for each realisation and measured row length, the ratio of
measured to modelled time at the lab's full launch; for a workload shape,
the model's time at that shape times the ratio interpolated over log(row
length) (clamped at the ends of the grid). The model carries what changes
with the row count (filling the machine, rows held in L2); the measurement
carries what the model cannot know about the realisation on this GPU. A
shape of no more rows than the lab's few-row launches (a single row, one
wave) is predicted by the model calibrated by those launches instead (the
ratio interpolated over log row length and log row count): what a launch of
few rows costs (latency, scheduling) is not what the full launches calibrate.

A realisation the profile has not measured (a partial profile, from a lab
run with a budget, or one added since the lab ran) borrows the calibration
of its measured kin: at each of the lab's launches, the mean log ratio of
measured to modelled time of the measured realisations of its family (or of
the family it is declared timed like) and element size that share the most
of its structure (KIN), applied to its own model. What the kin measured
about this GPU carries over; what the model says about the realisation's
own residency and sweeps stays.

Drift (the largest error against float64, relative to the operator's
scale) and bit stability come with every record; legality reads them.
"""
from __future__ import annotations

import bisect
import math
from pathlib import Path

from .. import codegen, digest, measurements, plan, plan_inputs
from ..dtypes import DTYPES
from ..errors import InputError

PROVENANCE = measurements.PROVENANCE


def path_for(hwdb_dir: Path, target: str) -> Path:
    return Path(hwdb_dir) / f"{target}.realisation.json"


class Profile(measurements.Measurements):
    def by_config(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for r in self.records:
            out.setdefault(r["id"], []).append(r)
        for rs in out.values():
            rs.sort(key=lambda r: r["cols"])
        return out

    def source(self) -> str:
        return f"realisation profile {self.path.name} ({self.provenance['device']}, {self.provenance['date']})"


_RECORD_KEYS = {"id": str, "family": str, "dtype": str, "params": dict, "rows": int, "cols": int,
                "seconds": float, "bytes": int, "drift": float, "bit_stable": bool}


def _is(value, kind) -> bool:
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def load(path: Path) -> Profile | None:
    """The profile at `path`, None if there is none; a malformed one is an error naming the key."""
    found = measurements.read(path, "realisation profile")
    if found is None:
        return None
    provenance, records = found
    for i, r in enumerate(records):
        for key, kind in _RECORD_KEYS.items():
            if not _is(r.get(key), kind):
                raise InputError(path, f"records[{i}].{key}", kind.__name__, r.get(key))
    return Profile(Path(path), provenance, tuple(records))


def kernels_changed(provenance: dict, headers: dict[str, bytes]) -> list[str] | None:
    """The headers (name -> bytes, as now) whose content differs from what the profile measured;
    None where the profile does not record it (measured before profiles recorded their kernels)."""
    measured = provenance.get("kernels")
    if measured is None:
        return None
    return sorted(name for name, data in headers.items() if measured.get(name) != digest.of_bytes(data))


def save(path: Path, provenance: dict, records: list[dict]) -> None:
    measurements.save(path, provenance, records)


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear through (xs, ys), held constant beyond the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


# What a realisation the lab has not measured shares with the measured kin whose calibration it
# borrows, nearest first (besides the family or its declared twin, the element size, and whether a
# row has one thread, which decides the row lengths the lab runs it at). Never another topology: on
# the H200 profile with 97% of the realisations left out, those near the top of their family were
# predicted within 0.39 (standard deviation of log time) by kin of their own topology and the model
# alone, 0.58 by their family's other topologies (docs/lab.md).
KIN = (
    ("topology, held or not, access width and exp",
     lambda p: (p["topology"], p["cache_packs"] > 0, p["vec_bytes"], p["fast_exp"])),
    ("topology and held or not", lambda p: (p["topology"], p["cache_packs"] > 0)),
    ("topology", lambda p: (p["topology"],)),
)


def _one_thread(p: dict) -> bool:
    return codegen.lanes_per_row(p["topology"], p["threads"]) == 1


class MeasuredPrior:
    """Predicted seconds of a candidate on a shape, from the profile where it measured that realisation
    (and, by borrowed(), from its measured kin where it did not)."""

    def __init__(self, profile: Profile, hw: dict, model: dict | None = None):
        """`model`: a cache of plan.model_terms by (family, dtype, config id, shape), which no
        measurement changes: priors of one GPU's profiles as they grow may share one."""
        self.profile, self.hw = profile, hw
        self._model = {} if model is None else model
        self._records = profile.by_config()
        self._ratios: dict[tuple[str, bool], tuple | None] = {}
        self._few: dict[tuple[str, bool], list] = {}
        self._by_elements: dict[str, tuple[list[float], list[float]]] = {}
        self._synthetic: dict[str, list[dict]] = {}     # unmeasured config id -> records borrowed from its kin
        self._kin_ratios: dict[tuple[str, str], dict] = {}
        self._kin_by: dict[tuple[str, int, bool], list[str]] | None = None
        self._completed: dict[str, list[dict] | None] = {}   # measured config id -> its records and those carried over
        self._kin_groups: dict[tuple, dict] = {}
        self._kin_lengths: dict[tuple, set[int]] = {}

    def _terms(self, family, dtype: str, p: dict, shape, config_id: str) -> tuple[float, float]:
        """plan.model_terms of `family` in `dtype` with `p` (whose id, in either, is `config_id`)."""
        key = (family.name, dtype, config_id, shape)
        if key not in self._model:
            self._model[key] = plan.model_terms(family, dtype, p, shape, self.hw)
        return self._model[key]

    def _points(self, config_id: str) -> list[dict]:
        """The records that predict `config_id`, by row length (as the calibrations interpolate
        them): measured, with those carried over from its kin, or borrowed from its kin alone."""
        return (self._completed.get(config_id) or self._records.get(config_id)
                or self._synthetic.get(config_id, []))

    def _flat(self, config_id: str, shape) -> float:
        """A flat walk sees no rows, only elements: the lab's time at the same count, interpolated
        over log elements between its launches (which span 64 elements to millions), and per
        element beyond the largest. Calibrating by row length instead carries the large launches'
        measured/modelled ratio onto the model's launch overhead, which it does not scale: at
        4194304x1 bfloat16 it ranked 4-byte packs (17.6 us) ahead of 16-byte ones (13.4 us)."""
        if config_id not in self._by_elements:
            by_count: dict[int, list[float]] = {}
            for r in self._points(config_id):
                by_count.setdefault(r["rows"] * r["cols"], []).append(math.log(r["seconds"]))
            counts = sorted(by_count)
            self._by_elements[config_id] = ([math.log(n) for n in counts],
                                            [sum(by_count[n]) / len(by_count[n]) for n in counts])
        xs, ys = self._by_elements[config_id]
        elements = shape[0] * shape[1]
        if math.log(elements) > xs[-1]:
            return math.exp(ys[-1] - xs[-1]) * elements
        return math.exp(_interpolate(xs, ys, math.log(elements)))

    @staticmethod
    def _tiny(p: dict, cols: int) -> bool:
        """Whether rows of `cols` take a thread's tiny-row path (kernels/row_access.cuh), whose
        costs the longer rows' measurements do not tell, nor these theirs."""
        return codegen.rows_per_thread(p["topology"]) > 1 and cols <= plan_inputs.TINY_ROW

    def _full_and_few(self, config_id: str, tiny: bool) -> tuple[list[dict], dict[int, list[dict]]]:
        """The lab's full launch at each row length (its most rows), and its launches of few rows
        (a single row, one wave) by row count: of the row lengths on the same path as `tiny`
        where the lab measured any, else of all."""
        points = self._points(config_id)
        points = [r for r in points if self._tiny(r["params"], r["cols"]) == tiny] or points
        most = {}
        for r in points:
            if r["rows"] > most.get(r["cols"], 0):
                most[r["cols"]] = r["rows"]
        full = [r for r in points if r["rows"] == most[r["cols"]]]
        few: dict[int, list[dict]] = {}
        for r in points:
            if r["rows"] < most[r["cols"]]:
                few.setdefault(r["rows"], []).append(r)
        return full, few

    def _few_rows(self, config_id: str, tiny: bool, family, dtype: str,
                  p: dict) -> list[tuple[int, list[float], list[float]]]:
        """(rows, log cols, log measured/modelled time) per few-row launch count the lab measured,
        fewest rows first."""
        if (config_id, tiny) not in self._few:
            _, few = self._full_and_few(config_id, tiny)
            self._few[config_id, tiny] = [
                (rows, [math.log(r["cols"]) for r in rs],
                 [math.log(r["seconds"] / max(self._terms(family, dtype, p, (rows, r["cols"]), config_id)))
                  for r in rs])
                for rows, rs in sorted(few.items())]
        return self._few[config_id, tiny]

    def _calibration(self, config_id: str, tiny: bool, family, dtype: str, p: dict):
        """(log cols, log measured/modelled byte time, log seconds per element) at each measured
        row length's full launch, and the most elements one measured launch covered."""
        key = config_id, tiny
        if key not in self._ratios:
            points, _ = self._full_and_few(config_id, tiny)
            if not points:
                self._ratios[key] = None
            else:
                xs = [math.log(r["cols"]) for r in points]
                ys = [math.log(r["seconds"] / self._terms(family, dtype, p, (r["rows"], r["cols"]), config_id)[0])
                      for r in points]
                per_element = [math.log(r["seconds"] / (r["rows"] * r["cols"])) for r in points]
                self._ratios[key] = (xs, ys, per_element, max(r["rows"] * r["cols"] for r in points))
        return self._ratios[key]

    def __call__(self, family, dtype: str, p: dict, shape) -> float | None:
        """The model's time to move the bytes, calibrated by the measurements at the nearest row
        lengths (the lab's launches are bound by bytes), and never shorter than the model's
        chain of memory waits (what bounds a launch of few rows, which the lab does not run).
        A shape larger than the lab's launches is never predicted faster per element than the
        lab measured: those launches already saturate the memory system, and the model's
        credit for rows that a partial wave runs for free does not survive more rows. A
        realisation measured at some of the lab's row lengths only (a budget ran out) is
        predicted at the others by its measurements carried over as its kin change (_complete)."""
        timed_as = self.measured_as(family, dtype, p)
        if timed_as is None:
            return None
        config_id = plan.candidate_id(*timed_as, p)
        if timed_as[0] == family.name:
            self._complete(family, timed_as[1], p, config_id)
        return self._predict(config_id, family, timed_as[1], p, shape)

    def _predict(self, config_id: str, family, dtype: str, p: dict, shape) -> float | None:
        """__call__'s prediction from the points (measured or borrowed) of `config_id`."""
        if p["topology"] == codegen.FLAT:
            return self._flat(config_id, shape)
        tiny = self._tiny(p, shape[1])
        found = self._calibration(config_id, tiny, family, dtype, p)
        if found is None:
            return None
        xs, ys, per_element, largest = found
        x = math.log(shape[1])
        few = self._few_rows(config_id, tiny, family, dtype, p)
        by_bytes, by_waits = self._terms(family, dtype, p, shape, config_id)
        if few and shape[0] <= few[-1][0]:
            # Within the few-row launches the lab timed, the model calibrated by them instead,
            # interpolated over log row length and then over log row count: the full launches'
            # costs (the machine filled, clusters scheduled) are not a few rows' costs.
            counts = [math.log(rows) for rows, _, _ in few]
            at_x = [_interpolate(cols, ratios, x) for _, cols, ratios in few]
            return max(by_bytes, by_waits) * math.exp(_interpolate(counts, at_x, math.log(max(1, shape[0]))))
        predicted = max(by_bytes * math.exp(_interpolate(xs, ys, x)), by_waits)
        if few:   # more rows never take less time than the most rows of the few-row launches
            rows = few[-1][0]
            predicted = max(predicted, max(self._terms(family, dtype, p, (rows, shape[1]), config_id))
                            * math.exp(_interpolate(few[-1][1], few[-1][2], x)))
        if shape[0] * shape[1] <= largest:
            return predicted
        return max(predicted, shape[0] * shape[1] * math.exp(_interpolate(xs, per_element, x)))

    def measured_as(self, family, dtype: str, p: dict) -> tuple[str, str] | None:
        """(family, dtype) of the realisation whose measurements predict this one's time: itself
        where the lab measured it, else the family in a measured dtype of the same element size
        (the kernels move the same bytes and compute in float alike; float16 is timed as
        bfloat16), else, likewise, the family it is declared timed like (`timed_like` in
        families.toml: the same sweeps over the same bytes, for a family the lab has not measured
        yet), else None. Drift is never borrowed: it depends on the dtype's rounding and on the
        family's arithmetic."""
        size = DTYPES[dtype].size
        dtypes = (dtype, *sorted(d for d in DTYPES if d != dtype and DTYPES[d].size == size))
        for name in (family.name, *([family.timed_like] if family.timed_like else [])):
            for other in dtypes:
                if plan.candidate_id(name, other, p) in self._records:
                    return name, other
        return None

    def drift(self, config_id: str, max_cols: int) -> tuple[float, int] | None:
        """(largest drift measured up to max_cols, at which row length), or None if never measured."""
        points = [r for r in self._records.get(config_id, []) if r["cols"] <= max(max_cols, 1)]
        if not points:
            return None
        worst = max(points, key=lambda r: r["drift"])
        return worst["drift"], worst["cols"]

    def borrowed(self, family, dtype: str, p: dict, shape) -> float | None:
        """Predicted seconds of a realisation the lab has not measured (measured_as() is None): its
        model calibrated by the measured kin of borrowed_levels(); None where no kin was measured."""
        config_id = plan.candidate_id(family.name, dtype, p)
        if not self._borrow(family, dtype, p):
            return None
        return self._predict(config_id, family, dtype, p, shape)

    def borrowed_levels(self, family, dtype: str, p: dict) -> dict[int, int]:
        """For each row length at which measured kin calibrate an unmeasured realisation's full launch,
        the KIN level of that kin (0 the nearest)."""
        return {r["cols"]: r["kin"] for r in self._borrow(family, dtype, p) if r["full"]}

    def borrowed_source(self, family, dtype: str, p: dict) -> str:
        coarsest = max(self.borrowed_levels(family, dtype, p).values())
        return f"its measured kin (the same {KIN[coarsest][0]}) in {self.profile.source()}"

    def _borrow(self, family, dtype: str, p: dict) -> list[dict]:
        """The records an unmeasured realisation borrows: at each launch (rows, row length) that its
        nearest measured kin ran, its own model times the kin's mean measured/modelled ratio there."""
        config_id = plan.candidate_id(family.name, dtype, p)
        if config_id not in self._synthetic:
            self._synthetic[config_id] = [
                self._record(family, dtype, p, config_id, (rows, cols), full, ratio, level)
                for (rows, cols), (level, full, ratio) in sorted(self._kin_means(family, dtype, p, config_id).items(),
                                                                 key=lambda kv: (kv[0][1], kv[0][0]))]
        return self._synthetic[config_id]

    def _complete(self, family, dtype: str, p: dict, config_id: str) -> None:
        """A realisation the lab measured at some of its row lengths (a budget ran out) is predicted
        at the others by its measurements at the nearest one, carried over as its kin's change
        between the two: at each launch its kin ran at a row length it lacks, the ratio it measured
        at the same launch of its nearest measured row length (on the same path), plus the kin's
        ratio there less theirs at that length."""
        if config_id in self._completed:
            return
        have = sorted({r["cols"] for r in self._records[config_id]})
        size, one = DTYPES[dtype].size, _one_thread(p)
        if self._lengths_of(size, one, (family.name, family.timed_like)) <= set(have):
            self._completed[config_id] = None   # every row length its kin ran: nothing to carry over
            return
        own = self._kin_ratio(family, config_id)
        kin = self._kin_means(family, dtype, p, config_id)
        added = []
        for (rows, cols), (level, full, ratio) in sorted(kin.items()):
            if cols in have:
                continue
            same_path = [n for n in have if self._tiny(p, n) == self._tiny(p, cols)] or have
            anchor = min(same_path, key=lambda n: (abs(math.log(n / cols)), n))
            rows_there = max(r for r, n in own if n == anchor) if full else rows
            if (rows_there, anchor) not in own or (rows_there, anchor) not in kin:
                continue
            carried = own[rows_there, anchor][1] + ratio - kin[rows_there, anchor][2]
            added.append(self._record(family, dtype, p, config_id, (rows, cols), full, carried, level))
        self._completed[config_id] = (sorted(self._records[config_id] + added, key=lambda r: r["cols"]) if added
                                      else None)

    def _record(self, family, dtype: str, p: dict, config_id: str, point, full: bool, ratio: float,
                level: int) -> dict:
        terms = self._terms(family, dtype, p, point, config_id)
        return {"id": config_id, "family": family.name, "dtype": dtype, "params": p, "rows": point[0],
                "cols": point[1], "seconds": (terms[0] if full else max(terms)) * math.exp(ratio),
                "kin": level, "full": full}

    def _kin_means(self, family, dtype: str, p: dict, config_id: str) -> dict[tuple[int, int], tuple]:
        """(rows, row length) -> (KIN level, whether it is the full launch, mean log ratio) of the
        nearest measured kin of a realisation (itself apart) that ran that launch."""
        size, one = DTYPES[dtype].size, _one_thread(p)
        found: dict[tuple[int, int], tuple[int, bool, float]] = {}
        for level, (_, key) in enumerate(KIN):
            same = key(p)
            for name in dict.fromkeys((family.name, family.timed_like)):
                if not name:
                    continue
                sums = self._kin_sums(family, name, size, one, level).get(same, {})
                mine = self._kin_ratio(family, config_id) if config_id in sums.get("ids", ()) else {}
                for point, (full, total, count) in sums.get("points", {}).items():
                    if point in mine:   # itself apart
                        total, count = total - mine[point][1], count - 1
                    if count and (point not in found or found[point][0] == level):
                        earlier = found.get(point)
                        if earlier is None:
                            found[point] = (level, full, total, count)
                        else:
                            found[point] = (level, full, earlier[2] + total, earlier[3] + count)
        return {point: (level, full, total / count) for point, (level, full, total, count) in found.items()}

    def _kin_sums(self, family, name: str, size: int, one: bool, level: int) -> dict:
        """The measured realisations of family `name` (modelled as `family`), element size and one
        thread or not, grouped by their KIN[level] key: their ids and, per launch (rows, row length),
        (whether it is the full launch, the sum of their log ratios, how many)."""
        cache_key = (family.name, name, size, one, level)
        if cache_key not in self._kin_groups:
            groups: dict = {}
            key = KIN[level][1]
            for cid in self._kin_index().get((name, size, one), ()):
                group = groups.setdefault(key(self._records[cid][0]["params"]), {"ids": set(), "points": {}})
                group["ids"].add(cid)
                for point, (full, ratio) in self._kin_ratio(family, cid).items():
                    _, total, count = group["points"].get(point, (full, 0.0, 0))
                    group["points"][point] = (full, total + ratio, count + 1)
            self._kin_groups[cache_key] = groups
        return self._kin_groups[cache_key]

    def _lengths_of(self, size: int, one: bool, names) -> set[int]:
        """The row lengths measured realisations of the families `names` ran at (element size,
        one thread per row or not)."""
        key = (size, one, tuple(names))
        if key not in self._kin_lengths:
            self._kin_lengths[key] = {r["cols"] for name in names if name
                                      for cid in self._kin_index().get((name, size, one), ())
                                      for r in self._records[cid]}
        return self._kin_lengths[key]

    def _kin_index(self) -> dict[tuple[str, int, bool], list[str]]:
        """Measured config ids by (family, element size, one thread per row)."""
        if self._kin_by is None:
            self._kin_by = {}
            for cid, rs in self._records.items():
                key = (rs[0]["family"], DTYPES[rs[0]["dtype"]].size, _one_thread(rs[0]["params"]))
                self._kin_by.setdefault(key, []).append(cid)
        return self._kin_by

    def _kin_ratio(self, family, config_id: str) -> dict[tuple[int, int], tuple[bool, float]]:
        """(rows, row length) -> (whether it is the full launch, log measured/modelled time) of a
        measured realisation, modelled as `family` (its own, or a family timed like it): the full
        launches against the time to move the bytes, the few-row ones against the whole model, as
        the calibration of __call__ takes them."""
        if (family.name, config_id) not in self._kin_ratios:
            points = self._records[config_id]
            most: dict[int, int] = {}
            for r in points:
                most[r["cols"]] = max(most.get(r["cols"], 0), r["rows"])
            ratios = {}
            for r in points:
                shape, full = (r["rows"], r["cols"]), r["rows"] == most[r["cols"]]
                model = (plan.model_terms(family, r["dtype"], r["params"], shape, self.hw)[0] if full
                         else plan.predict_seconds(family, r["dtype"], r["params"], shape, self.hw))
                ratios[shape] = (full, math.log(r["seconds"] / model))
            self._kin_ratios[family.name, config_id] = ratios
        return self._kin_ratios[family.name, config_id]
