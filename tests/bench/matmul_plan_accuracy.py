"""How well the matrix prior picks kernels at a shape it has no measurement of (runs anywhere).

    python3 tests/bench/matmul_plan_accuracy.py [hwdb/h100-sxm.matrix.json] [--target h100-sxm] [--top 3]

For each shape of the matrix profile (one class: dtype, layouts, epilogue) where it measured two
or more realisations, every record at that shape is held out; the calibration is made from the
others (aicg/matrix/calibration.py), and the measured realisations at the held-out shape are ranked
by the model alone and by the calibrated model. Printed per shape: the measured time of the first
ranked, and the best measured among the first --top, each over the best measured there (1.00: the
prior would have picked the fastest). The geometric means over the shapes close the table.

Then each realisation is held out in turn (all its records), the calibration made from the others,
and its measured times predicted: the root mean square of log(predicted / measured), model alone
and calibrated (what the plan knows of a realisation the profile has not measured).

Last, what an instance runs at a shape its build did not time (aicg/matrix/dispatch.py): each shape
of a class is held out; the others stand for the workload, each served by its fastest measured
realisation (the packaged kernels, knowing their records at those shapes only); at the held-out
shape, the kernel of the nearest workload shape that takes it, and the kernel estimated fastest
(aicg/matrix/estimate.py), each over the fastest packaged kernel measured there (a pick not
measured there is counted apart).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from aicg import hw  # noqa: E402
from aicg.matrix import calibration, estimate, prior  # noqa: E402
from aicg.matrix.templates import RULES  # noqa: E402
from aicg.matrix.problem import Problem  # noqa: E402
from aicg.matrix.space import Realisation  # noqa: E402


def _class_and_shape(r: dict) -> tuple:
    real = r["realisation"]
    return (real["dtype"], real["a_major"], real["b_major"], tuple(sorted(real["epilogue"].items())),
            (r["m"], r["n"], r["k"]))


def held_out(profile: calibration.Profile, values: dict, top: int) -> list[dict]:
    """One row per held-out (class, shape): the first-ranked and best-of-`top` slowdowns, alone and calibrated."""
    def model(real, problem):
        return prior.predict_seconds(real, problem, values)

    groups: dict[tuple, list[dict]] = {}
    for r in profile.records:
        groups.setdefault(_class_and_shape(r), []).append(r)
    rows = []
    for key, records in sorted(groups.items(), key=lambda kv: (kv[0][4], str(kv[0][:4]))):
        if len(records) < 2:
            continue
        shape = key[4]
        others = replace(profile, records=tuple(r for r in profile.records if (r["m"], r["n"], r["k"]) != shape))
        measured = calibration.Calibration(others, model) if others.records else None
        best = min(r["seconds"] for r in records)
        first = Realisation.from_dict(records[0]["realisation"])
        row = {"shape": shape, "class": f"{first.a_major}{first.b_major} {first.epilogue.name}",
               "measured": len(records)}
        for label, calibrated in (("model", False), ("calibrated", True)):
            ranked = []
            for r in records:
                real = Realisation.from_dict(r["realisation"])
                problem = Problem(*shape, real.dtype, real.a_major, real.b_major, real.epilogue)
                seconds = model(real, problem)
                if calibrated and measured is not None:
                    seconds = measured.seconds(real, problem, seconds)
                ranked.append((seconds, r["seconds"], real.name))
            ranked.sort(key=lambda t: (t[0], t[2]))   # a tie goes by name, never by the measured time
            row[label] = {"first": ranked[0][1] / best, "top": min(t for _, t, _ in ranked[:top]) / best,
                          "picked": ranked[0][2]}
        rows.append(row)
    return rows


def held_out_realisations(profile: calibration.Profile, values: dict) -> dict[str, float]:
    """Root mean square of log(predicted / measured) of each realisation with the others' calibration."""
    def model(real, problem):
        return prior.predict_seconds(real, problem, values)

    errors: dict[str, list[float]] = {"model": [], "calibrated": []}
    reals = [Realisation.from_dict(r["realisation"]) for r in profile.records]
    for held in dict.fromkeys(reals):
        others = replace(profile, records=tuple(r for r, real in zip(profile.records, reals) if real != held))
        measured = calibration.Calibration(others, model) if others.records else None
        for r, real in zip(profile.records, reals):
            if real != held:
                continue
            problem = Problem(r["m"], r["n"], r["k"], real.dtype, real.a_major, real.b_major, real.epilogue)
            seconds = model(real, problem)
            errors["model"].append(math.log(seconds / r["seconds"]))
            calibrated = measured.seconds(real, problem, seconds) if measured else seconds
            errors["calibrated"].append(math.log(calibrated / r["seconds"]))
    return {label: math.sqrt(sum(e * e for e in es) / len(es)) for label, es in errors.items()}


def _log_distance(a: tuple, b: tuple) -> float:
    return sum(abs(math.log(x / y)) for x, y in zip(a, b))


