"""Codegen and launch geometry for the backward kernels.

A candidate becomes one CUDA source with up to three extern "C" entries, compiled into one cubin
and validated as a whole: the rows part (`aicg_backward_rows`: the input's gradient, and a norm's
row statistics) and, for a norm, the two passes of its column sums (`aicg_backward_column_partials`,
`aicg_backward_column_totals`), or only the second where the rows part writes the partial sums
itself (a candidate's `partials_in_rows`: its rows are summed by chunks of rows, one a row group).
Each entry instantiates its family's template in kernels/backward/ with the candidate's
parameters; nothing else is pasted, so a compiler error points at the template's own file and line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import codegen as row_codegen
from .. import cli_layout, nvrtc
from ..dtypes import DTYPES
from .ops import BACKWARD_OPS
from .space import Candidate, Space, chunking

KERNELS_DIR = cli_layout.shipped("kernels")   # the checkout's, or the installed package's
ROWS_ENTRY = "aicg_backward_rows"
PARTIALS_ENTRY = "aicg_backward_column_partials"
TOTALS_ENTRY = "aicg_backward_column_totals"
TOTALS_PACK_BYTES = 16          # the second pass reads the partial sums (floats) in 16-byte packs
SCALARS = {"eps"}
INTEGERS = {"rows", "cols", "g_stride", "x_stride", "y_stride", "chunk_rows", "chunks"}
COLUMN_KINDS = {1: "aicg::RMSNORM_WEIGHT", 2: "aicg::LAYERNORM_WEIGHT_BIAS"}   # kernels/backward/columns.cuh


def arguments(candidate: Candidate) -> dict[str, tuple[str, ...]]:
    """Each entry's parameter names, in order."""
    op = BACKWARD_OPS[candidate.op]
    saved = op.saved
    if candidate.partials_in_rows:
        rows = ("g", saved, *op.vectors, "dx", "partials", "rows", "cols", "g_stride", f"{saved}_stride",
                *(name for name, _ in op.scalars), "chunk_rows")
    else:
        rows = ("g", saved, *op.vectors, "dx", *(("stats",) if op.column_outputs else ()), "rows", "cols", "g_stride",
                f"{saved}_stride", *(name for name, _ in op.scalars))
    entries = {ROWS_ENTRY: rows}
    if op.column_outputs:
        if not candidate.partials_in_rows:
            entries[PARTIALS_ENTRY] = ("g", "x", "stats", "partials", "rows", "cols", "g_stride", "x_stride",
                                       "chunk_rows")
        entries[TOTALS_ENTRY] = ("partials", *op.column_outputs, "chunks", "cols")
    return entries


def kind(name: str) -> str:
    """How a launch passes the argument: "int", "float" or "ptr" (aicg/runtime/driver.py)."""
    return "int" if name in INTEGERS else "float" if name in SCALARS else "ptr"


def _declaration(name: str, entry: str, ctype: str) -> str:
    if kind(name) == "int":
        return f"int {name}"
    if kind(name) == "float":
        return f"float {name}"
    if name == "stats":
        return f"{'float' if entry == ROWS_ENTRY else 'const float'}* __restrict__ stats"
    if name == "partials":
        return f"{'const float' if entry == TOTALS_ENTRY else 'float'}* __restrict__ partials"
    written = name in ("dx", "dw", "db")
    return f"{'' if written else 'const '}{ctype}* __restrict__ {name}"


def _entry(entry: str, threads: int, function: str, template_args: list[str], names: tuple[str, ...],
           ctype: str, passed: dict[str, str] | None = None, cluster: int = 1) -> str:
    """The entry calling `function` with `names`: its own parameters, or the literals `passed` gives;
    launched in clusters of `cluster` blocks where that is above 1."""
    passed = passed or {}
    declared = [n for n in names if n not in passed]
    signature = ",\n    ".join(_declaration(n, entry, ctype) for n in declared)
    call = ", ".join(passed.get(n, n) for n in names)
    dims = f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else ""
    return (f'extern "C" __global__ void {dims}__launch_bounds__({threads})\n{entry}(\n    {signature}) {{\n'
            f"  {function}<{', '.join(template_args)}>({call});\n}}\n")


