"""A budgeted lab run replayed on a recorded full profile, with no GPU: how good is a partial profile?

    python -m aicg.primitives.replay [--target ENTRY] [BUDGET ...]
        (seconds; default 45 60 90 120 150 180 240 300 600; ENTRY: an hwdb entry whose realisation
        profile measured every realisation, default nvidia-h200)

simulate() runs budget.run() with the lab's own ordering, its measurements
looked up in the full profile (hwdb/<gpu>.realisation.json: every
realisation measured) instead of taken on a device, and its clock advanced
by what each would have cost (cost.py: the recorded launch times x
launches, the host's cost per launch shape, the compiles on COMPILE_WORKERS
CPUs) and by ORDERING_SECONDS a round. score() plans every shipped profile
on the partial profile it leaves and on the full one, and scores both
instances by the full profile's prior (its measurements, interpolated as
the planner does) at every operator, dtype and workload shape: the instance
dispatches each shape to the fastest valid candidate the planner sent to
the device, so a case's slowdown is the best full-profile time among the
partial plan's candidates over the best among the full plan's. A candidate
that the full profile's measured drift rejects counts as failing validation.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .. import hw as hw_loader, plan, plan_inputs, profile as profile_loader
from ..semantics import ruleset as ruleset_loader
from . import budget, cost, lab, priority, realisation

COMPILE_WORKERS = 16        # the GPU nodes' CPUs
ORDERING_SECONDS = 3.0      # a round's ordering of what is left (about 1.5 s on a 2-core development machine)
START_SECONDS = 10.0        # the GPU's context, the rule sets and the profiles' decisions, before the first round


@dataclass(frozen=True)
class Setup:
    """What a replay reads: the rule sets, the target's plan inputs, the full profile, the shipped
    profiles, the lab's realisations (those the full profile measured) and their decisions."""
    ruleset: object
    hw: dict
    full: realisation.Profile
    profiles: tuple
    configs: tuple
    decisions: tuple


def setup(root: Path, target: str) -> Setup:
    root = Path(root)
    ruleset = ruleset_loader.load(root / "rulesets")
    hw = plan_inputs.values(plan_inputs.resolve(hw_loader.load_target(root / "hwdb", target)))
    full = realisation.load(realisation.path_for(root / "hwdb", target))
    if full.provenance.get("method", "").startswith("partial"):
        raise ValueError(f"{full.path}: a partial profile ({full.provenance['method'].split(';')[0]}); a replay "
                         f"needs one that measured every realisation (`doit primitives` without a budget, or "
                         f"budgeted runs until nothing is left)")
    profiles = tuple(profile_loader.load(p, ruleset, root / "hwdb")
                     for p in sorted((root / "rulesets/profiles").glob("*.toml")))
    recorded = {r["id"] for r in full.records}
    configs = tuple(c for c in lab.configurations(ruleset, hw) if c.id in recorded)
    decisions = tuple(priority.profile_decisions(ruleset, profiles, list(configs), hw)
                      + priority.grid_decisions(list(configs)))
    return Setup(ruleset, hw, full, profiles, configs, decisions)


def simulate(s: Setup, seconds: float, kept: list[dict] = (), workers: int = COMPILE_WORKERS) -> budget.Run:
    """A budgeted run of `seconds` on the GPU that measured `s.full`, resuming from `kept` (records of
    an earlier run: their realisations are compiled again first, to check their cubins)."""
    recorded: dict[tuple[str, int], list[dict]] = {}
    for r in s.full.records:
        recorded.setdefault((r["id"], r["cols"]), []).append(r)
    clock = [START_SECONDS + cost.compile_seconds(len({r["id"] for r in kept}), workers)]

    def measure(items: list[priority.Item], deadline: float) -> list[dict]:
        clock[0] += ORDERING_SECONDS + cost.compile_seconds(len({i.config.id for i in items}), workers)
        lengths: dict[str, list[int]] = {}
        by_case: dict[tuple[str, str], dict[str, lab.Config]] = {}
        for item in items:   # lab.measure's order: operator and dtype by their first config
            lengths.setdefault(item.config.id, []).append(item.cols)
            by_case.setdefault((item.config.op, item.config.dtype), {})[item.config.id] = item.config
        out = []
        for group in by_case.values():
            for c in group.values():
                if clock[0] > deadline:
                    return out
                for cols in lengths[c.id]:
                    records = recorded[c.id, cols]
                    clock[0] += cost.measure_seconds(r["seconds"] for r in records)
                    out += records
        return out

    # the budget counts from the start, as doit primitives counts it
    return budget.run(list(s.configs), list(s.decisions), s.ruleset, s.hw, list(kept), seconds - clock[0], measure,
                      lambda: clock[0], s.full.provenance, compiled={r["id"] for r in kept}, workers=workers,
                      spent=clock[0])


def in_lab_order(s: Setup, seconds: float, workers: int = COMPILE_WORKERS) -> list[dict]:
    """What the lab without a budget has measured when `seconds` have passed: it compiles every
    realisation first, then measures them operator by operator, each at every row length."""
    clock = START_SECONDS + cost.compile_seconds(len(s.configs), workers)
    by_item = _by_item(s.full.records)
    by_case: dict[tuple[str, str], list[lab.Config]] = {}
    for c in s.configs:
        by_case.setdefault((c.op, c.dtype), []).append(c)
    out = []
    for group in by_case.values():
        for c in group:
            if clock > seconds:
                return out
            for cols in lab.row_lengths(c):
                clock += cost.measure_seconds(r["seconds"] for r in by_item[c.id, cols])
                out += by_item[c.id, cols]
    return out


