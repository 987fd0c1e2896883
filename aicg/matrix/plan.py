"""Planning a profile's matrix classes: legal realisations, ranked per shape by the prior.

For one class (dtype, layouts, epilogue; aicg/matrix/workload.py) and each
family the legality engine allows (aicg/matrix/semantics.py), the planner
forms the template's settings, drops those the target cannot run (the
template's own constraints, read against the hwdb entry) and those whose
knobs bring in a rule the profile does not allow (split-K where the order
must be the reference's), and predicts each at every workload shape it can
compute (the template takes the shape's layout and alignment, and the
accuracy bound of aicg/matrix/accuracy.py fits the dtype's rtol at its K).

Of each family it keeps `per_family` candidates, chosen to lose the least
against the family's predicted best at every workload shape (select
dispatches per shape). A family predicted DOMINATED times slower than another
at every shape it serves is not sent to the device at all (mma.sync beside
wgmma on a Hopper GPU), and the plan says so. The device's validation and
timing decide among the rest.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from . import accuracy, check, prior, space
from .calibration import Calibration
from .problem import Problem
from .space import Realisation
from .templates import RULES, GpuLimits
from .workload import MatmulClass

DOMINATED = 1.4      # a family predicted this much slower everywhere it serves is not validated
UNSERVED = 10.0      # the regret of a shape no chosen candidate serves: more than any served one's


@dataclass(frozen=True)
class Candidate:
    id: str
    cls: str                                  # the class it computes (MatmulClass.name)
    family: str
    real: Realisation
    rules: tuple[str, ...]
    predicted_seconds: tuple[float, ...]      # one per class shape; infinite where it does not serve it
    tried: int                                # its place among the space's tried settings (past the end: not tried)

    @property
    def template(self) -> str:
        return self.real.template

    def serves(self, i: int) -> bool:
        return math.isfinite(self.predicted_seconds[i])

    @property
    def served(self) -> int:
        return sum(map(math.isfinite, self.predicted_seconds))

    @property
    def score(self) -> float:
        """Geometric mean of the predicted times at the shapes it serves."""
        times = [t for t in self.predicted_seconds if math.isfinite(t)]
        return math.exp(sum(map(math.log, times)) / len(times)) if times else math.inf

    def as_record(self) -> dict:
        return {"id": self.id, "class": self.cls, "family": self.family, "template": self.template,
                "realisation": self.real.as_dict(), "rules": list(self.rules), "tried": self.tried,
                "predicted_seconds": [t if math.isfinite(t) else None for t in self.predicted_seconds]}

    @classmethod
    def from_record(cls, r: dict) -> "Candidate":
        return cls(r["id"], r["class"], r["family"], Realisation.from_dict(r["realisation"]), tuple(r["rules"]),
                   tuple(math.inf if t is None else t for t in r["predicted_seconds"]), r["tried"])


def candidate_id(real: Realisation) -> str:
    return f"matmul.{real.name}"


def settings(template: str):
    """The settings the planner ranks: every setting the space tries, and every combination of the
    knobs the prior models with each design the space tries (the values it tries of the knobs that
    only a matrix profile's calibration ranks), the other knobs at the values it tries first; a
    value of prior.TRIED_ONLY_VALUES only in the settings the space tries."""
    tpl = space.templates()[template]
    base = dict(tpl.tried[0]) if tpl.tried else {name: values[0] for name, values in tpl.knobs.items()}
    modelled = [name for name in prior.MODELLED_KNOBS.get(template, ()) if name in tpl.knobs]
    calibrated = [name for name in prior.CALIBRATED_KNOBS.get(template, ()) if name in tpl.knobs]
    designs = list(dict.fromkeys(tuple(s[n] for n in calibrated) for s in tpl.tried)) or [
        tuple(base[n] for n in calibrated)]
    tried_only = prior.TRIED_ONLY_VALUES.get(template, {})
    combined = [dict(base, **dict(zip(calibrated, design)), **dict(zip(modelled, values)))
                for design in designs for values in itertools.product(*(tpl.knobs[n] for n in modelled))]
    seen = set()
    for setting in list(tpl.tried) + [s for s in combined
                                      if not any(s[n] in values for n, values in tried_only.items())]:
        key = tuple(sorted(setting.items()))
        if key not in seen:
            seen.add(key)
            yield dict(setting)


def runnable_realisations(template: str, dtype: str, a_major: str, b_major: str, epilogue, limits: GpuLimits
                          ) -> tuple[list[Realisation], list[str]]:
    """The realisations of `template`'s planned settings that a GPU with `limits` runs (the template's
    constraints), and the names of those left out as expected to spill."""
    runnable, spilling = [], []
    for setting in settings(template):
        real = space.realisation(template, dtype, a_major, b_major, epilogue, **setting)
        if RULES[template].violations(real, limits):
            continue
        if prior.expected_to_spill(real, limits.registers_per_thread):
            spilling.append(real.name)
            continue
        runnable.append(real)
    return runnable, spilling


def splits_at(real: Realisation, problem: Problem, sm_count: int) -> int:
    """The parts an output's K sum is cut into at `problem` (one more rounding each)."""
    return check.splits_of(real.template, RULES[real.template].geometry(real, problem, sm_count, None))


