"""Loading the rule sets in `rulesets/` into frozen records, cross-checked.

Four files, each a plain reviewed TOML: the property atlas (operators and
their properties), the preservation guide (axes and presets), the
transformation rules, and the kernel families. Any reference from one to
another (a family's operator, a rule a family uses, an axis a rule
constrains) is checked here, naming the file and key that is wrong.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from .. import tomlfile
from ..dtypes import DTYPES

HOLDS = {"real", "exact"}
# How a family template may split a row over threads (aicg/codegen.py maps each to kernels/reduce.cuh).
TOPOLOGY_NAMES = ("warp", "block", "block_staged", "block_prefetch", "thread", "thread_rows8", "lanes4", "lanes8", "lanes16",
                  "cluster2", "cluster4", "cluster8", "flat")
# Every family template takes these parameters: (type, allowed values or None).
PARAM_TYPES = {"threads": (int, None), "vec_bytes": (int, None),
               "topology": (str, set(TOPOLOGY_NAMES)), "fast_exp": (bool, None), "cache_packs": (int, None)}
TEMPLATE_PARAMS = tuple(PARAM_TYPES)
PARAM_PREDICATES = {"wider_than_element", "true", "staged", "prefetched"}


@dataclass(frozen=True)
class Property:
    name: str
    holds: str       # "real" or "exact"
    ref: str


@dataclass(frozen=True)
class Reduction:
    name: str
    form: str
    identity: str
    properties: dict[str, Property]


@dataclass(frozen=True)
class Function:
    name: str
    form: str
    properties: dict[str, Property]


@dataclass(frozen=True)
class OpSemantics:
    name: str
    form: str
    reductions: tuple[str, ...]
    functions: tuple[str, ...]
    properties: dict[str, Property]

    def as_record(self, ruleset: "RuleSet") -> dict:
        props = lambda ps: {n: {"holds": p.holds, "ref": p.ref} for n, p in sorted(ps.items())}
        return {"form": self.form, "properties": props(self.properties),
                "reductions": {r: props(ruleset.reductions[r].properties) for r in self.reductions},
                "functions": {f: props(ruleset.functions[f].properties) for f in self.functions}}


@dataclass(frozen=True)
class Axis:
    name: str
    doc: str
    values: tuple


@dataclass(frozen=True)
class Preset:
    name: str
    doc: str
    axes: dict[str, object]                      # axis -> value
    tolerance: dict[str, tuple[float, float]]    # dtype -> (rtol, atol)


@dataclass(frozen=True)
class Rounding:
    """How surely a row keeps a bound its reduction order decides (semantics/accuracy.py)."""
    failure_probability: float
    ref: str

    def as_record(self) -> dict:
        return {"failure_probability": self.failure_probability, "ref": self.ref}


@dataclass(frozen=True)
class Rule:
    name: str
    summary: str
    acts_on: str                                 # "op", "reductions" or "functions"
    needs: tuple[str, ...]
    requires: dict[str, tuple]                   # axis -> allowed values, always
    inexact: dict[str, tuple]                    # axis -> allowed values if a need holds only in reals
    deterministic: bool
    added_error: dict[str, float]                # dtype -> worst added relative error
    error: str
    ref: str
    detect: tuple[str, ...] = ()                 # regexes revealing the rule in kernel source

    def as_record(self) -> dict:
        return {"summary": self.summary, "acts_on": self.acts_on, "needs": list(self.needs),
                "requires": {k: list(v) for k, v in self.requires.items()},
                "inexact": {k: list(v) for k, v in self.inexact.items()},
                "deterministic": self.deterministic, "added_error": dict(self.added_error),
                "error": self.error, "ref": self.ref, "detect": list(self.detect)}


@dataclass(frozen=True)
class ParamRule:
    param: str
    when: str
    rule: str


@dataclass(frozen=True)
class Family:
    name: str
    op: str
    summary: str
    header: str
    function: str
    rules: tuple[str, ...]
    sweeps: int
    params: dict[str, tuple]
    param_rules: tuple[ParamRule, ...]
    timed_like: str | None = None   # a family of the same sweeps whose lab measurements stand in until its own
    dtypes: tuple[str, ...] | None = None   # the element types it realises; None: every one

    def realises(self, dtype: str) -> bool:
        return self.dtypes is None or dtype in self.dtypes

    def as_record(self) -> dict:
        return {"op": self.op, "summary": self.summary, "header": self.header, "function": self.function,
                "rules": list(self.rules), "sweeps": self.sweeps,
                "params": {k: list(v) for k, v in self.params.items()},
                "param_rules": [vars(p) for p in self.param_rules], "timed_like": self.timed_like,
                "dtypes": None if self.dtypes is None else list(self.dtypes)}


@dataclass(frozen=True)
class RuleSet:
    reductions: dict[str, Reduction]
    functions: dict[str, Function]
    ops: dict[str, OpSemantics]
    axes: dict[str, Axis]
    presets: dict[str, Preset]
    rules: dict[str, Rule]
    families: dict[str, Family]
    rounding: Rounding

    def families_of(self, op: str, dtype: str | None = None) -> list[Family]:
        """The families of `op`; given a dtype, those that realise it."""
        return [f for f in self.families.values() if f.op == op and (dtype is None or f.realises(dtype))]


def _properties(table: tomlfile.Table) -> dict[str, Property]:
    props = {}
    for name, entry in table.table("properties", default={}).tables():
        props[name] = Property(name, entry.get("holds", str, choices=HOLDS), entry.get("ref", str))
        entry.done()
    return props


def _load_atlas(path: Path):
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    reductions = {}
    for name, t in doc.table("reductions").tables():
        reductions[name] = Reduction(name, t.get("form", str), t.get("identity", str), _properties(t))
        t.done()
    functions = {}
    for name, t in doc.table("functions", default={}).tables():
        functions[name] = Function(name, t.get("form", str), _properties(t))
        t.done()
    ops = {}
    for name, t in doc.table("ops").tables():
        reds = t.get("reductions", list, default=[], item=str, choices=set(reductions))
        fns = t.get("functions", list, default=[], item=str, choices=set(functions))
        ops[name] = OpSemantics(name, t.get("form", str), tuple(reds), tuple(fns), _properties(t))
        t.done()
    doc.done()
    return reductions, functions, ops


def _load_preservation(path: Path):
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    axes = {}
    for name, t in doc.table("axes").tables():
        axes[name] = Axis(name, t.get("doc", str), tuple(t.get("values", list)))
        t.done()
    presets = {}
    for name, t in doc.table("presets").tables():
        presets[name] = Preset(name, t.get("doc", str), read_axes(t, axes, required=True),
                               read_tolerance(t, required=True))
        t.done()
    bound = doc.table("rounding")
    failure = bound.get("failure_probability", float)
    if not 0 < failure < 1:
        raise bound.error("failure_probability", "a probability strictly between 0 and 1", failure)
    rounding = Rounding(failure, bound.get("ref", str))
    bound.done()
    doc.done()
    return axes, presets, rounding


def read_axes(table: tomlfile.Table, axes: dict[str, Axis], required: bool) -> dict[str, object]:
    """The preservation axes set in `table` (all of them when `required`)."""
    values = {}
    for name, axis in axes.items():
        if required or name in table:
            kind = bool if isinstance(axis.values[0], bool) else str
            values[name] = table.get(name, kind, choices=set(axis.values))
    return values


def read_tolerance(table: tomlfile.Table, required: bool) -> dict[str, tuple[float, float]]:
    tolerance = {}
    section = table.table("tolerance") if required else table.table("tolerance", default={})
    for dtype, t in section.tables():
        tolerance[dtype] = (t.get("rtol", float), t.get("atol", float))
        for key, value in zip(("rtol", "atol"), tolerance[dtype]):
            if not (math.isfinite(value) and value >= 0):   # NaN would fail every check, inf pass any
                raise t.error(key, "a finite number >= 0", value)
        t.done()
    return tolerance


def _constraints(table: tomlfile.Table, key: str, axes: dict[str, Axis]) -> dict[str, tuple]:
    sub = table.table(key, default={})
    out = {}
    for axis in sub.keys():
        if axis not in axes:
            raise sub.error(axis, "a preservation axis (" + ", ".join(axes) + ")")
        out[axis] = tuple(sub.get(axis, list, choices=set(axes[axis].values)))
    sub.done()
    return out


def _patterns(t: tomlfile.Table) -> tuple[str, ...]:
    patterns = tuple(t.get("detect", list, default=[], item=str))
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as err:
            raise t.error("detect", f"regular expressions ({err})", pattern) from None
    return patterns


def _added_error(t: tomlfile.Table) -> dict[str, float]:
    sub = t.table("added_error", default={})
    bounds = {dtype: sub.get(dtype, float) for dtype in sub.keys()}
    for dtype, bound in bounds.items():
        if bound < 0:
            raise sub.error(dtype, "a relative error >= 0", bound)
    sub.done()
    return bounds


def _load_rules(path: Path, axes: dict[str, Axis]) -> dict[str, Rule]:
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    rules = {}
    for name, t in doc.table("rules").tables():
        rules[name] = Rule(
            name, t.get("summary", str), t.get("acts_on", str, choices={"op", "reductions", "functions"}),
            tuple(t.get("needs", list, item=str)), _constraints(t, "requires", axes),
            _constraints(t, "inexact", axes), t.get("deterministic", bool), _added_error(t),
            t.get("error", str), t.get("ref", str), _patterns(t))
        t.done()
    doc.done()
    return rules


def _family_fields(t: tomlfile.Table, base: dict, rules: dict[str, Rule]) -> dict:
    fields = dict(base)
    if "params" in t:
        params = t.table("params")
        merged = dict(fields.get("params", {}))
        for name in params.keys():
            if name not in TEMPLATE_PARAMS:
                raise params.error(name, "a template parameter (" + ", ".join(TEMPLATE_PARAMS) + ")")
            kind, choices = PARAM_TYPES[name]
            merged[name] = tuple(params.get(name, list, item=kind, choices=choices))
        params.done()
        fields["params"] = merged
    if "param_rules" in t:
        entries = []
        for i, item in enumerate(t.get("param_rules", list)):
            sub = tomlfile.Table(t.file, item, t.dotted(f"param_rules[{i}]"))
            entries.append(ParamRule(sub.get("param", str, choices=set(TEMPLATE_PARAMS)),
                                     sub.get("when", str, choices=PARAM_PREDICATES),
                                     sub.get("rule", str, choices=set(rules))))
            sub.done()
        fields["param_rules"] = tuple(entries)
    return fields


def _dtypes(t: tomlfile.Table) -> tuple[str, ...] | None:
    names = t.get("dtypes", list, default=None, item=str, choices=set(DTYPES))
    if names is not None and not names:
        raise t.error("dtypes", "at least one element type (leave the key out for every one)", names)
    return None if names is None else tuple(names)


def _load_families(path: Path, ops: dict[str, OpSemantics], rules: dict[str, Rule]) -> dict[str, Family]:
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    defaults_table = doc.table("defaults", default={})
    defaults = _family_fields(defaults_table, {}, rules)
    defaults_table.done()
    families = {}
    for name, t in doc.table("families").tables():
        fields = _family_fields(t, defaults, rules)
        params = fields.get("params", {})
        missing = [p for p in TEMPLATE_PARAMS if p not in params]
        if missing:
            raise t.error(f"params.{missing[0]}", "a list of values (here or in [defaults])")
        families[name] = Family(
            name, t.get("op", str, choices=set(ops)), t.get("summary", str), t.get("header", str),
            t.get("function", str), tuple(t.get("rules", list, item=str, choices=set(rules))),
            t.get("sweeps", int), params, fields.get("param_rules", ()), t.get("timed_like", str, default=None),
            _dtypes(t))
        t.done()
    doc.done()
    return families


def _check_families(path: Path, families: dict[str, Family], rules: dict[str, Rule], ops, reductions, functions):
    """A family whose own rules need a property its operator lacks could never be legal: say so."""
    doc = tomlfile.Table(path, {}, "")
    for family in families.values():
        twin = families.get(family.timed_like) if family.timed_like else None
        if family.timed_like and (twin is None or twin is family or twin.timed_like or twin.sweeps != family.sweeps):
            raise doc.error(f"families.{family.name}.timed_like",
                            f"another family of {family.sweeps} sweeps, itself timed by its own measurements",
                            family.timed_like)
        op = ops[family.op]
        if "flat" in family.params["topology"] and "elementwise" not in op.properties:
            raise doc.error(f"families.{family.name}.params.topology",
                            f"topologies that keep {op.name}'s rows whole: a flat walk has no rows, so only an "
                            f"operator that atlas.toml states elementwise may take it", "flat")
        subjects = {"op": [(f"operator {op.name}", op.properties)],
                    "reductions": [(f"reduction {r}", reductions[r].properties) for r in op.reductions],
                    "functions": [(f"function {f}", functions[f].properties) for f in op.functions]}
        for rule_name in family.rules:
            rule = rules[rule_name]
            for subject, properties in subjects[rule.acts_on]:
                missing = [p for p in rule.needs if p not in properties]
                if missing:
                    raise doc.error(f"families.{family.name}.rules",
                                    f"rules whose needs {op.name} meets; {rule_name} needs {subject} to be "
                                    f"{missing[0]}, which atlas.toml does not state")


FILES = ("atlas.toml", "preservation.toml", "rules.toml", "families.toml")   # what load() reads


def load(rules_dir: Path) -> RuleSet:
    rules_dir = Path(rules_dir)
    reductions, functions, ops = _load_atlas(rules_dir / "atlas.toml")
    axes, presets, rounding = _load_preservation(rules_dir / "preservation.toml")
    rules = _load_rules(rules_dir / "rules.toml", axes)
    families = _load_families(rules_dir / "families.toml", ops, rules)
    _check_families(rules_dir / "families.toml", families, rules, ops, reductions, functions)
    return RuleSet(reductions, functions, ops, axes, presets, rules, families, rounding)
