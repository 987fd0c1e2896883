"""What planning an instance reads, loaded once: rule sets, profile, target, plan inputs, prior.

The build (aicg/tasks/graph.py) plans the profile's workload with it, for the
profile's target or the one `target=` names (aicg/target.py); the runtime's
JIT (aicg/runtime/jit.py) plans one new shape with the same inputs, read from
the snapshot an instance carries.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import hw, plan, plan_inputs, profile
from . import target as targets
from .primitives import realisation
from .semantics import legality
from .semantics import ruleset as ruleset_loader


@dataclass(frozen=True)
class Planning:
    rules: object
    prof: profile.Profile
    hardware: hw.Hardware
    inputs: dict                      # plan input name -> resolved input (value and source)
    hw_facts: dict                    # plan input name -> value
    realised: realisation.Profile | None
    measured: realisation.MeasuredPrior | None

    def best_for_shape(self, op: str, dtype: str, shape: tuple[int, int], per_family: int = 3) -> list[plan.Candidate]:
        """Each legal family's `per_family` predicted best candidates for one shape, fastest first
        (several per family: a runner-up of the best family is a better fallback than the nearest
        tuned shape's kernel, which may split rows a thousand times too wide)."""
        decided = legality.decide_all(op, (dtype,), self.rules, self.prof.preservation, self.prof.choice)
        bounds = {dtype: self.prof.preservation.tolerance[dtype][0]}
        found = plan.plan_op(op, decided, self.rules.families_of(op), (dtype,), (tuple(shape),), self.hw_facts,
                             per_family=per_family, measured=self.measured, bounds=bounds, rejected=[],
                             ruleset=self.rules)
        return sorted(found, key=lambda c: (c.predicted_seconds[0], c.id))


def load(rules_dir: Path, profile_path: Path, hwdb_dir: Path, target: str | None = None) -> Planning:
    """`target`: as `doit build target=` gives it (None or "": the profile's own; "auto": the entry
    of this machine's GPU; else an entry of hwdb_dir)."""
    rules = ruleset_loader.load(rules_dir)
    prof = profile.load(profile_path, rules, hwdb_dir)
    if target:
        device = targets.present_device() if target == targets.AUTO else None
        prof = targets.retarget(prof, targets.resolve(target, hwdb_dir, device))
    hardware = hw.load_target(hwdb_dir, prof.target)
    inputs = plan_inputs.resolve(hardware)
    hw_facts = {name: inputs[name].value for name in plan.PLAN_INPUTS}
    realised = realisation.load(realisation.path_for(hwdb_dir, prof.target)) if prof.prior == "measured" else None
    measured = realisation.MeasuredPrior(realised, hw_facts) if realised else None
    return Planning(rules, prof, hardware, inputs, hw_facts, realised, measured)
