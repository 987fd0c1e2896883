"""The instance profile: target, preservation level, rule choice, workload.

A profile is one TOML file (rulesets/profiles/*.toml). It names a hwdb
target and a preservation preset (whose axes and tolerances it may
override), forbids or selects rules, and lists the workload: operators,
dtypes and shapes the instance is built and tuned for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import config, hw, tomlfile
from .dtypes import DTYPES
from .errors import UnknownTarget
from .matrix import workload as matrix_workload
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


# Limits (docs/inputs.md): planning predicts every candidate at every workload shape when the
# graph is loaded, so `doit list` costs about 5 ms per operator, dtype and shape.
MAX_SHAPES_PER_OPERATOR = 64
MAX_DIMENSION = 2**31 - 1      # the kernels index rows and columns with int
# An instance's name becomes a folder, build/<name>: the rule of a target's name (hwdb/<target>.toml).
PLAIN_NAME = hw.TARGET_NAME
PLAIN_NAME_RULE = "up to 100 letters, digits, '.', '_', '+' or '-', starting with a letter or digit"

PROPOSERS = {"template", "llm"}
LLM_KEYS = {"base_url": (str, None), "model": (str, None), "api_key_env": (str, "OPENAI_API_KEY"),
            "temperature": (float, 0.0), "max_tokens": (int, 4096), "timeout": (float, 120.0)}
LLM_LIMITS = {   # NaN fails every comparison, so each of these refuses it
    "base_url": (lambda url: url.startswith(("http://", "https://")) and bool(url.split("://", 1)[1].split("/")[0]),
                 "an http:// or https:// URL with a host"),
    "temperature": (lambda t: 0 <= t < math.inf, "a finite number >= 0"),
    "max_tokens": (lambda n: n >= 1, "an integer >= 1"),
    "timeout": (lambda t: 0 < t < math.inf, "a positive finite number of seconds"),
}


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
        for key, (ok, expected) in LLM_LIMITS.items():
            if not ok(llm[key]):
                raise lt.error(key, expected, llm[key])
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
    matmul: tuple = ()        # the [[matmul]] classes (aicg/matrix/workload.py): dtype, layouts, epilogue, shapes


def _shapes(table: tomlfile.Table) -> tuple[tuple[int, int], ...]:
    shapes = table.get("shapes", list, item=list)
    if not shapes:
        raise table.error("shapes", "at least one [rows, cols] pair", shapes)
    for shape in shapes:
        if len(shape) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_DIMENSION
                                      for n in shape):
            raise table.error("shapes", f"[rows, cols] pairs of positive integers of at most {MAX_DIMENSION} "
                                        "(the kernels index rows and columns with int)", shape)
    return tuple((r, c) for r, c in shapes)


def shape_bytes(op: str, dtype: str, shape: tuple[int, int]) -> int:
    """The bytes of the tensors one call of `op` reads and writes at `shape` (what validation allocates)."""
    rows, cols = shape
    operator = OPERATORS[op]
    matrices = len(operator.input_matrices()) + (operator.output == "matrix")
    return DTYPES[dtype].size * (matrices * rows * cols + len(operator.vectors) * cols
                                 + (rows if operator.output == "rows" else 0))


def oversized(ops, dtypes, shapes, hardware: hw.Hardware) -> str | None:
    """What says that a shape's tensors do not fit the target's memory, or None where all fit."""
    capacity = hardware.fact("dram_capacity")
    for shape in shapes:
        need, op, dtype = max((shape_bytes(op, dtype, shape), op, dtype) for op in ops for dtype in dtypes)
        if need > capacity:
            return (f"shapes with tensors that fit the memory of {hardware.target} ({capacity / 2**30:.1f} GiB): "
                    f"{op} in {dtype} at {shape[0]} x {shape[1]} needs {need / 2**30:.1f} GiB")
    return None


def _workload(doc: tomlfile.Table, ruleset: RuleSet, hardware: hw.Hardware, required: bool) -> dict[str, Workload]:
    """The row operators' workload; `required`: the profile names no matrix multiply either."""
    known_ops = set(ruleset.ops) & set(OPERATORS)
    merged: dict[str, tuple[dict, dict]] = {}   # op -> (dtypes, shapes), each in first-seen order
    if "workload" not in doc and required:
        raise doc.error("workload", "an array of [[workload]] entries (the key is missing; a profile of matrix "
                                    "multiplies alone has [[matmul]] entries instead)")
    entries = doc.get("workload", list, item=dict, default=[])
    if not entries:
        if not required:
            return {}
        raise doc.error("workload", "at least one [[workload]] entry (or a [[matmul]] entry)")
    for i, entry in enumerate(entries):
        t = tomlfile.Table(doc.file, entry, f"workload[{i}]")
        ops = t.get("ops", list, item=str, choices=known_ops)
        if not ops:
            raise t.error("ops", "at least one operator", ops)
        dtypes = t.get("dtypes", list, item=str, choices=set(DTYPES))
        if not dtypes:
            raise t.error("dtypes", "at least one dtype", dtypes)
        shapes = _shapes(t)
        t.done()
        for op in ops:
            d, s = merged.setdefault(op, ({}, {}))
            d.update(dict.fromkeys(dtypes))
            for shape in shapes:
                s[shape] = None
                if len(s) > MAX_SHAPES_PER_OPERATOR:
                    raise doc.error("workload", f"at most {MAX_SHAPES_PER_OPERATOR} distinct shapes per operator "
                                                f"(the JIT serves other shapes at run time)",
                                    f"more than {MAX_SHAPES_PER_OPERATOR} for {op}")
        too_big = oversized(ops, dtypes, dict.fromkeys(shapes), hardware)
        if too_big:
            raise t.error("shapes", too_big)
    return {op: Workload(op, tuple(d), tuple(s)) for op, (d, s) in merged.items()}


