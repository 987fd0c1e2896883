"""The legality engine: which rules and families an operator may use under a
preservation level, in one dtype, each answer with the facts that decided it.

A rule is legal for (operator, dtype) when
  1. the profile does not forbid it (and selects it, if the profile selects);
  2. the operator, or each reduction or function it uses (the rule's
     `acts_on`), has every property the rule needs;
  3. the preservation axes allow what the rule `requires`, and, when a needed
     property holds in real arithmetic only, what it needs `inexact`ly;
  4. the error it adds (`added_error`) fits the profile's rtol for the dtype;
  5. it is deterministic, or the profile does not demand determinism.
A family is legal when every rule it always uses is legal; a family that does
not realise the dtype (families.toml `dtypes`) is not considered at all. When no family is
legal the answer carries a hint: what blocked each family, and the axis
values that would admit one.

Facts are structured (`kind`, `ok`, fields), so tests and tools compare the
facts cited, and rendered to text for people by one table of templates.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ruleset import OpSemantics, Rule, RuleSet

TEXT = {
    "forbidden": "the profile forbids {rule} (rules.forbid)",
    "not_selected": "the profile selects only {selected} (rules.select), not {rule}",
    "property": "{rule} needs {subject} to be {property}: {holds_text}",
    "axis": "{rule} needs {axis} in {allowed}{why}; the profile has {value!r}",
    "inexact_waived": "every property {rule} needs holds exactly, so its inexact-only constraints do not apply",
    "error_bound": "{rule} adds up to {added:.3g} relative error in {dtype}; the profile allows rtol {rtol:.3g}",
    "nondeterministic": "{rule} is not deterministic; the profile demands determinism",
    "no_needs": "{rule} needs no property and no preservation permission",
    "uses": "{family} uses {rule}, which is {legal_text}",
    "no_family": "no kernel family implements {op} yet",
}


@dataclass(frozen=True)
class Fact:
    kind: str
    ok: bool
    fields: tuple[tuple[str, object], ...]

    @classmethod
    def of(cls, kind: str, ok: bool, **fields) -> "Fact":
        return cls(kind, ok, tuple(sorted(fields.items())))

    def __getitem__(self, key: str):
        return dict(self.fields)[key]

    def text(self) -> str:
        f = dict(self.fields)
        holds = {"exact": "holds exactly in floating point", "real": "holds in real arithmetic only",
                 "absent": "the atlas does not say it holds"}
        f.setdefault("holds_text", holds.get(f.get("holds"), "") + (f" ({f['ref']})" if f.get("ref") else ""))
        f.setdefault("why", " when a property holds in real arithmetic only" if f.get("when") == "inexact" else "")
        f.setdefault("legal_text", "legal" if f.get("legal") else "not legal here")
        if "allowed" in f:
            f["allowed"] = "(" + ", ".join(map(repr, f["allowed"])) + ")"
        return TEXT[self.kind].format(**f)

    def as_record(self) -> dict:
        return {"kind": self.kind, "ok": self.ok, **{k: list(v) if isinstance(v, tuple) else v for k, v in self.fields},
                "text": self.text()}


@dataclass(frozen=True)
class Decision:
    legal: bool
    facts: tuple[Fact, ...]
    relax: tuple[tuple[str, object], ...] = ()   # axis values that would make it legal

    def blocking(self) -> list[Fact]:
        return [f for f in self.facts if not f.ok]

    def as_record(self) -> dict:
        return {"legal": self.legal, "facts": [f.as_record() for f in self.facts]}


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


def _subjects(rule: Rule, op: OpSemantics, ruleset: RuleSet) -> list[tuple[str, dict]]:
    """(name, properties) of what the rule acts on for this operator."""
    if rule.acts_on == "op":
        return [(f"operator {op.name}", op.properties)]
    if rule.acts_on == "reductions":
        return [(f"reduction {r} of {op.name}", ruleset.reductions[r].properties) for r in op.reductions]
    return [(f"function {fn} of {op.name}", ruleset.functions[fn].properties) for fn in op.functions]


def _axis_facts(rule: Rule, constraints: dict, axes: dict, when: str) -> list[Fact]:
    return [Fact.of("axis", axes[axis] in allowed, rule=rule.name, axis=axis, allowed=tuple(allowed),
                    value=axes[axis], when=when)
            for axis, allowed in constraints.items()]


def decide_rule(rule: Rule, op: OpSemantics, dtype: str, ruleset: RuleSet, pres: Preservation,
                choice: RuleChoice) -> Decision:
    if rule.name in choice.forbid:
        return Decision(False, (Fact.of("forbidden", False, rule=rule.name),))
    if choice.select is not None and rule.name not in choice.select:
        return Decision(False, (Fact.of("not_selected", False, rule=rule.name, selected=tuple(sorted(choice.select))),))

    facts: list[Fact] = []
    inexact = False
    for subject, properties in _subjects(rule, op, ruleset):
        for name in rule.needs:
            prop = properties.get(name)
            holds = prop.holds if prop else "absent"
            facts.append(Fact.of("property", prop is not None, rule=rule.name, subject=subject, property=name,
                                 holds=holds, ref=prop.ref if prop else ""))
            inexact |= holds == "real"
    facts += _axis_facts(rule, rule.requires, pres.axes, "always")
    if inexact:
        facts += _axis_facts(rule, rule.inexact, pres.axes, "inexact")
    elif rule.inexact and rule.needs:
        facts.append(Fact.of("inexact_waived", True, rule=rule.name))
    if dtype in rule.added_error:
        rtol = pres.tolerance[dtype][0]
        facts.append(Fact.of("error_bound", rule.added_error[dtype] <= rtol, rule=rule.name, dtype=dtype,
                             added=rule.added_error[dtype], rtol=rtol))
    if not rule.deterministic and pres.axes["deterministic"]:
        facts.append(Fact.of("nondeterministic", False, rule=rule.name))
    if not facts:
        facts.append(Fact.of("no_needs", True, rule=rule.name))

    relax = [(f["axis"], f["allowed"][0]) for f in facts if f.kind == "axis" and not f.ok]
    relax += [("deterministic", False)] * any(f.kind == "nondeterministic" for f in facts)
    return Decision(all(f.ok for f in facts), tuple(facts), tuple(relax))


@dataclass(frozen=True)
class Legality:
    op: str
    dtype: str
    rules: dict[str, Decision]
    families: dict[str, Decision]
    hint: str | None

    def legal_families(self) -> list[str]:
        return [name for name, d in self.families.items() if d.legal]

    def as_record(self) -> dict:
        return {"op": self.op, "dtype": self.dtype,
                "rules": {n: d.as_record() for n, d in sorted(self.rules.items())},
                "families": {n: d.as_record() for n, d in sorted(self.families.items())},
                "legal_families": self.legal_families(), "hint": self.hint}


def _reason(rule: str, decision: Decision) -> str:
    """Why a rule is illegal, in one sentence that names the facts behind the constraint."""
    parts = []
    for fact in decision.blocking():
        if fact.kind == "axis" and fact["when"] == "inexact":
            real = [f for f in decision.facts if f.kind == "property" and f["holds"] == "real"]
            why = ", ".join(f"{f['subject']} is {f['property']} in real arithmetic only ({f['ref']})" for f in real)
            parts.append(f"{why}, so it needs {fact['axis']} in {fact['allowed']}, not {fact['value']!r}")
        else:
            parts.append(fact.text())
    return f"{rule}: " + "; ".join(parts) + "."


def _hint(op: str, dtype: str, rules: dict[str, Decision], families: list, ruleset: RuleSet) -> str:
    if not families:
        return (f"no kernel family implements {op} in {dtype} yet: add one to rulesets/families.toml with its "
                f"template in kernels/")
    reasons: dict[str, None] = {}
    changes: dict[str, object] = {}
    for family in families:
        for rule in family.rules:
            if not rules[rule].legal:
                reasons.setdefault(_reason(rule, rules[rule]), None)
            changes.update(dict(rules[rule].relax))
    text = f"no legal family for {op} in {dtype}. " + " ".join(reasons).rstrip(".")
    if changes:
        presets = [p.name for p in ruleset.presets.values() if all(p.axes[a] == v for a, v in changes.items())]
        text += ". Set " + ", ".join(f"{a} = {v!r}" for a, v in sorted(changes.items()))
        text += f" (as preset {presets[0]!r} does)" if presets else ""
        text += " to allow " + ", ".join(f.name for f in families)
    return text


def decide(op_name: str, dtype: str, ruleset: RuleSet, pres: Preservation, choice: RuleChoice) -> Legality:
    op = ruleset.ops[op_name]
    families = ruleset.families_of(op_name, dtype)
    used = sorted({r for f in families for r in f.rules} | {p.rule for f in families for p in f.param_rules})
    rules = {r: decide_rule(ruleset.rules[r], op, dtype, ruleset, pres, choice) for r in used}
    fams = {f.name: Decision(all(rules[r].legal for r in f.rules),
                             tuple(Fact.of("uses", rules[r].legal, family=f.name, rule=r, legal=rules[r].legal)
                                   for r in f.rules))
            for f in families}
    hint = None if any(d.legal for d in fams.values()) else _hint(op_name, dtype, rules, families, ruleset)
    return Legality(op_name, dtype, rules, fams, hint)


def selection_conflicts(ruleset: RuleSet, pres: Preservation, choice: RuleChoice, dtypes) -> list[str]:
    """Selected rules that the preservation level itself rules out (whatever the operator)."""
    conflicts = []
    for name in sorted(choice.select or ()):
        rule = ruleset.rules[name]
        facts = _axis_facts(rule, rule.requires, pres.axes, "always")
        facts += [Fact.of("error_bound", rule.added_error[d] <= pres.tolerance[d][0], rule=name, dtype=d,
                          added=rule.added_error[d], rtol=pres.tolerance[d][0]) for d in dtypes if d in rule.added_error]
        if not rule.deterministic and pres.axes["deterministic"]:
            facts.append(Fact.of("nondeterministic", False, rule=name))
        conflicts += [f"rules.select names {name}, but {f.text()}" for f in facts if not f.ok]
    return conflicts


def decide_all(op_name: str, dtypes, ruleset: RuleSet, pres: Preservation, choice: RuleChoice) -> dict[str, Legality]:
    return {d: decide(op_name, d, ruleset, pres, choice) for d in dtypes}
