"""The legality of a pattern's rules at an instance's preservation level.

The instance carries what planned it (source/: the profile and the rule sets); a pattern's
rules are decided by the same engine (aicg/semantics/legality.py), for the operator that
replaces the pattern and the dtype it runs in, with the profile's preservation axes,
tolerances and rule choice. A rule the build could not use there, the backend cannot
either.
"""
from __future__ import annotations

from pathlib import Path

from .. import profile
from ..semantics import legality
from ..semantics import ruleset as ruleset_loader


class InstanceRules:
    def __init__(self, instance_path: Path):
        source = Path(instance_path) / "source"
        if not (source / "profile.toml").is_file():
            raise FileNotFoundError(f"{source}: no planning snapshot (profile and rule sets); the backend decides "
                                    f"a pattern's legality with the rules the instance was built with: rebuild it "
                                    f"with `doit build`")
        self.ruleset = ruleset_loader.load(source / "rulesets")
        self.profile = profile.load(source / "profile.toml", self.ruleset, source / "hwdb")
        self._decided: dict[tuple[str, str, str], legality.Decision] = {}

    @property
    def preset(self) -> str:
        return self.profile.preservation.preset

    def decide(self, rule: str, op: str, dtype: str) -> legality.Decision:
        key = (rule, op, dtype)
        if key not in self._decided:
            self._decided[key] = legality.decide_rule(self.ruleset.rules[rule], self.ruleset.ops[op], dtype,
                                                      self.ruleset, self.profile.preservation, self.profile.choice)
        return self._decided[key]

    def why_not(self, rule: str, op: str, dtype: str) -> str | None:
        """None where the rule is legal; else the facts that rule it out, in words."""
        decision = self.decide(rule, op, dtype)
        if decision.legal:
            return None
        return "; ".join(f.text() for f in decision.blocking())