def full_seconds(s: Setup, workers: int = COMPILE_WORKERS) -> float:
    """What measuring every realisation of the full profile costs by the same estimate."""
    return (START_SECONDS + cost.compile_seconds(len(s.configs), workers)
            + sum(cost.measure_seconds(r["seconds"] for r in rs) for rs in _by_item(s.full.records).values()))


def _by_item(records) -> dict[tuple[str, int], list[dict]]:
    out: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        out.setdefault((r["id"], r["cols"]), []).append(r)
    return out


def score(s: Setup, records: list[dict]) -> dict:
    """Every shipped profile planned on a profile of `records` and on the full one, scored by the full
    profile: per case (profile, operator, dtype, shape) the slowdown of the partial plan's best
    candidate, and per profile the candidates each plan sends to the device."""
    truth = realisation.MeasuredPrior(s.full, s.hw)
    partial = budget.prior_of(list(records), s.hw, s.full.provenance)
    cases, candidates = [], {}
    for prof in s.profiles:
        valid = {c.id for _, cs in plan.plan_workload(s.ruleset, prof, s.hw, per_family=10**9,
                                                      measured=truth).values() for c in cs}
        on_full = plan.plan_workload(s.ruleset, prof, s.hw, measured=truth)
        on_partial = plan.plan_workload(s.ruleset, prof, s.hw, measured=partial)
        candidates[prof.path.name] = (sum(len(cs) for _, cs in on_partial.values()),
                                      sum(len(cs) for _, cs in on_full.values()))
        for op, work in prof.workload.items():
            for dtype in work.dtypes:
                for i, shape in enumerate(work.shapes):
                    def best(planned):
                        times = [truth(s.ruleset.families[c.family], c.dtype, c.params, shape)
                                 for c in planned[op][1] if c.dtype == dtype and c.id in valid
                                 and math.isfinite(c.predicted_seconds[i])]
                        return min(times, default=math.inf)
                    reference = best(on_full)
                    if math.isfinite(reference):
                        cases.append({"profile": prof.path.name, "op": op, "dtype": dtype, "shape": list(shape),
                                      "slowdown": best(on_partial) / reference})
    slow = [c["slowdown"] for c in cases]
    return {"geomean_slowdown": math.exp(sum(map(math.log, slow)) / len(slow)), "worst_slowdown": max(slow),
            "cases": cases, "candidates": candidates}


def table(s: Setup, budgets) -> list[dict]:
    rows = []
    for seconds in budgets:
        run = simulate(s, seconds)
        scored = score(s, run.records)
        unordered = score(s, in_lab_order(s, seconds))
        done = {(r["id"], r["cols"]) for r in run.records}
        default = [c["slowdown"] for c in scored["cases"] if c["profile"] == "default.toml"]
        rows.append({"budget": seconds, "items": len(done), "realisations": len({r["id"] for r in run.records}),
                     "rounds": len(run.rounds), "geomean_slowdown": scored["geomean_slowdown"],
                     "default_geomean_slowdown": math.exp(sum(map(math.log, default)) / len(default)),
                     "worst_slowdown": scored["worst_slowdown"],
                     "cases_within_3pct": sum(c["slowdown"] <= 1.03 for c in scored["cases"]) / len(scored["cases"]),
                     "candidates": scored["candidates"], "lab_order_geomean_slowdown": unordered["geomean_slowdown"]})
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m aicg.primitives.replay", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="nvidia-h200", help="the hwdb entry whose full profile is replayed")
    parser.add_argument("budgets", nargs="*", type=float, help="seconds")
    args = parser.parse_args(argv)
    budgets = args.budgets or [45, 60, 90, 120, 150, 180, 240, 300, 600]
    root = Path(__file__).resolve().parents[2]
    started = time.perf_counter()
    try:
        s = setup(root, args.target)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    items = sum(len(lab.row_lengths(c)) for c in s.configs)
    nothing = score(s, [])
    print(f"{s.full.path.name} ({s.full.provenance['device']}, {s.full.provenance['date']}): {len(s.configs)} "
          f"realisations, {items} items; the full run by the same estimate {full_seconds(s):.0f} s; "
          f"{len(s.decisions)} decisions; {len(nothing['cases'])} cases; with no profile (the model alone): "
          f"geomean slowdown {nothing['geomean_slowdown']:.4f}, worst {nothing['worst_slowdown']:.3f}")
    print("| budget (s) | items measured | realisations | rounds | geomean slowdown, all profiles | default profile "
          "| worst case | cases within 3% | candidates, default (full) | lab order without a budget, stopped there |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in table(s, budgets):
        built, full = row["candidates"]["default.toml"]
        print(f"| {row['budget']:.0f} | {row['items']} of {items} | {row['realisations']} | {row['rounds']} "
              f"| {row['geomean_slowdown']:.4f} | {row['default_geomean_slowdown']:.4f} | {row['worst_slowdown']:.3f} "
              f"| {row['cases_within_3pct']:.0%} | {built} ({full}) | {row['lab_order_geomean_slowdown']:.4f} |",
              flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