def source(space: Space, candidate: Candidate) -> str:
    dtype = DTYPES[candidate.dtype]
    op = BACKWARD_OPS[candidate.op]
    rows_family = space.families[candidate.rows_family]
    p = candidate.rows
    names = arguments(candidate)
    headers = [rows_family.header]
    entries = [_entry(ROWS_ENTRY, p["threads"], rows_family.function,
                      [dtype.ctype, str(p["threads"]), str(p["vec_bytes"] // dtype.size),
                       row_codegen.TOPOLOGIES[p["topology"]], str(p["cache_packs"])], names[ROWS_ENTRY], dtype.ctype,
                      cluster=row_codegen.blocks_per_row(p["topology"]))]
    if op.column_outputs:
        family, c = space.families[candidate.columns_family], candidate.columns
        headers.append(family.header)
        outputs = len(op.column_outputs)
        if not candidate.partials_in_rows:
            entries.append(_entry(PARTIALS_ENTRY, c["threads"], family.function,
                                  [COLUMN_KINDS[outputs], dtype.ctype, str(c["threads"]),
                                   str(c["vec_bytes"] // dtype.size), str(c["col_lanes"])], names[PARTIALS_ENTRY],
                                  dtype.ctype))
        entries.append(_entry(TOTALS_ENTRY, c["threads"], family.totals,
                              [str(outputs), dtype.ctype, str(c["threads"]), str(TOTALS_PACK_BYTES // 4),
                               str(c["col_lanes"])], ("partials", "dw", "db", "chunks", "cols"), dtype.ctype,
                              passed={} if "db" in op.column_outputs else {"db": "nullptr"}))
    settings = " ".join(f"{k}={v}" for k, v in sorted(p.items()))
    if candidate.columns:
        settings += "; columns " + " ".join(f"{k}={v}" for k, v in sorted(candidate.columns.items()))
    includes = "".join(f'#include "{h}"\n' for h in dict.fromkeys(headers))
    return (f"// aicg backward candidate {candidate.id}\n"
            f"// {candidate.op} in {candidate.dtype}: {settings}\n"
            f"{includes}\n" + "\n".join(entries))


def headers(space: Space, candidate: Candidate, kernels_dir: Path = KERNELS_DIR) -> dict[str, bytes]:
    """Every header the candidate's source includes, transitively, by name."""
    found: dict[str, bytes] = {}
    names = [space.families[candidate.rows_family].header]
    if candidate.columns_family:
        names.append(space.families[candidate.columns_family].header)
    for name in names:
        found.update(nvrtc.include_closure(name, kernels_dir))
    return dict(sorted(found.items()))


def entries(candidate: Candidate) -> tuple[str, ...]:
    return tuple(arguments(candidate))


# --- launches ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Launch:
    entry: str
    grid: tuple[int, int, int]
    block: int
    arguments: tuple[str, ...]     # names; their values come from the caller's dict

    def values(self, values: dict) -> list:
        return [values[name] for name in self.arguments]

    def kinds(self) -> tuple[str, ...]:
        return tuple(kind(name) for name in self.arguments)


def rows_launch(space: Space, candidate: Candidate, rows: int, cols: int) -> Launch:
    """The rows part over `rows` rows (as aicg/codegen.py lays rows over blocks; a row group a
    chunk of them where the rows part writes the column sums' partials)."""
    p = candidate.rows
    if candidate.partials_in_rows:
        _, chunks = chunking(space.families[candidate.columns_family], candidate.columns, rows)
        per_group = row_codegen.blocks_per_row(p["topology"])      # a cluster's blocks share a row group
        groups = max(1, p["threads"] // row_codegen.lanes_per_row(p["topology"], p["threads"]))
        blocks, threads = -(-chunks // groups) * per_group, p["threads"]
    else:
        blocks, threads = row_codegen.launch_geometry(p, rows, cols, DTYPES[candidate.dtype].size)
    return Launch(ROWS_ENTRY, (blocks, 1, 1), threads, arguments(candidate)[ROWS_ENTRY])


def column_launches(space: Space, candidate: Candidate, rows: int, cols: int) -> list[Launch]:
    """The column sums' two passes (none for an operator without vector gradients)."""
    if not candidate.columns:
        return []
    c, names = candidate.columns, arguments(candidate)
    _, chunks = chunking(space.families[candidate.columns_family], c, rows)
    width = c["col_lanes"] * (c["vec_bytes"] // DTYPES[candidate.dtype].size)
    totals_width = c["col_lanes"] * (TOTALS_PACK_BYTES // 4)
    totals = Launch(TOTALS_ENTRY, (-(-cols // totals_width), 1, 1), c["threads"], names[TOTALS_ENTRY])
    if candidate.partials_in_rows:
        return [totals]
    return [Launch(PARTIALS_ENTRY, (-(-cols // width), chunks, 1), c["threads"], names[PARTIALS_ENTRY]), totals]


def column_values(space: Space, candidate: Candidate, rows: int) -> dict[str, int]:
    """The column passes' integer arguments besides the shape."""
    if not candidate.columns:
        return {}
    chunk, chunks = chunking(space.families[candidate.columns_family], candidate.columns, rows)
    return {"chunk_rows": chunk, "chunks": chunks}


def workspace_floats(space: Space, candidate: Candidate, rows: int, cols: int) -> dict[str, int]:
    """Floats of the row statistics and the partial sums a launch of `rows` x `cols` needs."""
    op = BACKWARD_OPS[candidate.op]
    if not op.column_outputs:
        return {}
    _, chunks = chunking(space.families[candidate.columns_family], candidate.columns, rows)
    outputs = len(op.column_outputs)
    if candidate.partials_in_rows:     # the row statistics stay in the rows part's registers
        return {"partials": outputs * chunks * cols}
    return {"stats": rows * op.stats_per_row, "partials": outputs * chunks * cols}
