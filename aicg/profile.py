"""The instance profile: target, preservation level, rule choice, workload.

A profile is one TOML file (rulesets/profiles/*.toml). It names a hwdb
target and a preservation preset (whose axes and tolerances it may
override), forbids or selects rules, and lists the workload: operators,
dtypes and shapes the instance is built and tuned for.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import config, tomlfile
from .dtypes import DTYPES
from .ops import OPERATORS
from .semantics.legality import Preservation, RuleChoice
from .semantics.ruleset import RuleSet, read_axes, read_tolerance


@dataclass(frozen=True)
class Workload:
    op: str
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Synthesis:
    """The repair loop: proposers asked in order, for at most `rounds` rounds."""
    proposers: tuple[str, ...]
    rounds: int
    llm: dict | None          # base_url, model, api_key_env, temperature, max_tokens, timeout


PROPOSERS = {"template", "llm"}
LLM_KEYS = {"base_url": (str, None), "model": (str, None), "api_key_env": (str, "OPENAI_API_KEY"),
            "temperature": (float, 0.0), "max_tokens": (int, 4096), "timeout": (float, 120.0)}


def _synthesis(doc: tomlfile.Table) -> Synthesis | None:
    if "synthesis" not in doc:
        return None
    t = doc.table("synthesis")
    proposers = tuple(t.get("proposers", list, default=["template"], item=str, choices=PROPOSERS))
    rounds = t.get("rounds", int, default=3)
    if rounds < 1:
        raise t.error("rounds", "an integer >= 1", rounds)
    llm = None
    if "llm" in proposers:
        lt = t.table("llm")
        llm = {key: lt.get(key, kind) if default is None else lt.get(key, kind, default=default)
               for key, (kind, default) in LLM_KEYS.items()}
        lt.done()
    elif "llm" in t:
        raise t.error("llm", "no [synthesis.llm] table unless proposers lists \"llm\"")
    t.done()
    return Synthesis(proposers, rounds, llm)


@dataclass(frozen=True)
class Profile:
    path: Path
    name: str
    target: str
    preservation: Preservation
    choice: RuleChoice
    candidates_per_family: int
    validation_trials: int
    timing_repetitions: int
    workload: dict[str, Workload]
    cache: dict          # store settings of the profile's [cache] table (see aicg/config.py)
    synthesis: Synthesis | None = None
    prior: str = "measured"   # "measured": the realisation profile where the GPU has one; "datasheet": never


def _shapes(table: tomlfile.Table) -> tuple[tuple[int, int], ...]:
    shapes = table.get("shapes", list, item=list)
    if not shapes:
        raise table.error("shapes", "at least one [rows, cols] pair", shapes)
    for shape in shapes:
        if len(shape) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape):
            raise table.error("shapes", "[rows, cols] pairs of positive integers", shape)
    return tuple((r, c) for r, c in shapes)


def _workload(doc: tomlfile.Table, ruleset: RuleSet) -> dict[str, Workload]:
    known_ops = set(ruleset.ops) & set(OPERATORS)
    merged: dict[str, tuple[list, list]] = {}
    entries = doc.get("workload", list, item=dict)
    if not entries:
        raise doc.error("workload", "at least one [[workload]] entry")
    for i, entry in enumerate(entries):
        t = tomlfile.Table(doc.file, entry, f"workload[{i}]")
        ops = t.get("ops", list, item=str, choices=known_ops)
        dtypes = t.get("dtypes", list, item=str, choices=set(DTYPES))
        shapes = _shapes(t)
        t.done()
        for op in ops:
            d, s = merged.setdefault(op, ([], []))
            d.extend(x for x in dtypes if x not in d)
            s.extend(x for x in shapes if x not in s)
    return {op: Workload(op, tuple(d), tuple(s)) for op, (d, s) in merged.items()}


def load(path: Path, ruleset: RuleSet, hwdb_dir: Path) -> Profile:
    path = Path(path)
    doc = tomlfile.read(path)
    inst = doc.table("instance")
    name = inst.get("name", str, default=path.stem)
    if not name or "/" in name or name.startswith("."):
        raise inst.error("name", "a plain folder name for build/<name>", name)
    target = inst.get("target", str)
    if not (Path(hwdb_dir) / f"{target}.toml").exists():
        known = ", ".join(sorted(p.stem for p in Path(hwdb_dir).glob("*.toml")))
        raise inst.error("target", f"a hwdb entry in {hwdb_dir}/ (one of: {known})", target)
    preset_name = inst.get("preservation", str, choices=set(ruleset.presets))
    inst.done()

    preset = ruleset.presets[preset_name]
    overrides = doc.table("preservation", default={})
    axes = {**preset.axes, **read_axes(overrides, ruleset.axes, required=False)}
    tolerance = {**preset.tolerance, **read_tolerance(overrides, required=False)}
    overrides.done()

    rules = doc.table("rules", default={})
    forbid = frozenset(rules.get("forbid", list, default=[], item=str, choices=set(ruleset.rules)))
    select = rules.get("select", list, default=None, item=str, choices=set(ruleset.rules))
    rules.done()

    plan = doc.table("plan", default={})
    per_family = plan.get("candidates_per_family", int, default=4)
    if per_family < 1:
        raise plan.error("candidates_per_family", "an integer >= 1", per_family)
    prior = plan.get("prior", str, default="measured", choices={"measured", "datasheet"})
    plan.done()

    validation = doc.table("validation", default={})
    trials = validation.get("trials", int, default=2)
    repetitions = validation.get("timing_repetitions", int, default=20)
    validation.done()

    cache = config.settings(doc.table("cache", default={}))
    synthesis = _synthesis(doc)
    workload = _workload(doc, ruleset)
    for op, w in workload.items():
        missing = [d for d in w.dtypes if d not in tolerance]
        if missing:
            raise doc.error(f"preservation.tolerance.{missing[0]}", f"a tolerance for {missing[0]} (used by {op})")
    doc.done()
    return Profile(path, name, target, Preservation(preset_name, axes, tolerance),
                   RuleChoice(forbid, frozenset(select) if select is not None else None),
                   per_family, trials, repetitions, workload, cache, synthesis, prior)
