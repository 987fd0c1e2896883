"""The order of a budgeted lab run: first what can still change a decision.

An *item* is one realisation at one of the row lengths the lab runs it at
(lab.row_lengths): what one measurement adds to the realisation profile. A
*decision* is a choice the planner makes from the prior: the fastest
realisation (by the geometric mean of its times over the decision's shapes)
among

- the legal candidates of an operator and dtype in a profile (the shipped
  rulesets/profiles/*.toml), at each of its workload shapes: the shape's
  leader, which the instance dispatches that shape to;
- the legal candidates of one family, dtype and operator of a profile, over
  all its workload shapes: the family's best overall, which the planner
  sends to the device first (plan._best_spread) and which, mispredicted,
  takes the place of a shape's leader;
- the runnable realisations of one family and dtype, at each launch of the
  lab's grid (a row length at FEW_ROWS and at the full launch's rows), so
  that shapes and rule choices no shipped profile names are covered too.

At each decision, every member's time is predicted by the prior as it stands
(the profile measured so far, realisation.MeasuredPrior: measured, borrowed
from measured kin, or the model alone) with a spread, SPREAD: how far, in
log time, the truth lies from such a prediction. A member's *urgency* there
is its optimistic time (predicted time / e^spread) over the best predicted
time of the decision: below 1, its measurement may change the decision (for
a decision over several shapes, the spread at the member's least certain
one). An item takes the least urgency of its realisation over the decisions
whose shapes it bears on (the row lengths the prior interpolates a shape
between). Items that may change a shipped profile's decision come first,
by urgency; then those that may change a decision of the lab's grid; then
the rest; the cheaper first among equals.

Everything here is a pure function of its inputs (no device, no clock): the
same profile so far gives the same order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import codegen, plan, plan_inputs
from ..dtypes import DTYPES
from . import cost, lab

# How far (log time, about one standard deviation) the truth lies from a prediction of each kind, near
# the top of a decision (within 1.3x of the best), on the H200 profile with all but a random 3-10% of
# the realisations left out and predicted (docs/lab.md): borrowed from measured kin 0.27-0.29; the
# model alone 0.46, and 0.4 too slow on average (2.6x at a single row); carried over from another row
# length of the same realisation 0.37-0.44 over all realisations.
SPREAD = {"measured": 0.0, "elsewhere": 0.3, "twin": 0.3, "kin": 0.3, "model": 0.5}


PROFILES, GRID = 0, 1    # tiers of decisions: a shipped profile's, then the lab grid's
TIERS = 2


@dataclass(frozen=True)
class Item:
    config: lab.Config
    cols: int

    @property
    def key(self) -> tuple[str, int]:
        return self.config.id, self.cols


@dataclass(frozen=True)
class Decision:
    what: str                                   # where it comes from, for reports
    shapes: tuple[tuple[int, int], ...]         # the fastest by the geometric mean over these
    members: tuple[lab.Config, ...]
    tier: int                                   # PROFILES or GRID


ORDER_RULE = ("items (a realisation at one row length) by urgency: the least, over the decisions whose "
              "shapes the row length bears on, of the realisation's optimistic time (predicted by the profile "
              "measured so far / e^spread) over the decision's best predicted time; first those below 1 for a "
              "decision of a shipped profile (the fastest candidate at each workload shape, a family's best "
              "over all of them), then for one of the lab's grid (the fastest realisation of a family and "
              "dtype at each launch), then the rest; the cheaper first among equals; ordered again after "
              "each round")


def pending(configs: list[lab.Config], done: set[tuple[str, int]]) -> list[Item]:
    """Every item of `configs` not in `done` ((config id, row length) pairs measured already)."""
    return [Item(c, n) for c in configs for n in lab.row_lengths(c) if (c.id, n) not in done]


def bears_on(config: lab.Config, cols: int) -> tuple[int, ...]:
    """The row lengths of `config` whose measurements predict rows of `cols`: the lab lengths next
    below and above (one at the ends), on the same path (a thread's tiny rows apart, see
    realisation.MeasuredPrior); every one for a flat walk, which the prior reads by element count."""
    lengths = lab.row_lengths(config)
    if config.params["topology"] == codegen.FLAT:
        return lengths
    if codegen.rows_per_thread(config.params["topology"]) > 1:
        tiny = cols <= plan_inputs.TINY_ROW
        lengths = tuple(n for n in lengths if (n <= plan_inputs.TINY_ROW) == tiny) or lengths
    below = [n for n in lengths if n <= cols]
    above = [n for n in lengths if n >= cols]
    return tuple(sorted({*(below[-1:]), *(above[:1])}))


def lab_dtype(dtype: str) -> str | None:
    """The dtype the lab measures for `dtype`: itself, else the measured one of its element size."""
    if dtype in lab.DTYPES_MEASURED:
        return dtype
    return next((d for d in lab.DTYPES_MEASURED if DTYPES[d].size == DTYPES[dtype].size), None)


def grid_decisions(configs: list[lab.Config]) -> list[Decision]:
    """One decision per family, dtype and launch of the lab's grid."""
    groups: dict[tuple[str, str, int], list[lab.Config]] = {}
    for c in configs:
        for cols in lab.row_lengths(c):
            groups.setdefault((c.family, c.dtype, cols), []).append(c)
    return [Decision(f"lab grid {family} {dtype}", ((rows, cols),), tuple(members), GRID)
            for (family, dtype, cols), members in sorted(groups.items()) for rows in lab.launches(cols)]


