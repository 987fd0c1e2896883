"""The matrix family's semantics, decided by the legality engine the row families use.

rulesets/matrix.toml adds to the rule sets (aicg/semantics/ruleset.py): the
functions the epilogue's activations evaluate, the rules only matrix
realisations use (tensor-core accumulation, split-K by atomics, epilogue
fusion) and one family per template of aicg/matrix/space.toml with the rules
it always uses and the rules a knob or the epilogue brings in. `load` merges
them into one RuleSet in which atlas.toml's `matmul` also evaluates the
activations' functions; aicg/semantics/legality.py then decides them as it
decides softmax's, with the same facts, hints and `doit explain`.

Nothing here changes the rule sets the row families read: their files, and
so every row step's key, stay as they are.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .. import tomlfile
from ..semantics import legality
from ..semantics.ruleset import Family, Function, OpSemantics, ParamRule, RuleSet, _properties
from ..semantics.ruleset import _added_error, _constraints, _patterns, Rule
from . import space

FILE = "matrix.toml"
OP = "matmul"
EPILOGUE, ACTIVATION = "epilogue", "activation"   # params of a call, not of a template's knobs
PREDICATES = {
    "true": lambda value: value is True,
    "above_one": lambda value: not isinstance(value, bool) and isinstance(value, (int, float)) and value > 1,
    "fused": lambda epilogue: epilogue.name != "plain",
    "evaluated": lambda activation: activation != "none",
    "hands_off": lambda store: store == "handoff",
}
CALL_PARAMS = {EPILOGUE: ("fused",), ACTIVATION: ("evaluated",)}
KNOB_PREDICATES = ("true", "above_one", "hands_off")


@dataclass(frozen=True)
class MatrixFamily:
    name: str
    template: str
    family: Family          # as the legality engine reads it (op "matmul", no row parameters)

    def param_rules_of(self, real: space.Realisation) -> tuple[str, ...]:
        """The rules `real` uses besides the family's own: those its knobs or its epilogue bring in."""
        found = []
        for p in self.family.param_rules:
            value = (real.epilogue if p.param == EPILOGUE else real.epilogue.activation if p.param == ACTIVATION
                     else real.settings[p.param])
            if PREDICATES[p.when](value):
                found.append(p.rule)
        return tuple(dict.fromkeys(found))

    def rules_of(self, real: space.Realisation) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.family.rules + self.param_rules_of(real)))


@dataclass(frozen=True)
class Semantics:
    ruleset: RuleSet                       # the rule sets with the matrix family's additions
    families: dict[str, MatrixFamily]      # family name -> its template and rules
    activations: dict[str, tuple[str, ...]]
    path: Path
    atlas_functions: tuple[str, ...] = ()  # what atlas.toml's matmul evaluates before any activation

    def family_of(self, template: str) -> MatrixFamily | None:
        return next((f for f in self.families.values() if f.template == template), None)

    def record(self) -> dict:
        """What the matrix family's legality reads (a step key holds it)."""
        rs = self.ruleset
        used = sorted({r for f in self.families.values() for r in f.family.rules}
                      | {p.rule for f in self.families.values() for p in f.family.param_rules})
        return {"op": rs.ops[OP].as_record(rs), "rules": {r: rs.rules[r].as_record() for r in used},
                "families": {n: {"template": f.template, **f.family.as_record()} for n, f in sorted(self.families.items())},
                "activations": {a: list(fns) for a, fns in sorted(self.activations.items())}}


def _activations(doc: tomlfile.Table, functions: dict) -> dict[str, tuple[str, ...]]:
    table = doc.table("activations")
    found = {}
    for name, t in table.tables():
        if name not in space.ACTIVATIONS:
            raise table.error(name, "an activation of the matrix family (" + ", ".join(space.ACTIVATIONS) + ")")
        found[name] = tuple(t.get("functions", list, item=str, choices=set(functions)))
        t.done()
    missing = [a for a in space.ACTIVATIONS if a not in found]
    if missing:
        raise table.error(missing[0], "a table naming the functions the activation evaluates (the key is missing)")
    return found


def _rules(doc: tomlfile.Table, base: RuleSet) -> dict[str, Rule]:
    table = doc.table("rules", default={})
    found = {}
    for name, t in table.tables():
        if name in base.rules:
            raise table.error(name, f"a rule name not already in rules.toml ({name} is)")
        found[name] = Rule(name, t.get("summary", str), t.get("acts_on", str, choices={"op", "reductions", "functions"}),
                           tuple(t.get("needs", list, item=str)), _constraints(t, "requires", base.axes),
                           _constraints(t, "inexact", base.axes), t.get("deterministic", bool), _added_error(t),
                           t.get("error", str), t.get("ref", str), _patterns(t))
        t.done()
    return found


def _param_rules(t: tomlfile.Table, knobs: dict, rules: dict) -> tuple[ParamRule, ...]:
    entries = []
    for i, item in enumerate(t.get("param_rules", list, default=[], item=dict)):
        sub = tomlfile.Table(t.file, item, t.dotted(f"param_rules[{i}]"))
        param = sub.get("param", str, choices=set(knobs) | set(CALL_PARAMS))
        when = sub.get("when", str, choices=set(CALL_PARAMS.get(param, KNOB_PREDICATES)))
        entries.append(ParamRule(param, when, sub.get("rule", str, choices=set(rules))))
        sub.done()
    return tuple(entries)


