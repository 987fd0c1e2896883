"""The backward families and their ladders (families.toml), and which of them are legal.

Legality is the forward's engine (aicg/semantics/legality.py) on the instance's own rule sets,
extended with the backward operators and families: the rules a family uses are decided for its
operator's reductions and functions under the profile's preservation level and rule choice, and
a candidate also needs the rules its parameters bring (wider packs: vector_loads; held rows:
register_staging). A backward operator is served by kernels only where every part it has (the
rows; the columns for a norm's weight) has a legal family.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from .. import tomlfile
from ..codegen import blocks_per_row, lanes_per_row
from ..dtypes import DTYPES
from ..semantics import accuracy, legality
from ..semantics.ruleset import Family, OpSemantics, ParamRule, RuleSet
from .ops import BACKWARD_OPS, BackwardOp

SPACE_FILE = Path(__file__).with_name("families.toml")
COLUMN_OP = "column_sum"
PARTS = ("rows", "columns")
ROW_TOPOLOGIES = ("warp", "block", "thread", "lanes4", "lanes8", "lanes16", "cluster2", "cluster4")
HELD_ONLY_TOPOLOGIES = ("cluster2", "cluster4")   # rows split over blocks: the one-pass norms' only
PACK_BYTES = (4, 8, 16)
COLUMN_LANES = (8, 16, 32)
MAX_GRID_Y = 65535
STATIC_SHARED_BYTES = 48 * 1024
# Rules a candidate uses because of its parameters (as rulesets/families.toml's param_rules).
PARAM_RULES = {
    "rows": (ParamRule("vec_bytes", "wider_than_element", "vector_loads"),
             ParamRule("cache_packs", "true", "register_staging")),
    "columns": (ParamRule("vec_bytes", "wider_than_element", "vector_loads"),),
}
_WHEN = {"wider_than_element": lambda value, dtype: value > DTYPES[dtype].size, "true": lambda value, dtype: bool(value)}
ROW_KEYS = {"threads": int, "topology": str, "vec_bytes": int, "cache_packs": int}
COLUMN_KEYS = {"threads": int, "col_lanes": int, "vec_bytes": int, "chunk_rows": int}


@dataclass(frozen=True)
class Rung:
    """One ladder entry: parameters, and the longest rows it serves (None: any) and the shortest."""
    params: dict
    cols: int | None
    min_cols: int = 1

    def serves(self, cols: int) -> bool:
        return (self.cols is None or cols <= self.cols) and cols >= self.min_cols


@dataclass(frozen=True)
class BackwardFamily:
    name: str
    op: str
    part: str               # "rows" or "columns"
    summary: str
    header: str             # under kernels/
    function: str | None    # None: a column family whose partial sums a rows family writes
    totals: str | None      # a column family's second pass
    rules: tuple[str, ...]
    sweeps: int
    ladder: tuple[Rung, ...]
    max_chunks: int | None  # a column family's most chunks of rows
    columns: str | None = None   # a rows family that writes this column family's partial sums itself

    @property
    def partials_from_rows(self) -> bool:
        return self.part == "columns" and self.function is None

    def engine_family(self) -> Family:
        """The family as the legality engine reads one."""
        keys = ROW_KEYS if self.part == "rows" else COLUMN_KEYS
        params = {k: tuple(sorted({r.params[k] for r in self.ladder})) for k in keys}
        return Family(self.name, self.op, self.summary, self.header, self.function or self.totals, self.rules,
                      self.sweeps, params, PARAM_RULES[self.part])


@dataclass(frozen=True)
class Space:
    ops: dict[str, OpSemantics]             # the backward operators and column_sum, as the atlas states operators
    parts: dict[str, tuple[str, ...]]       # backward operator -> its parts
    families: dict[str, BackwardFamily]

    def families_of(self, op: str) -> list[BackwardFamily]:
        return [f for f in self.families.values() if f.op == op]

    def extend(self, ruleset: RuleSet) -> RuleSet:
        """`ruleset` with the backward operators and families beside its own."""
        return dataclasses.replace(ruleset, ops={**ruleset.ops, **self.ops},
                                   families={**ruleset.families,
                                             **{n: f.engine_family() for n, f in self.families.items()}})


@dataclass(frozen=True)
class Candidate:
    """A backward operator's kernels in one dtype: its rows family and parameters, and for a norm its
    column family and parameters; compiled together into one cubin."""
    op: str
    dtype: str
    rows_family: str
    rows: dict
    columns_family: str | None = None
    columns: dict | None = None
    partials_in_rows: bool = False    # the rows part writes the column sums' partials (no first column pass)

    @property
    def id(self) -> str:
        p = self.rows
        text = f"{self.rows_family}.{self.dtype}.t{p['threads']}.v{p['vec_bytes']}.{p['topology']}.c{p['cache_packs']}"
        if self.columns:
            c = self.columns
            text += f"+{self.columns_family}.t{c['threads']}.l{c['col_lanes']}.v{c['vec_bytes']}.r{c['chunk_rows']}"
        return text

    def as_record(self) -> dict:
        return {"op": self.op, "dtype": self.dtype, "rows_family": self.rows_family, "rows": self.rows,
                "columns_family": self.columns_family, "columns": self.columns,
                "partials_in_rows": self.partials_in_rows}

    @classmethod
    def from_record(cls, record: dict) -> "Candidate":
        return cls(record["op"], record["dtype"], record["rows_family"], dict(record["rows"]),
                   record.get("columns_family"), dict(record["columns"]) if record.get("columns") else None,
                   bool(record.get("partials_in_rows", False)))


# --- loading ------------------------------------------------------------------------------

def _rung(table: tomlfile.Table, keys: dict, part: str) -> Rung:
    params = {k: table.get(k, kind) for k, kind in keys.items()}
    cols = table.get("cols", int, default=None)
    if cols is not None and cols < 1:
        raise table.error("cols", "a row length >= 1 (leave the key out for every length)", cols)
    min_cols = table.get("min_cols", int, default=1)
    if min_cols < 1 or (cols is not None and min_cols > cols):
        raise table.error("min_cols", f"a row length from 1 to {cols if cols is not None else 'any'}", min_cols)
    if params["vec_bytes"] not in PACK_BYTES:
        raise table.error("vec_bytes", "one of " + ", ".join(map(str, PACK_BYTES)), params["vec_bytes"])
    if part == "rows":
        if params["topology"] not in ROW_TOPOLOGIES:
            raise table.error("topology", "one of " + ", ".join(ROW_TOPOLOGIES), params["topology"])
        if params["threads"] % 32 or not 32 <= params["threads"] <= 1024:
            raise table.error("threads", "a multiple of 32 from 32 to 1024", params["threads"])
        if params["cache_packs"] < 0:
            raise table.error("cache_packs", "an integer >= 0", params["cache_packs"])
    else:
        if params["col_lanes"] not in COLUMN_LANES:
            raise table.error("col_lanes", "one of " + ", ".join(map(str, COLUMN_LANES)), params["col_lanes"])
        threads = params["threads"]
        if threads % 32 or threads % params["col_lanes"] or not 64 <= threads <= 512:
            raise table.error("threads", "a multiple of 32 and of col_lanes from 64 to 512", threads)
        # the first pass folds two sums of a pack a thread in static shared memory
        if 2 * threads * params["vec_bytes"] > STATIC_SHARED_BYTES:
            raise table.error("threads", f"at most {STATIC_SHARED_BYTES // (2 * params['vec_bytes'])} threads for "
                                         f"{params['vec_bytes']}-byte packs (shared memory)", threads)
        if params["chunk_rows"] < 1:
            raise table.error("chunk_rows", "an integer >= 1", params["chunk_rows"])
    table.done()
    return Rung(params, cols, min_cols)


def _ladder(doc: tomlfile.Table, name: str, part: str) -> tuple[Rung, ...]:
    table = doc.table(name)
    entries = table.get("entries", list, item=dict)
    if not entries:
        raise table.error("entries", "at least one entry")
    keys = ROW_KEYS if part == "rows" else COLUMN_KEYS
    rungs = tuple(_rung(tomlfile.Table(table.file, e, table.dotted(f"entries[{i}]")), keys, part)
                  for i, e in enumerate(entries))
    if rungs[-1].cols is not None:
        raise table.error(f"entries[{len(rungs) - 1}].cols", "no key in the last entry (it serves every longer row)",
                          rungs[-1].cols)
    table.done()
    return rungs


def load(path: Path = SPACE_FILE, ruleset: RuleSet | None = None) -> Space:
    """The backward space at `path`; given the instance's `ruleset`, every reduction, function and
    rule it names is checked to be there (an error names this file and key)."""
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    reductions = set(ruleset.reductions) if ruleset else None
    functions = set(ruleset.functions) if ruleset else None
    ops, parts = {}, {}
    for name, t in doc.table("ops").tables():
        if name != COLUMN_OP:
            if name not in BACKWARD_OPS:
                raise doc.error(f"ops.{name}", "a backward operator aicg/backward/ops.py defines ("
                                + ", ".join(BACKWARD_OPS) + f", or {COLUMN_OP})")
            t.get("forward", str, choices={BACKWARD_OPS[name].forward})
            parts[name] = tuple(t.get("parts", list, item=str, choices=set(PARTS)))
            if ("columns" in parts[name]) != bool(BACKWARD_OPS[name].column_outputs):
                raise t.error("parts", f"'columns' exactly where {name} has vector gradients", parts[name])
        ops[name] = OpSemantics(name, t.get("form", str),
                                tuple(t.get("reductions", list, item=str, choices=reductions)),
                                tuple(t.get("functions", list, item=str, choices=functions)), {})
        t.done()
    missing = sorted(set(BACKWARD_OPS) - set(parts))
    if missing or COLUMN_OP not in ops:
        raise doc.error(f"ops.{missing[0] if missing else COLUMN_OP}", "a table (every backward operator is stated)")
    ladders = doc.table("ladders")
    families = {}
    for name, t in doc.table("families").tables():
        op = t.get("op", str, choices=set(ops))
        part = "columns" if op == COLUMN_OP else "rows"
        ladder_name = t.get("ladder", str, choices=set(ladders.keys()))
        families[name] = BackwardFamily(
            name, op, part, t.get("summary", str), t.get("header", str),
            t.get("function", str, default=None) if part == "columns" else t.get("function", str),
            t.get("totals", str) if part == "columns" else None,
            tuple(t.get("rules", list, item=str, choices=set(ruleset.rules) if ruleset else None)),
            t.get("sweeps", int), _ladder(ladders, ladder_name, part),
            t.get("max_chunks", int) if part == "columns" else None,
            t.get("columns", str, default=None) if part == "rows" else None)
        if part == "columns" and not 1 <= families[name].max_chunks <= MAX_GRID_Y:
            raise t.error("max_chunks", f"an integer from 1 to {MAX_GRID_Y} (a grid's second dimension)",
                          families[name].max_chunks)
        t.done()
    for name, family in families.items():
        topologies = {r.params["topology"] for r in family.ladder} if family.part == "rows" else set()
        split = sorted(topologies & set(HELD_ONLY_TOPOLOGIES))
        if split and family.columns is None:
            raise doc.error(f"families.{name}.ladder", "topologies keeping a row in one block (a row split over a "
                            "cluster is held whole by a family with `columns`)", split)
        if family.columns is not None:
            named = families.get(family.columns)
            if named is None or not named.partials_from_rows:
                raise doc.error(f"families.{name}.columns", "a column family without `function` (one whose partial "
                                "sums its rows family writes)", family.columns)
            if "columns" not in parts.get(family.op, ()):
                raise doc.error(f"families.{name}.columns", f"no key: {family.op} has no column sums", family.columns)
    ladders.done()
    doc.done()
    return Space(ops, parts, families)


@functools.lru_cache(maxsize=4)
def shipped() -> Space:
    return load(SPACE_FILE)


# --- legality and candidates ------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """Whether the kernels may serve a backward operator in a dtype: each part's legality."""
    op: str
    dtype: str
    parts: dict[str, legality.Legality]

    @property
    def legal(self) -> bool:
        return all(part.legal_families() for part in self.parts.values())

    def why_not(self) -> str:
        """The engine's hints for each part with no legal family ("" where every part has one)."""
        return "; ".join(f"{part}: {d.hint}" for part, d in self.parts.items() if not d.legal_families())

    def as_record(self) -> dict:
        return {"op": self.op, "dtype": self.dtype, "legal": self.legal,
                "parts": {part: d.as_record() for part, d in self.parts.items()}}