def load(path: Path, ruleset: RuleSet, hwdb_dir: Path) -> Profile:
    path = Path(path)
    doc = tomlfile.read(path)
    inst = doc.table("instance")
    name = inst.get("name", str, default=path.stem)
    if not PLAIN_NAME.fullmatch(name):
        raise inst.error("name", f"a plain folder name for build/<name>: {PLAIN_NAME_RULE}", name)
    target = inst.get("target", str)
    if not PLAIN_NAME.fullmatch(target) or not (Path(hwdb_dir) / f"{target}.toml").exists():
        known = ", ".join(sorted(p.stem for p in Path(hwdb_dir).glob("*.toml")))
        raise UnknownTarget(inst.file, inst.dotted("target"), f"a hwdb entry in {hwdb_dir}/, by its name (one of: {known})",
                            target)
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
    for key, value in (("trials", trials), ("timing_repetitions", repetitions)):
        if value < 1:   # zero trials would pass any kernel; zero repetitions time it as a median of nothing
            raise validation.error(key, "an integer >= 1", value)
    validation.done()

    cache = config.settings(doc.table("cache", default={}))
    synthesis = _synthesis(doc)
    hardware = hw.load_target(hwdb_dir, target)
    matmul = matrix_workload.read(doc, hardware.fact("dram_capacity"), target)
    workload = _workload(doc, ruleset, hardware, required=not matmul)
    used = [(d, op) for op, w in workload.items() for d in w.dtypes] + [(c.dtype, "matmul") for c in matmul]
    for dtype, op in used:
        if dtype not in tolerance:
            raise doc.error(f"preservation.tolerance.{dtype}", f"a tolerance for {dtype} (used by {op})")
    doc.done()
    return Profile(path, name, target, Preservation(preset_name, axes, tolerance),
                   RuleChoice(forbid, frozenset(select) if select is not None else None),
                   per_family, trials, repetitions, workload, cache, synthesis, prior, matmul)
