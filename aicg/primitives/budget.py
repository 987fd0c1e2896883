"""A lab run within a budget of wall-clock seconds: rounds of the most urgent measurements.

Each round orders what is left (priority.order) by the prior of everything
measured so far, takes from the head as many items as fit its share of the
budget left (ROUND_SHARE, by cost.py's estimate), compiles those
realisations not compiled yet and measures them; then the prior is
recalibrated and the next round orders again. The run stops when the
budget is spent (the lab stops before a realisation that would start past
it) or nothing is left. Compiles and ordering are inside the budget: the
clock starts before the first order.

The device work is the caller's: `measure(items, deadline)` compiles and
measures (doit primitives on a GPU) or looks the records up in a recorded
profile (replay.py), so this loop is the same on both.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from . import cost, lab, priority, realisation

ROUND_SHARE = 0.5          # of the budget left, per round: later rounds order by what earlier ones measured
MIN_ROUND_SECONDS = 10.0   # a round shorter than this is not worth ordering again for


@dataclass
class Run:
    """What a budgeted run did: the records it measured, round by round."""
    records: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)     # per round: items, records, estimated and spent seconds
    stopped_by_budget: bool = False
    seconds: float = 0.0                                 # spent in all, before the run and in it


def prior_of(records: list[dict], hw: dict, provenance: dict, model: dict | None = None):
    """The measured prior (realisation.MeasuredPrior) of `records`, as a profile of them gives it
    (None where there are none); `model`: its cache of the model's terms."""
    if not records:
        return None
    return realisation.MeasuredPrior(realisation.Profile(Path("(measured so far)"), provenance, tuple(records)),
                                     hw, model)


def run(configs, decisions, ruleset, hw: dict, kept: list[dict], budget: float, measure, clock,
        provenance: dict, compiled: set[str] = frozenset(), workers: int | None = None, progress=None,
        spent: float = 0.0) -> Run:
    """Measure what `configs` have left beyond `kept` (records measured before, on the same cubins),
    most urgent first, within `budget` seconds of `clock()`. `measure(items, deadline)` returns the
    records of the items it measured (those it reached before `clock()` passed `deadline`);
    `compiled`: ids whose cubins are at hand already; `spent`: seconds spent before (the budget
    left is `budget`)."""
    start = clock()
    deadline = start + budget
    workers = workers or cost.compile_workers()
    compiled = set(compiled)
    out = Run()
    model: dict = {}    # the model's predictions and terms: the same every round
    terms: dict = {}
    while True:
        records = kept + out.records
        done = {(r["id"], r["cols"]) for r in records}
        left = priority.pending(configs, done)
        if not left:
            break
        ordering = time.perf_counter()
        estimates = priority.Estimates(ruleset, hw, prior_of(records, hw, provenance, terms), model)
        ordered = priority.order(left, decisions, estimates, done)
        ordering = time.perf_counter() - ordering
        remaining = deadline - clock()
        allowance = min(remaining, max(MIN_ROUND_SECONDS, ROUND_SHARE * remaining))
        batch, estimated, new = [], 0.0, set()
        for item, _ in ordered:
            more = estimates.item_seconds(item)
            if item.config.id not in compiled and item.config.id not in new:
                more += cost.compile_seconds(1, workers)
            if estimated + more > (allowance if batch else remaining):
                break
            batch.append(item)
            estimated += more
            new.add(item.config.id)
        if not batch:
            out.stopped_by_budget = True
            break
        before = clock()
        measured = measure(batch, deadline)
        compiled |= new
        out.records += measured
        reached = {(r["id"], r["cols"]) for r in measured}
        out.rounds.append({"items": len(batch), "measured": sum(i.key in reached for i in batch),
                           "records": len(measured),
                           "estimated_seconds": estimated, "seconds": clock() - before,
                           "ordering_seconds": ordering,
                           "most_urgent": ordered[0][1], "last_urgency": ordered[len(batch) - 1][1]})
        if progress:
            progress(f"  round {len(out.rounds)}: {len(reached)} of {len(batch)} items measured "
                     f"({clock() - before:.0f} s, {estimated:.0f} s estimated), {len(left) - len(reached)} left, "
                     f"{max(0.0, deadline - clock()):.0f} s of the budget left")
        if clock() >= deadline or not reached:   # not reached: the deadline passed before the first
            out.stopped_by_budget = len(reached) < len(left)
            break
    out.seconds = spent + clock() - start
    return out


def partial_provenance(configs, records: list[dict], budget: float, spent: float) -> dict | None:
    """What a profile of `records` says of its coverage: None where it covers every item of
    `configs`, else how many of how many, the budget and the order it was measured in."""
    done = {(r["id"], r["cols"]) for r in records}
    items = [(c.id, n) for c in configs for n in lab.row_lengths(c)]
    if all(i in done for i in items):
        return None
    return {"items_measured": sum(i in done for i in items), "items": len(items),
            "realisations_measured": len({r["id"] for r in records}), "realisations": len(configs),
            "budget_seconds": budget, "spent_seconds": round(spent, 1), "order": priority.ORDER_RULE}