@dataclass
class ClassPlan:
    cls: MatmulClass
    candidates: list[Candidate]
    rejected: list[dict]          # families, settings and shapes left out, with the reason
    rtol: float                   # the dtype's relative tolerance, which every candidate's bound fits

    def as_record(self) -> dict:
        return {**self.cls.as_record(), "rtol": self.rtol, "candidates": [c.as_record() for c in self.candidates],
                "rejected": self.rejected}


def _family_pool(cls: MatmulClass, fam, decided, hw: dict, limits: GpuLimits, rtol: float,
                 rejected: list[dict], measured: Calibration | None) -> list[Candidate]:
    template = fam.template
    tpl = space.templates()[template]
    if not tpl.runs_on(limits.compute_capability):
        need = ("exactly" if tpl.exact else "at least") + f" compute capability {tpl.compute_capability}"
        rejected.append({"family": fam.name, "by": "target", "why": f"{template} needs {need}, the target has "
                                                                      f"{tuple(limits.compute_capability)}"})
        return []
    if cls.a_major not in tpl.a_layouts or cls.b_major not in tpl.b_layouts:
        rejected.append({"family": fam.name, "by": "layout", "why": f"{template} takes A {tpl.a_layouts} and B "
                                                                      f"{tpl.b_layouts}, not {cls.a_major}{cls.b_major}"})
        return []
    problems = [Problem(m, n, k, cls.dtype, cls.a_major, cls.b_major, cls.epilogue) for m, n, k in cls.shapes]
    tried = [tuple(sorted(s.items())) for s in tpl.tried]
    sm_count = int(hw["sm_count"])
    pool, illegal, predicted = [], {}, {}
    runnable, spilling = runnable_realisations(template, cls.dtype, cls.a_major, cls.b_major, cls.epilogue, limits)
    for real in runnable:
        rules = fam.rules_of(real)
        blocked = [r for r in rules if not decided.rules[r].legal]
        if blocked:
            illegal.setdefault(blocked[0], real.name)
            continue
        times, modelled = [], prior.modelled_key(real)
        for problem in problems:
            if RULES[template].unsupported(real, problem):
                times.append(math.inf)
                continue
            # no split makes more parts than k16 steps: where even that many keep the bound, any split does
            rounded = RULES[template].rounds_sum(real)
            if not accuracy.keeps(cls.dtype, problem.k, -(-problem.k // 16), cls.epilogue, rtol, rounded) and \
                    not accuracy.keeps(cls.dtype, problem.k, splits_at(real, problem, sm_count), cls.epilogue, rtol,
                                       rounded):
                times.append(math.inf)
                continue
            key = (modelled, problem)
            if key not in predicted:
                predicted[key] = prior.predict_seconds(real, problem, hw)
            times.append(predicted[key] if measured is None else
                         measured.cautious_seconds(real, problem, predicted[key]))
        if any(map(math.isfinite, times)):
            place = tried.index(real.knobs) if real.knobs in tried else len(tried)
            pool.append(Candidate(candidate_id(real), cls.name, fam.name, real, rules, tuple(times), place))
    if spilling:
        rejected.append({"family": fam.name, "by": "prior", "why": f"{len(spilling)} settings would hold more than "
                                                                   f"{limits.registers_per_thread} registers a thread "
                                                                   f"(ptxas would spill), e.g. {spilling[0]}"})
    for rule, example in sorted(illegal.items()):
        facts = "; ".join(f.text() for f in decided.rules[rule].blocking())
        rejected.append({"family": fam.name, "by": "legality", "rule": rule,
                         "why": f"settings that use {rule} ({example}, ...) are not legal: {facts}"})
    return pool


def _chosen(pool: list[Candidate], shapes: int, count: int) -> list[Candidate]:
    """The `count` to build, chosen greedily to lose the least against the family's predicted best at
    every shape (the sum of log(time / best) over the shapes, a shape nobody chosen serves counting
    UNSERVED): one kernel rarely leads every shape, and select dispatches per shape. Ties go to the
    better overall score, then to the space's tried settings."""
    best = [min((c.predicted_seconds[i] for c in pool), default=math.inf) for i in range(shapes)]
    regret_of = {c.id: [math.log(c.predicted_seconds[i] / best[i]) if c.serves(i) else UNSERVED
                        for i in range(shapes)] for c in pool}
    current = [UNSERVED if math.isfinite(b) else 0.0 for b in best]
    chosen: list[Candidate] = []
    for _ in range(min(count, len(pool))):
        def after(c: Candidate) -> float:
            return sum(min(a, b) for a, b in zip(current, regret_of[c.id]))
        pick = min((c for c in pool if c not in chosen), key=lambda c: (after(c), c.score, c.tried, c.id))
        chosen.append(pick)
        current = [min(a, b) for a, b in zip(current, regret_of[pick.id])]
    return chosen


def _dominated(name: str, chosen: dict[str, list[Candidate]], shapes: int) -> str | None:
    """Why family `name` need not be validated: at every shape it serves another family is predicted
    DOMINATED times faster (None: it may come near somewhere; the device decides)."""
    ratios = []
    for i in range(shapes):
        own = min((c.predicted_seconds[i] for c in chosen[name]), default=math.inf)
        other = min((c.predicted_seconds[i] for f, cs in chosen.items() if f != name for c in cs), default=math.inf)
        if math.isfinite(own):
            if not math.isfinite(other):
                return None
            ratios.append(own / other)
    least = min(ratios, default=0.0)
    if least < DOMINATED:
        return None
    return (f"predicted at least {least:.2f}x slower than another family at every shape it serves "
            f"(at least {DOMINATED}x: not validated)")


def plan_class(cls: MatmulClass, sem, class_legality, hw: dict, limits: GpuLimits, rtol: float,
               per_family: int, measured: Calibration | None = None) -> ClassPlan:
    """`measured`: the target's matrix profile's calibration of the prior (None: the model alone)."""
    rejected = [{"family": f, "by": "legality", "why": why} for f, why in sorted(class_legality.blocked.items())]
    chosen: dict[str, list[Candidate]] = {}
    for name in class_legality.usable:
        pool = _family_pool(cls, sem.families[name], class_legality.legality, hw, limits, rtol, rejected, measured)
        if pool:
            chosen[name] = _chosen(pool, len(cls.shapes), per_family)
    kept = []
    for name, cands in chosen.items():
        why = _dominated(name, chosen, len(cls.shapes))
        if why:
            rejected.append({"family": name, "by": "prior", "why": why})
            continue
        kept += cands
    for i, shape in enumerate(cls.shapes):
        if not any(c.serves(i) for c in kept):
            rejected.append({"shape": list(shape), "by": "coverage",
                             "why": "no legal realisation the target runs computes this shape within the dtype's "
                                    "rtol"})
    return ClassPlan(cls, kept, rejected, rtol)