def decide(space: Space, ruleset: RuleSet, preservation, choice, op: str, dtype: str) -> Decision:
    extended = space.extend(ruleset)
    parts = {"rows": legality.decide(op, dtype, extended, preservation, choice)}
    if "columns" in space.parts[op]:
        parts["columns"] = legality.decide(COLUMN_OP, dtype, extended, preservation, choice)
    return Decision(op, dtype, parts)


def _params_legal(part: str, params: dict, dtype: str, decided: legality.Legality) -> bool:
    return all(decided.rules[pr.rule].legal for pr in PARAM_RULES[part] if _WHEN[pr.when](params[pr.param], dtype))


def chunking(family: BackwardFamily, params: dict, rows: int) -> tuple[int, int]:
    """(rows a chunk, chunks) of the column sums over `rows` rows: at least the rung's chunk_rows,
    longer where the family's max_chunks would otherwise be exceeded."""
    chunk = max(params["chunk_rows"], -(-rows // family.max_chunks))
    return chunk, max(1, -(-rows // chunk))


def row_steps(params: dict, dtype: str, cols: int) -> int:
    return accuracy.chain_steps(params["topology"], params["threads"], max(1, params["vec_bytes"] // DTYPES[dtype].size),
                                cols)


def row_error(op: BackwardOp, dtype: str, params: dict, cols: int, failure_probability: float) -> float:
    """The relative error, against the gradient's scale, the rows part's order may reach (aicg/semantics/accuracy.py)."""
    return (op.row_gain * accuracy.chain_error(row_steps(params, dtype, cols), failure_probability)
            + DTYPES[dtype].unit_roundoff)


def column_error(op: BackwardOp, family: BackwardFamily, dtype: str, rows_params: dict, params: dict, rows: int,
                 cols: int, failure_probability: float) -> float:
    """The same for the column sums: the row lanes' chains and their fold, in both passes (a chunk
    summed row by row where the rows part writes the partials), with the row statistics' own error."""
    chunk, chunks = chunking(family, params, rows)
    row_lanes = params["threads"] // params["col_lanes"]
    first = chunk if family.partials_from_rows else -(-chunk // row_lanes) + row_lanes - 1
    steps = first + -(-chunks // row_lanes) + row_lanes - 1
    return (accuracy.chain_error(steps, failure_probability)
            + op.column_row_gain * accuracy.chain_error(row_steps(rows_params, dtype, cols), failure_probability)
            + DTYPES[dtype].unit_roundoff)


@functools.lru_cache(maxsize=None)
def _longest_row(op_name: str, dtype: str, order: tuple, rtol: float, failure_probability: float) -> int | None:
    op, params = BACKWARD_OPS[op_name], dict(order)
    keeps = lambda cols: row_error(op, dtype, params, cols, failure_probability) <= rtol
    if keeps(accuracy.LONGEST_ROW):
        return None
    low, high = 0, accuracy.LONGEST_ROW
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if keeps(mid) else (low, mid)
    return low


def longest_row(op: str, dtype: str, params: dict, rtol: float, failure_probability: float) -> int | None:
    """The longest row the rows part keeps `rtol` on (None: every row, or rtol 0, where nothing is
    kept by a bound and the engine has ruled the tree out already)."""
    if rtol <= 0:
        return None
    order = tuple(sorted((k, params[k]) for k in ("topology", "threads", "vec_bytes")))
    return _longest_row(op, dtype, order, rtol, failure_probability)


def held_cols(params: dict, dtype: str) -> int:
    """The longest row a lane group of the rows part holds whole (packs, as the ladder's entries give
    them, each lane at most cache_packs of them)."""
    pack = max(1, params["vec_bytes"] // DTYPES[dtype].size)
    return lanes_per_row(params["topology"], params["threads"]) * pack * params["cache_packs"]


def held_whole(params: dict, dtype: str, cols: int) -> bool:
    return cols <= held_cols(params, dtype)


def candidates(space: Space, decision: Decision, rtol: float, failure_probability: float, rows: int,
               cols: int, max_cluster_blocks: int | None = None) -> tuple[list[Candidate], list[str]]:
    """The candidates for one shape, in ladder order: legal, serving rows of `cols`, keeping `rtol`
    on them (the column sums too, over `rows` rows), a row's blocks within the GPU's clusters
    (`max_cluster_blocks`, None: any); and why the others were passed over."""
    op, dtype = BACKWARD_OPS[decision.op], decision.dtype
    found, passed_over = [], []
    column_choices = [(None, None)]
    if "columns" in decision.parts:
        column_choices = [(space.families[f], r.params) for f in decision.parts["columns"].legal_families()
                          for r in space.families[f].ladder
                          if r.serves(cols) and _params_legal("columns", r.params, dtype, decision.parts["columns"])]
    for family_name in decision.parts["rows"].legal_families():
        family = space.families[family_name]
        for rung in family.ladder:
            if not rung.serves(cols):
                continue
            what = f"{family_name} {rung.params}"
            if not _params_legal("rows", rung.params, dtype, decision.parts["rows"]):
                passed_over.append(f"{what}: a rule its parameters use is not legal")
                continue
            if max_cluster_blocks is not None and blocks_per_row(rung.params["topology"]) > max_cluster_blocks:
                passed_over.append(f"{what}: a cluster of {blocks_per_row(rung.params['topology'])} blocks, "
                                   f"the GPU's hold at most {max_cluster_blocks}")
                continue
            if family.columns is not None and not held_whole(rung.params, dtype, cols):
                passed_over.append(f"{what}: its lane group does not hold rows of {cols} elements whole")
                continue
            if rtol > 0 and row_error(op, dtype, rung.params, cols, failure_probability) > rtol:
                passed_over.append(f"{what}: its order keeps rtol {rtol:g} on rows of at most "
                                   f"{longest_row(op.name, dtype, rung.params, rtol, failure_probability)} elements, "
                                   f"not {cols}")
                continue
            for columns_family, columns in column_choices:
                if columns_family is not None and (columns_family.partials_from_rows or family.columns is not None) \
                        and columns_family.name != family.columns:
                    continue   # partial sums from the rows part pair with the rows family that writes them
                if columns_family is not None and rtol > 0 and column_error(
                        op, columns_family, dtype, rung.params, columns, rows, cols, failure_probability) > rtol:
                    passed_over.append(f"{what} with {columns_family.name} {columns}: its column sums over {rows} "
                                       f"rows exceed rtol {rtol:g}")
                    continue
                found.append(Candidate(op.name, dtype, family_name, dict(rung.params),
                                       columns_family.name if columns_family else None,
                                       dict(columns) if columns else None, family.columns is not None))
    return found, passed_over
