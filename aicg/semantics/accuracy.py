"""The row lengths at which a realisation's reduction order keeps the profile's bound.

Every family accumulates in float32, and a row's result reaches its output
through a chain of roundings: the lane that meets the most elements adds
them one by one, then the partials meet in the topology's tree
(kernels/reduce.cuh: a warp's butterfly, the warps' partials folded in
order, the blocks of a cluster in order). A sum's error grows with that
chain: within (steps) u sum|x| whatever the inputs (Higham 2002, sec. 4.2),
and within lambda sqrt(steps) u sum|x| with probability at least
1 - 2 steps exp(-lambda^2 (1-u)^2 / 2) where rounding errors are independent
and of mean zero (Higham & Mary 2019). The second is the bound a row's
result is held to, at the failure probability preservation.toml states: the
first would refuse kernels that the lab measures tens of times inside the
bound, while a chain too long for the second is what made validation a draw
(one thread summing rows of 4097 float32 elements in order: 1 row of 40 past
rtol 1e-5, emulated).

The operator carries that relative error to its output by its
`reduction_gain` (aicg/ops.py), and the output's own rounding comes on top.
A realisation is planned, validated and run only at rows up to the longest
length where the whole fits the dtype's rtol. Per-element errors (a libdevice
exp within 2 ulp, a rescaled online state, a Welford update) do not grow
along the chain and are left to validation.
"""
from __future__ import annotations

import functools
import math

from .. import codegen
from ..dtypes import ACCUMULATOR, DTYPES
from ..ops import OPERATORS

WARP = 32
LONGEST_ROW = 2**31 - 1   # a row length a launch can take (aicg/runtime/instance.py)


def chain_steps(topology: str, threads: int, vec: int, cols: int) -> int:
    """Roundings on the longest path from an element of a row of `cols` to its result: one per
    element the busiest lane meets (in packs of `vec` where the row allows them; a lane meets no
    more where it does not), then one per level of the topology's tree."""
    lanes = codegen.lanes_per_row(topology, threads)
    per_lane = math.ceil(cols / (lanes * vec)) * vec
    tree = int(math.log2(min(lanes, WARP)))
    if lanes > WARP:
        tree += threads // WARP - 1 + codegen.blocks_per_row(topology) - 1
    return per_lane + tree


def chain_error(steps: int, failure_probability: float) -> float:
    """Relative error of a float32 chain of `steps` roundings that holds but with the given probability."""
    if steps == 0:
        return 0.0
    u = ACCUMULATOR.unit_roundoff
    lam = math.sqrt(2 * math.log(2 * steps / failure_probability)) / (1 - u)
    return math.expm1(lam * math.sqrt(steps) * u + steps * u * u / (1 - u))


def row_error(op: str, dtype: str, params: dict, cols: int, failure_probability: float) -> float:
    """The relative error, against the operator's scale, that a realisation's order and the
    output's rounding may reach on rows of `cols`."""
    vec = max(1, params["vec_bytes"] // DTYPES[dtype].size)
    steps = chain_steps(params["topology"], params["threads"], vec, cols)
    return OPERATORS[op].reduction_gain * chain_error(steps, failure_probability) + DTYPES[dtype].unit_roundoff


def reduces_inexactly(ruleset, op: str) -> bool:
    """Whether the operator reduces with an operation that rounds (a sum; a max returns an operand)."""
    def exact(reduction) -> bool:
        prop = reduction.properties.get("associative")
        return prop is not None and prop.holds == "exact"
    return not all(exact(ruleset.reductions[r]) for r in ruleset.ops[op].reductions)


def longest_row(ruleset, op: str, dtype: str, params: dict, rtol: float) -> int | None:
    """The longest row the realisation keeps `rtol` on; None where its order bounds nothing (no
    rounding reduction, a flat walk, or rtol 0: exactness is then checked bit for bit)."""
    if rtol <= 0 or params["topology"] == codegen.FLAT or not reduces_inexactly(ruleset, op):
        return None
    order = {k: params[k] for k in ("topology", "threads", "vec_bytes")}
    return _longest(op, dtype, tuple(sorted(order.items())), rtol, ruleset.rounding.failure_probability)


@functools.lru_cache(maxsize=None)
def _longest(op: str, dtype: str, order: tuple, rtol: float, failure_probability: float) -> int | None:
    params = dict(order)

    def keeps(cols: int) -> bool:
        return row_error(op, dtype, params, cols, failure_probability) <= rtol

    if keeps(LONGEST_ROW):
        return None
    low, high = 0, LONGEST_ROW      # keeps(low) (a row of nothing has no error), not keeps(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if keeps(mid) else (low, mid)
    return low


def keeps(longest: int | None, cols: int) -> bool:
    """Whether rows of `cols` are within a longest row (None: every row is)."""
    return longest is None or cols <= longest


def served(shapes, longest: int | None) -> tuple:
    """The (rows, cols, ...) shapes whose rows are within a longest row."""
    return tuple(s for s in shapes if keeps(longest, s[1]))


def clip_shapes(shapes, longest: int | None) -> tuple:
    """`shapes` ((rows, cols) or (rows, cols, stride)) with rows longer than `longest` cut to it,
    a stride keeping its padding; duplicates dropped, order kept."""
    if longest is None:
        return tuple(shapes)
    clipped = {}    # a dict keeps the first-seen order and finds a repeat at once
    for shape in shapes:
        rows, cols, *stride = shape
        if not keeps(longest, cols):
            shape = (rows, longest, *(s - cols + longest for s in stride))
        clipped[tuple(shape)] = None
    return tuple(clipped)
