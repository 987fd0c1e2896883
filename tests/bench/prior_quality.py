"""How well the calibrated matrix prior ranks what a GPU measured, from the recorded runs alone.

    python tests/bench/prior_quality.py [--device "NVIDIA H100 80GB HBM3"] [--top 3] [--json out.json]
    python tests/bench/prior_quality.py --profile rulesets/profiles/matmul.toml [--per-family 6]

A build times only the first few realisations the prior ranks at each shape (the planner's
`candidates_per_family`), so the prior's worth is what that costs. For each grid problem of the
device's recorded matrix runs (docs/bench/: tests/bench/matmul_bench.py; explorations included,
cases timed after a memset of the L2 left out), the realisations timed there and validated
are ranked as the planner ranks them today (aicg/matrix/calibration.ranking_seconds: the model
with the device's hwdb entry, calibrated by its matrix profile). The loss of a problem is the best
time among the prior's first --top over the best time of all it timed: 1.00 where the prior
would have built the fastest. A realisation timed in several runs counts with its latest time.
No GPU needed: edit the prior or re-measure its calibration, and run this again.

With --profile, what a build of that profile would choose instead: its matrix classes planned as a
build plans them (candidates_per_family a family for all of a class's shapes, chosen to lose the
least over them; --per-family overrides the profile's), and at each of a class's shapes the grid has
timed, the best time among the chosen over the best time of all (the chosen the grid did not time
at that shape count as missing, and a shape where none was timed is left out).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aicg import profile  # noqa: E402
from aicg.matrix import calibration, device, plan, space, steps  # noqa: E402
from aicg.matrix.problem import Problem  # noqa: E402
from aicg.matrix.space import Epilogue  # noqa: E402
from aicg.report import bench  # noqa: E402
from aicg.semantics import ruleset  # noqa: E402

TEMPLATES = ("wgmma", "mma", "gemv")


def known_realisations() -> dict:
    """name -> realisation, for every K-major bf16 setting without an epilogue that the grid can time:
    the planner's settings, the space's tried ones among them."""
    reals = (space.realisation(t, "bfloat16", "k", "k", **setting) for t in TEMPLATES for setting in plan.settings(t))
    return {real.name: real for real in reals}


def measured_grid(runs: list, device_name: str) -> dict[str, dict[str, float]]:
    """problem name -> {realisation name: median seconds} of the grid cases that passed validation."""
    found: dict[str, dict[str, float]] = {}
    for run in runs:
        if run.device != device_name or "table" not in run.data:
            continue
        for case in run.data.get("cases", []):
            timing, validation = case.get("timing") or {}, case.get("validation") or {}
            # timed after a read of the L2 (runs before the flush was named used a memset)
            if case.get("stage") == "grid" and timing.get("l2_flush") == "read" and validation.get("status") == "passed":
                found.setdefault(case["problem"], {})[case["realisation"]] = timing["median_seconds"]
    return found


def losses(measured: dict[str, dict[str, float]], seconds, top: int) -> tuple[list[dict], int]:
    """One row per problem (its timed count, best time and realisation, the prior's first, the loss),
    and how many timed realisations are not in the space any more (left out)."""
    reals, rows, unknown = known_realisations(), [], 0
    for name, timed in sorted(measured.items(), key=lambda item: tuple(int(x) for x in item[0].split()[0].split("x"))):
        m, n, k = (int(x) for x in name.split()[0].split("x"))
        problem = Problem(m, n, k, "bfloat16", "k", "k")
        known = {r: t for r, t in timed.items() if r in reals}
        unknown += len(timed) - len(known)
        if not known:
            continue
        ranked = sorted(known, key=lambda r: (seconds(reals[r], problem), r))
        best = min(known, key=known.get)
        rows.append({"problem": name, "timed": len(known), "best": best, "best_seconds": known[best],
                     "prior_first": ranked[0], "loss": min(known[r] for r in ranked[:top]) / known[best]})
    return rows, unknown


def planned(profile_path: Path, hardware, per_family: int | None = None) -> list[tuple[list, list[str]]]:
    """(the class's shapes, the names of the realisations a build of the profile would choose) for each
    of its plain K-major bfloat16 matrix classes (the grid's kind), planned for `hardware`."""
    rules = ruleset.load(ROOT / "rulesets")
    prof = profile.load(profile_path, rules, ROOT / "hwdb")
    if per_family:
        prof = dataclasses.replace(prof, candidates_per_family=per_family)
    built = steps.load(ROOT / "rulesets", rules, prof, hardware, ROOT / "hwdb")
    found = []
    for cls, class_plan in zip(built.classes, built.plans):
        if cls.dtype == "bfloat16" and (cls.a_major, cls.b_major) == ("k", "k") and cls.epilogue == Epilogue():
            found.append(([tuple(s) for s in cls.shapes], [c.id.removeprefix("matmul.") for c in class_plan.candidates]))
    return found


def planned_losses(measured: dict[str, dict[str, float]], classes) -> list[dict]:
    """One row per class shape the grid timed: the best of the chosen it timed over the best of all."""
    rows = []
    for shapes, chosen in classes:
        for m, n, k in shapes:
            timed = measured.get(Problem(m, n, k, "bfloat16", "k", "k").name)
            if not timed:
                continue
            best = min(timed, key=timed.get)
            mine = {r: timed[r] for r in chosen if r in timed}
            rows.append({"problem": f"{m}x{n}x{k}", "best": best, "best_seconds": timed[best],
                         "chosen_timed": len(mine), "chosen": len(chosen),
                         "pick": min(mine, key=mine.get) if mine else None,
                         "loss": min(mine.values()) / timed[best] if mine else None})
    return rows


def report_planned(args, record, measured) -> None:
    rows = planned_losses(measured, planned(Path(args.profile), record, args.per_family))
    for r in rows:
        loss = f"{r['loss']:.3f}" if r["loss"] else "  -  "
        print(f"{r['problem']:>18}  loss {loss}  chosen timed {r['chosen_timed']} of {r['chosen']}  "
              f"best {r['best_seconds'] * 1e6:8.1f} us {r['best']}  pick {r['pick']}")
    known = [r["loss"] for r in rows if r["loss"]]
    if known:
        print(f"{len(known)} of {len(rows)} shapes with a chosen realisation timed: the build's choice loses "
              f"{math.exp(sum(map(math.log, known)) / len(known)):.3f} (geometric mean), worst {max(known):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "profile": args.profile, "rows": rows}, indent=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="NVIDIA H100 80GB HBM3", help="the GPU's name as the runs record it")
    parser.add_argument("--top", type=int, default=3, help="realisations a build times at a shape")
    parser.add_argument("--bench-dir", default=str(ROOT / "docs" / "bench"))
    parser.add_argument("--json", help="write the rows and the summary here")
    parser.add_argument("--profile", help="score what a build of this profile would choose (see above)")
    parser.add_argument("--per-family", type=int, help="with --profile: candidates a family, instead of the profile's")
    args = parser.parse_args(argv)
    record = device.hardware_entry(args.device)
    if record is None:
        raise SystemExit(f"hwdb/ has no entry naming {args.device!r}")
    measured = measured_grid(bench.runs(Path(args.bench_dir)), args.device)
    if not measured:
        raise SystemExit(f"{args.bench_dir}: no recorded grid case of {args.device}")
    if args.profile:
        report_planned(args, record, measured)
        return
    rows, unknown = losses(measured, calibration.ranking_seconds(ROOT / "hwdb", record), args.top)
    for r in rows:
        print(f"{r['problem'].split()[0]:>18}  timed {r['timed']:2d}  loss {r['loss']:.3f}  "
              f"best {r['best_seconds'] * 1e6:8.1f} us {r['best']}  prior's first {r['prior_first']}")
    geo = math.exp(sum(math.log(r["loss"]) for r in rows) / len(rows))
    worst = max(rows, key=lambda r: r["loss"])
    print(f"{len(rows)} problems: the prior's first {args.top} lose {geo:.3f} (geometric mean), worst {worst['loss']:.3f} "
          f"at {worst['problem'].split()[0]}" + (f"; {unknown} timed realisations no longer in the space" if unknown else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "top": args.top, "rows": rows,
                                               "geomean_loss": geo, "unknown": unknown}, indent=1))


if __name__ == "__main__":
    main()