def profile_decisions(ruleset, profiles, configs: list[lab.Config], hw: dict) -> list[Decision]:
    """Per profile, operator and dtype (as the lab measures it), a decision per workload shape among
    the profile's legal candidates that serve it (plan.plan_workload, every candidate kept), and per
    family one over every shape among those that serve them all."""
    by_id = {c.id: c for c in configs}
    found: dict[tuple, Decision] = {}

    def add(what: str, shapes, candidates, dtype: str) -> None:
        members = {cid: by_id[cid] for c in candidates if c.dtype == dtype
                   and all(math.isfinite(c.predicted_seconds[i]) for i, _ in shapes)
                   and (cid := plan.candidate_id(c.family, lab_dtype(dtype), c.params)) in by_id}
        if members:
            key = (tuple(tuple(s) for _, s in shapes), tuple(sorted(members)))
            found.setdefault(key, Decision(what, key[0], tuple(members.values()), PROFILES))

    for prof in profiles:
        planned = plan.plan_workload(ruleset, prof, hw, per_family=10**9)
        for op, (_, candidates) in planned.items():
            shapes = list(enumerate(prof.workload[op].shapes))
            for dtype in prof.workload[op].dtypes:
                for shape in shapes:
                    add(f"{prof.path.name} {op} {dtype} at {shape[1][0]}x{shape[1][1]}", [shape], candidates, dtype)
                for family in dict.fromkeys(c.family for c in candidates):
                    add(f"{prof.path.name} {op} {dtype} {family} overall", shapes,
                        [c for c in candidates if c.family == family], dtype)
    return list(found.values())


