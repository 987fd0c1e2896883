"""Codegen: a candidate becomes a small, complete CUDA source.

The source includes the family's header and defines one extern "C" entry,
`aicg_kernel`, that instantiates the family's template with the candidate's
parameters. Nothing else is pasted: the algorithm lives in kernels/, and a
compiler error points at the header's own file and line.
"""
from __future__ import annotations

from .dtypes import DTYPES
from .ops import OPERATORS
from .semantics.ruleset import Family

ENTRY = "aicg_kernel"
# How a row is split over threads: a warp, a block, one thread, one thread serving eight rows
# (tiny rows), n lanes of a warp (short rows), or the n blocks of a thread-block cluster (long rows);
# or, for maps alone, no rows: the matrix one range over the whole grid (flat).
TOPOLOGIES = {"warp": "aicg::WARP_PER_ROW", "block": "aicg::BLOCK_PER_ROW", "thread": "aicg::THREAD_PER_ROW",
              "block_staged": "aicg::STAGED_BLOCK_PER_ROW", "block_prefetch": "aicg::PREFETCH_BLOCK_PER_ROW",
              "thread_rows8": "aicg::THREAD_PER_8_ROWS",
              "lanes4": "aicg::LANES_4_PER_ROW", "lanes8": "aicg::LANES_8_PER_ROW", "lanes16": "aicg::LANES_16_PER_ROW",
              "cluster2": "aicg::CLUSTER_2_PER_ROW", "cluster4": "aicg::CLUSTER_4_PER_ROW",
              "cluster8": "aicg::CLUSTER_8_PER_ROW", "flat": "aicg::FLAT"}
# The row copied into shared memory before its sweeps (kernels/row_access.cuh), or a grid of
# resident blocks each holding its row while it prefetches the next into shared memory: the
# topology it otherwise is, whose lanes meet the same elements in the same order.
UNSTAGED = {"block_staged": "block", "block_prefetch": "block"}
STAGED = {"block_staged"}            # swept from shared memory
PREFETCHED = {"block_prefetch"}      # held in registers, the next row copied meanwhile
ROW_IN_SHARED = STAGED | PREFETCHED  # launched with the row's bytes of dynamic shared memory
BLOCKS_PER_ROW = {"cluster2": 2, "cluster4": 4, "cluster8": 8}    # any other topology: 1
LANES_OF_A_WARP = {"warp": 32, "thread": 1, "thread_rows8": 1, "lanes4": 4, "lanes8": 8, "lanes16": 16}  # the rest: blocks
ROWS_PER_THREAD = {"thread_rows8": 8}    # any other topology: 1


def blocks_per_row(topology: str) -> int:
    return BLOCKS_PER_ROW.get(topology, 1)


def rows_per_thread(topology: str) -> int:
    return ROWS_PER_THREAD.get(topology, 1)


def lanes_per_row(topology: str, threads: int) -> int:
    return LANES_OF_A_WARP.get(topology) or threads * blocks_per_row(topology)


def source(candidate_id: str, family: Family, dtype_name: str, params: dict) -> str:
    dtype = DTYPES[dtype_name]
    op = OPERATORS[family.op]
    vec = params["vec_bytes"] // dtype.size
    template_args = [dtype.ctype, str(params["threads"]), str(vec), TOPOLOGIES[params["topology"]],
                     "true" if params["fast_exp"] else "false", str(params["cache_packs"])]
    settings = " ".join(f"{k}={v}" for k, v in sorted(params.items()))
    signature = ",\n    ".join(op.kernel_params(dtype.ctype))
    blocks = blocks_per_row(params["topology"])
    cluster = f"__cluster_dims__({blocks}, 1, 1) " if blocks > 1 else ""
    return (
        f"// aicg candidate {candidate_id}\n"
        f"// family {family.name} ({family.header}), dtype {dtype_name}, {settings}\n"
        f'#include "{family.header}"\n'
        f"\n"
        f'extern "C" __global__ void {cluster}__launch_bounds__({params["threads"]})\n'
        f"{ENTRY}(\n    {signature}) {{\n"
        f"  {family.function}<{', '.join(template_args)}>({', '.join(op.argument_names())});\n"
        f"}}\n"
    )


def with_min_blocks(source: str, threads: int, blocks: int) -> str:
    """`source` with its entry's launch bound asking for `blocks` resident blocks of `threads`,
    and AICG_MIN_BLOCKS defined before the family's header for the kernels to see."""
    bound = f"__launch_bounds__({threads})"
    if source.count(bound) != 1 or source.count("\n#include ") != 1:
        raise ValueError(f"a generated source has one {bound} and one #include; this one has "
                         f"{source.count(bound)} and {source.count(chr(10) + '#include ')}")
    return (source.replace(bound, f"__launch_bounds__({threads}, {blocks})")
            .replace("\n#include ", f"\n#define AICG_MIN_BLOCKS {blocks}\n#include "))


FLAT = "flat"
MAX_GRID = 2**31 - 1    # blocks in a grid's x dimension


def launch_geometry(params: dict, rows: int, cols: int, dtype_size: int,
                    resident_blocks: int | None = None) -> tuple[int, int]:
    """(blocks, threads per block) that cover `rows` rows of `cols` elements: a flat walk gets a
    thread per pack of the whole matrix; a prefetching topology as many blocks as the GPU holds at
    once (`resident_blocks`, the launch's occupancy times the SMs), each serving several rows."""
    threads = params["threads"]
    if params["topology"] in PREFETCHED:
        if not resident_blocks:
            raise ValueError(f"a {params['topology']} launch needs the blocks the GPU holds at once")
        return min(rows, resident_blocks), threads
    if params["topology"] == FLAT:
        units = -(-rows * cols // max(1, params["vec_bytes"] // dtype_size))
        return min(MAX_GRID, -(-units // threads)), threads
    blocks = blocks_per_row(params["topology"])
    if blocks > 1:
        return rows * blocks, threads
    rows_per_block = threads // lanes_per_row(params["topology"], threads) * rows_per_thread(params["topology"])
    return (rows + rows_per_block - 1) // rows_per_block, threads


def shared_bytes(kernel, params: dict, cols: int, dtype_size: int) -> int:
    """Dynamic shared memory for a launch: a staged or prefetching topology's whole row, when the
    row is whole packs and the kernel may have that much (`kernel.shared_bytes_limit`); otherwise
    none, and the kernel reads the row from global memory as its unstaged twin does."""
    row_bytes = cols * dtype_size
    if params["topology"] not in ROW_IN_SHARED or row_bytes % params["vec_bytes"]:
        return 0
    return row_bytes if row_bytes <= kernel.shared_bytes_limit else 0


def launch_of(kernel, params: dict, rows: int, cols: int, dtype_size: int) -> tuple[int, int, int]:
    """(blocks, threads per block, dynamic shared bytes) of a launch of `kernel` (a loaded entry:
    its shared memory limit and, for a prefetching topology, its occupancy) over `rows` rows."""
    shared = shared_bytes(kernel, params, cols, dtype_size)
    resident = kernel.resident_blocks(params["threads"], shared) if params["topology"] in PREFETCHED else None
    blocks, threads = launch_geometry(params, rows, cols, dtype_size, resident)
    return blocks, threads, shared
