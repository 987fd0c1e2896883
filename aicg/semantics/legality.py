"""The legality engine: which rules and families an operator may use under a
preservation level, each answer with the chain of facts that decided it.

A rule is legal for an operator when
  1. the profile does not forbid it (and selects it, if the profile selects),
  2. the operator (or each of its reductions) has every property it needs,
  3. the preservation axes allow what it `requires`, and, when a needed
     property holds in real arithmetic only, what it needs `inexact`ly.
A family is legal when every rule it always uses is legal. When no family is
legal the answer carries a hint: the axis values that would admit one.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ruleset import OpSemantics, Rule, RuleSet


@dataclass(frozen=True)
class Decision:
    legal: bool
    facts: tuple[str, ...]
    relax: tuple[tuple[str, object], ...] = ()   # axis values that would make it legal

    def as_record(self) -> dict:
        return {"legal": self.legal, "facts": list(self.facts)}


@dataclass(frozen=True)
class Preservation:
    """The resolved preservation level of a profile: a preset with overrides."""
    preset: str
    axes: dict[str, object]
    tolerance: dict[str, tuple[float, float]]

    def as_record(self) -> dict:
        return {"preset": self.preset, "axes": self.axes,
                "tolerance": {d: {"rtol": r, "atol": a} for d, (r, a) in sorted(self.tolerance.items())}}


@dataclass(frozen=True)
class RuleChoice:
    """Rules a profile forbids, and (if not None) the only rules it selects."""
    forbid: frozenset[str]
    select: frozenset[str] | None


def _needed_properties(rule: Rule, op: OpSemantics, ruleset: RuleSet):
    """(subject, property name, Property or None) for each property the rule needs of this op."""
    if rule.acts_on == "op":
        return [(f"operator {op.name}", p, op.properties.get(p)) for p in rule.needs]
    return [(f"reduction {r} of {op.name}", p, ruleset.reductions[r].properties.get(p))
            for r in op.reductions for p in rule.needs]


def _check_axes(constraints: dict[str, tuple], axes: dict[str, object], why: str, facts: list, relax: list) -> bool:
    ok = True
    for axis, allowed in constraints.items():
        value = axes[axis]
        allowed_text = ", ".join(map(repr, allowed))
        if value in allowed:
            facts.append(f"{why} needs {axis} in ({allowed_text}); the profile has {value!r}: allowed")
        else:
            facts.append(f"{why} needs {axis} in ({allowed_text}); the profile has {value!r}: not allowed")
            relax.append((axis, allowed[0]))
            ok = False
    return ok


def decide_rule(rule: Rule, op: OpSemantics, ruleset: RuleSet, pres: Preservation, choice: RuleChoice) -> Decision:
    facts: list[str] = []
    relax: list[tuple[str, object]] = []
    if rule.name in choice.forbid:
        return Decision(False, (f"the profile forbids rule {rule.name} (rules.forbid)",))
    if choice.select is not None and rule.name not in choice.select:
        return Decision(False, (f"the profile selects rules {sorted(choice.select)} (rules.select), not {rule.name}",))

    inexact = False
    for subject, name, prop in _needed_properties(rule, op, ruleset):
        if prop is None:
            return Decision(False, (f"{rule.name} needs {subject} to be {name}; the atlas does not say it is",))
        facts.append(f"{rule.name} needs {subject} to be {name}: holds {'exactly in floating point' if prop.holds == 'exact' else 'in real arithmetic only'} ({prop.ref})")
        inexact |= prop.holds == "real"
    ok = _check_axes(rule.requires, pres.axes, rule.name, facts, relax)
    if inexact:
        ok &= _check_axes(rule.inexact, pres.axes, f"using a real-only property, {rule.name}", facts, relax)
    elif rule.inexact:
        facts.append(f"every property {rule.name} needs holds exactly, so its order constraint does not apply")
    if not facts:
        facts.append(f"{rule.name} needs no property of {op.name} and no preservation permission")
    if not rule.deterministic and pres.axes.get("deterministic"):
        facts.append(f"{rule.name} is not deterministic; the profile demands determinism")
        relax.append(("deterministic", False))
        ok = False
    return Decision(ok, tuple(facts), tuple(relax))


@dataclass(frozen=True)
class Legality:
    op: str
    rules: dict[str, Decision]
    families: dict[str, Decision]
    hint: str | None

    def legal_families(self) -> list[str]:
        return [name for name, d in self.families.items() if d.legal]

    def as_record(self) -> dict:
        return {"op": self.op,
                "rules": {n: d.as_record() for n, d in sorted(self.rules.items())},
                "families": {n: d.as_record() for n, d in sorted(self.families.items())},
                "legal_families": self.legal_families(), "hint": self.hint}


def _hint(op: str, rules: dict[str, Decision], families: list, ruleset: RuleSet, pres: Preservation) -> str:
    changes = {}
    for family in families:
        for rule in family.rules:
            changes.update(dict(rules[rule].relax))
    if not changes:
        return f"no family of {op} can be made legal by a preservation setting; unforbid its rules or add a family"
    presets = [p.name for p in ruleset.presets.values() if all(p.axes[a] == v for a, v in changes.items())]
    text = "set " + ", ".join(f"{a} = {v!r}" for a, v in sorted(changes.items()))
    if presets:
        text += f" (as preset {presets[0]!r} does)"
    return f"no legal family for {op}; {text} to allow: " + ", ".join(f.name for f in families)


def decide(op_name: str, ruleset: RuleSet, pres: Preservation, choice: RuleChoice) -> Legality:
    op = ruleset.ops[op_name]
    families = ruleset.families_of(op_name)
    used = sorted({r for f in families for r in f.rules} | {p.rule for f in families for p in f.param_rules})
    rules = {r: decide_rule(ruleset.rules[r], op, ruleset, pres, choice) for r in used}
    fams = {}
    for family in families:
        blocked = [r for r in family.rules if not rules[r].legal]
        if blocked:
            fams[family.name] = Decision(False, tuple(f"uses {r}, which is not legal here" for r in blocked))
        else:
            fams[family.name] = Decision(True, tuple(f"uses {r}: legal" for r in family.rules))
    hint = None if any(d.legal for d in fams.values()) else _hint(op_name, rules, families, ruleset, pres)
    return Legality(op_name, rules, fams, hint)