class Estimates:
    """Predicted seconds and spread of a realisation at a shape, by the prior as it stands (the
    profile measured so far: `records`, None before anything is measured). `model`: a cache of the
    model's predictions, which no measurement changes, to share between the rounds of a run."""

    def __init__(self, ruleset, hw: dict, prior=None, model: dict | None = None):
        self.ruleset, self.hw, self.prior = ruleset, hw, prior
        self._kind: dict[str, str] = {}
        self._seconds: dict[tuple[str, tuple[int, int]], float] = {}
        self._model = {} if model is None else model
        # a launch the lab ran is predicted as it measured it
        self._launches = {(r["id"], (r["rows"], r["cols"])): r["seconds"] for r in prior.profile.records} if prior else {}

    def kind(self, c: lab.Config) -> str:
        """How the prior predicts `c`: "measured" (at some of its row lengths), "twin" (as the
        family it is declared timed like, or its dtype's twin), "kin" or "model"."""
        if c.id not in self._kind:
            family = self.ruleset.families[c.family]
            timed_as = self.prior.measured_as(family, c.dtype, c.params) if self.prior else None
            if timed_as == (c.family, c.dtype):
                self._kind[c.id] = "measured"
            elif timed_as is not None:
                self._kind[c.id] = "twin"
            elif self.prior is not None and self.prior.borrowed_levels(family, c.dtype, c.params):
                self._kind[c.id] = "kin"
            else:
                self._kind[c.id] = "model"
        return self._kind[c.id]

    def seconds(self, c: lab.Config, shape: tuple[int, int]) -> float:
        key = (c.id, shape)
        if key in self._launches:
            return self._launches[key]
        if key not in self._seconds:
            family, kind = self.ruleset.families[c.family], self.kind(c)
            if kind in ("measured", "twin"):
                t = self.prior(family, c.dtype, c.params, shape)
            elif kind == "kin":
                t = self.prior.borrowed(family, c.dtype, c.params, shape)
            else:
                if key not in self._model:
                    self._model[key] = plan.predict_seconds(family, c.dtype, c.params, shape, self.hw)
                t = self._model[key]
            self._seconds[key] = t
        return self._seconds[key]

    def spread(self, c: lab.Config, cols: int, done: set[tuple[str, int]]) -> float:
        kind = self.kind(c)
        if kind == "measured":
            return SPREAD["measured" if all((c.id, n) in done for n in bears_on(c, cols)) else "elsewhere"]
        return SPREAD[kind]

    def item_seconds(self, item: Item) -> float:
        """What measuring `item` is expected to cost (cost.measure_seconds), compile aside."""
        return cost.measure_seconds(self.seconds(item.config, (rows, item.cols)) for rows in lab.launches(item.cols))


def urgencies(items: list[Item], decisions: list[Decision], estimates: Estimates,
              done: set[tuple[str, int]]) -> dict[tuple[str, int], tuple[float, ...]]:
    """Each item's urgency in each tier (infinite in a tier where no decision bears on it); `done`:
    the (config id, row length) pairs measured so far (those `estimates.prior` holds)."""
    urgency = {item.key: [math.inf] * TIERS for item in items}
    lengths_of: dict[tuple[str, int], tuple[int, ...]] = {}
    for decision in decisions:
        logs = [sum(math.log(estimates.seconds(c, s)) for s in decision.shapes) / len(decision.shapes)
                for c in decision.members]
        best = min(logs)
        for c, log_time in zip(decision.members, logs):
            lengths = set()
            for _, cols in decision.shapes:
                if (c.id, cols) not in lengths_of:
                    lengths_of[c.id, cols] = bears_on(c, cols)
                lengths.update(n for n in lengths_of[c.id, cols] if (c.id, n) in urgency)
            if not lengths:
                continue
            # as uncertain as at its least certain shape: a family's best overall mispredicted at
            # one shape takes a slot from that shape's leader (plan._best_spread)
            spread = max(estimates.spread(c, cols, done) for _, cols in decision.shapes)
            u = math.exp(log_time - spread - best)
            for n in lengths:
                mine = urgency[c.id, n]
                mine[decision.tier] = min(mine[decision.tier], u)
    return {key: tuple(u) for key, u in urgency.items()}


def order(items: list[Item], decisions: list[Decision], estimates: Estimates,
          done: set[tuple[str, int]]) -> list[tuple[Item, float]]:
    """`items` (not measured yet), most urgent first, each with its least urgency: first those that
    may change a decision (urgency below 1) of the first tier, by that urgency, then of the next
    tier, then the rest by their least urgency; the cheaper first among equals."""
    urgency = urgencies(items, decisions, estimates, done)

    def rank(item: Item) -> tuple:
        tiers = urgency[item.key]
        tier = next((t for t, u in enumerate(tiers) if u < 1), TIERS)
        return tier, tiers[tier] if tier < TIERS else min(tiers), estimates.item_seconds(item), item.key
    return [(item, min(urgency[item.key])) for item in sorted(items, key=rank)]