def off_shape_picks(profile: calibration.Profile, values: dict) -> list[dict]:
    """One row per held-out (class, shape): the nearest-shape and the estimated pick over the best packaged there."""
    by_class: dict[tuple, dict[tuple, dict[Realisation, float]]] = {}
    for r in profile.records:
        key = _class_and_shape(r)
        by_class.setdefault(key[:4], {}).setdefault(key[4], {})[Realisation.from_dict(r["realisation"])] = r["seconds"]
    rows = []
    for cls, shapes in sorted(by_class.items(), key=lambda kv: str(kv[0])):
        for held in sorted(shapes):
            workload = {s: times for s, times in shapes.items() if s != held}
            # the dispatch table: each workload shape's fastest measured realisation
            fastest = {s: min(times, key=lambda real: (times[real], real.name)) for s, times in workload.items()}
            if not fastest:
                continue
            first = next(iter(fastest.values()))
            problem = Problem(*held, first.dtype, first.a_major, first.b_major, first.epilogue)
            takes = sorted({real for real in fastest.values() if RULES[real.template].unsupported(real, problem) is None},
                           key=lambda real: real.name)
            there = {real: shapes[held][real] for real in takes if real in shapes[held]}
            if len(takes) < 2 or not there:
                continue
            nearest = min(takes, key=lambda real: (min(_log_distance(held, s) for s, pick in fastest.items()
                                                       if pick == real), real.name))
            estimated = min(takes, key=lambda real: (estimate.seconds_at(
                real, problem, [(s, times[real]) for s, times in workload.items() if real in times], values),
                real.name))
            best = min(there.values())
            rows.append({"shape": held, "class": f"{first.a_major}{first.b_major} {first.epilogue.name}",
                         "packaged": len(takes), "nearest": there.get(nearest, math.nan) / best,
                         "estimated": there.get(estimated, math.nan) / best})
    return rows


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", nargs="?", type=Path, default=REPO / "hwdb/h100-sxm.matrix.json")
    parser.add_argument("--target", help="the hwdb entry whose facts the model reads (default: the profile's stem)")
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args(argv)
    profile = calibration.load(args.profile)
    if profile is None:
        raise SystemExit(f"{args.profile}: no such matrix profile")
    target = args.target or args.profile.name.removesuffix(".matrix.json")
    values = prior.values(prior.inputs(hw.load_target(REPO / "hwdb", target)))
    rows = held_out(profile, values, args.top)
    print(f"{profile.source()}: each shape held out, ranked by the rest ({len(rows)} shapes)")
    print(f"{'shape':>18} {'layouts, epilogue':>25} {'timed':>5} | {'model 1st':>9} {'top' + str(args.top):>6} | "
          f"{'calibrated 1st':>14} {'top' + str(args.top):>6}")
    for row in rows:
        m, c = row["model"], row["calibrated"]
        print(f"{'x'.join(map(str, row['shape'])):>18} {row['class']:>25} {row['measured']:>5} | "
              f"{m['first']:9.2f} {m['top']:6.2f} | {c['first']:14.2f} {c['top']:6.2f}")
    for label in ("model", "calibrated"):
        print(f"geometric mean, {label}: first {_geomean([r[label]['first'] for r in rows]):.3f}, "
              f"best of {args.top} {_geomean([r[label]['top'] for r in rows]):.3f}; worst first "
              f"{max(r[label]['first'] for r in rows):.2f}")
    spread = held_out_realisations(profile, values)
    print(f"each realisation held out ({len({str(r['realisation']) for r in profile.records})}): root mean square "
          f"of log(predicted / measured), model {spread['model']:.3f}, calibrated {spread['calibrated']:.3f}")
    picks = off_shape_picks(profile, values)
    print(f"\neach shape held out from an instance built at the others ({len(picks)} shapes where two or more "
          f"packaged kernels take it): the pick's measured time over the best packaged kernel's there")
    print(f"{'shape':>18} {'layouts, epilogue':>25} {'kernels':>7} | {'nearest':>7} {'estimated':>9}")
    for row in picks:
        print(f"{'x'.join(map(str, row['shape'])):>18} {row['class']:>25} {row['packaged']:>7} | "
              f"{row['nearest']:7.2f} {row['estimated']:9.2f}")
    for label in ("nearest", "estimated"):
        known = [r[label] for r in picks if not math.isnan(r[label])]
        print(f"{label}: geometric mean {_geomean(known):.3f}, worst {max(known):.2f} over {len(known)} shapes "
              f"({len(picks) - len(known)} picks not measured there)")
    both = [r for r in picks if not math.isnan(r["nearest"]) and not math.isnan(r["estimated"])]
    print(f"on the {len(both)} shapes where both picks were measured: nearest {_geomean([r['nearest'] for r in both]):.3f}"
          f", estimated {_geomean([r['estimated'] for r in both]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