def _families(doc: tomlfile.Table, rules: dict) -> dict[str, MatrixFamily]:
    templates = space.templates()
    table = doc.table("families")
    found = {}
    for name, t in table.tables():
        template = t.get("template", str, choices=set(templates))
        if any(f.template == template for f in found.values()):
            raise t.error("template", f"a template no other family realises ({template} is taken)", template)
        tpl = templates[template]
        family = Family(name, OP, t.get("summary", str), tpl.header, tpl.function,
                        tuple(t.get("rules", list, item=str, choices=set(rules))), 1, {},
                        _param_rules(t, tpl.knobs, rules), None, space.DTYPES)
        found[name] = MatrixFamily(name, template, family)
        t.done()
    return found


def _check_needs(path: Path, families: dict[str, MatrixFamily], ruleset: RuleSet) -> None:
    """A family whose rule needs a property matmul lacks could never be legal: say so, as ruleset.py does."""
    op = ruleset.ops[OP]
    subjects = {"op": [(f"operator {OP}", op.properties)],
                "reductions": [(f"reduction {r}", ruleset.reductions[r].properties) for r in op.reductions],
                "functions": [(f"function {f}", ruleset.functions[f].properties) for f in op.functions]}
    doc = tomlfile.Table(path, {}, "")
    for f in families.values():
        for rule_name in f.family.rules + tuple(p.rule for p in f.family.param_rules):
            rule = ruleset.rules[rule_name]
            for subject, properties in subjects[rule.acts_on]:
                missing = [p for p in rule.needs if p not in properties]
                if missing:
                    raise doc.error(f"families.{f.name}.rules", f"rules whose needs {OP} meets; {rule_name} needs "
                                                                f"{subject} to be {missing[0]}, which the atlas does not state")


def load(rules_dir: Path, base: RuleSet) -> Semantics:
    """The matrix family's semantics from rules_dir/matrix.toml, merged into `base` (loaded from the same folder)."""
    path = Path(rules_dir) / FILE
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    if OP not in base.ops:
        raise doc.error("schema", f"an atlas.toml that defines ops.{OP} (the matrix family computes it)")
    functions = dict(base.functions)
    new_functions = doc.table("functions", default={})
    for name, t in new_functions.tables():
        if name in functions:
            raise new_functions.error(name, f"a function not already in atlas.toml ({name} is)")
        functions[name] = Function(name, t.get("form", str), _properties(t))
        t.done()
    activations = _activations(doc, functions)
    rules = {**base.rules, **_rules(doc, base)}
    families = _families(doc, rules)
    doc.done()
    op = base.ops[OP]
    evaluated = tuple(dict.fromkeys(op.functions + tuple(f for fns in activations.values() for f in fns)))
    merged = dataclasses.replace(
        base, functions=functions, rules=rules,
        ops={**base.ops, OP: OpSemantics(op.name, op.form, op.reductions, evaluated, op.properties)},
        families={**base.families, **{n: f.family for n, f in families.items()}})
    _check_needs(path, families, merged)
    return Semantics(merged, families, activations, path, op.functions)


@dataclass(frozen=True)
class ClassLegality:
    """Which families may compute one class of calls (a dtype and an epilogue), and why not where not."""
    legality: legality.Legality
    usable: tuple[str, ...]             # families legal with the rules the epilogue brings in
    blocked: dict[str, str]             # family -> why not (its own rules or the epilogue's)


def ruleset_for(sem: Semantics, activation: str) -> RuleSet:
    """The merged rule sets with matmul evaluating what this activation evaluates, and nothing more:
    a class's decisions name only the functions its kernels call."""
    op = sem.ruleset.ops[OP]
    functions = tuple(dict.fromkeys(sem.atlas_functions + sem.activations[activation]))
    return dataclasses.replace(sem.ruleset, ops={**sem.ruleset.ops, OP: dataclasses.replace(op, functions=functions)})


def decide(sem: Semantics, dtype: str, epilogue: space.Epilogue, pres, choice) -> ClassLegality:
    decided = legality.decide(OP, dtype, ruleset_for(sem, epilogue.activation), pres, choice)
    usable, blocked = [], {}
    for name, f in sem.families.items():
        if name not in decided.families:
            continue
        if not decided.families[name].legal:
            blocked[name] = "; ".join(fact.text() for fact in decided.families[name].facts if not fact.ok)
            continue
        call_rules = [p.rule for p in f.family.param_rules if p.param in CALL_PARAMS and
                      PREDICATES[p.when](epilogue if p.param == EPILOGUE else epilogue.activation)]
        illegal = [r for r in dict.fromkeys(call_rules) if not decided.rules[r].legal]
        if illegal:
            blocked[name] = "; ".join(fact.text() for r in illegal for fact in decided.rules[r].blocking())
            continue
        usable.append(name)
    return ClassLegality(decided, tuple(usable), blocked)
