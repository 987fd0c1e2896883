"""Inputs, the float64 reference and the error bound of a matrix multiply.

Inputs are drawn afresh for every validation (normal values, a second trial
shifted so that the sums grow with K and the accumulator's rounding shows),
rounded to the operand type, and stored as the kernel sees them: rows of the
leading dimension, the padding past each row filled with NaN bits so a kernel
that reads past a row's end produces NaN.

The reference is computed in float64 from the same rounded inputs. The bound
on |kernel - reference| for one output element follows the kernel's
arithmetic step by step (u = 2^-24, float's unit roundoff; u_T the output
type's, from aicg/dtypes.py):

  products       exact: a 16-bit x 16-bit product fits float's 24 bits
  accumulation   the tensor cores add a k16 step's 16 products into the fp32
                 accumulator with at most one rounding-like error each step,
                 an error not above 2u of the magnitudes involved (2u, not u:
                 the hardware's internal alignment may truncate rather than
                 round). Over ceil(K/16) steps, plus one rounding for each
                 split of a split-K sum, the error is at most
                     2 (ceil(K/16) + splits) u sum_k |a_ik b_kj|
                 and sum_k |a_ik b_kj| <= ||a_i|| ||b_j|| (Cauchy-Schwarz),
                 which costs a row norm instead of a second product.
  rounded sum    only where the realisation hands its sums on rounded to T
                 (the wgmma template's handoff store): + u_T (|acc| + the
                 error so far), and the smallest subnormal of T
  bias           one float addition: + u |pre|
  activation     the accumulated error times the activation's largest slope
                 (1 for none, 1.13 for GELU, 1.10 for SiLU), plus its float
                 evaluation: tanhf / erff / expf within 2 ulp and a few
                 float operations around them; 8u (|pre| + |act(pre)|) covers
                 them, cancellation in GELU's 1 + tanh near -1 included
  residual       one float addition: + u |post|
  output         one rounding to T: + u_T (|ref| + the error so far), and the
                 output type's smallest subnormal for values rounded to zero.

Nothing here is a tuned tolerance: each term is the arithmetic's own bound.
"""
from __future__ import annotations

import math

import numpy as np

from ..dtypes import ACCUMULATOR, DTYPES
from .problem import Problem

POISON_BITS = 0xFFFF         # a NaN in bfloat16 and in float16
U32 = ACCUMULATOR.unit_roundoff
LIPSCHITZ = {"none": 1.0, "gelu_tanh": 1.13, "gelu_erf": 1.13, "silu": 1.10}
SMALLEST_SUBNORMAL = {"bfloat16": 2.0**-133, "float16": 2.0**-24}


def operands(problem: Problem) -> list[str]:
    return ["a", "b"] + (["bias"] if problem.epilogue.bias else []) + (["residual"] if problem.epilogue.residual else [])


def operand_key(name: str, problem: Problem, trial: int) -> tuple:
    """What a drawn operand depends on: problems sharing it may share one draw."""
    shape = {"a": (problem.m, problem.k), "b": (problem.k, problem.n), "bias": (problem.n,),
             "residual": (problem.m, problem.n)}[name]
    return name, shape, problem.dtype, trial % 2


def draw_operand(name: str, problem: Problem, trial: int, rng) -> np.ndarray:
    """One logical operand as float32 values already rounded to the dtype: a (M x K), b (K x N),
    bias (N), residual (M x N). Even trials: zero-mean normals; odd trials: a and b shifted by
    0.5, so every product has a positive mean and a row's sum grows with K. B is scaled by
    1/sqrt(K) so that outputs stay well inside float16's range."""
    dtype = DTYPES[problem.dtype]
    _, shape, _, parity = operand_key(name, problem, trial)
    values = rng.standard_normal(shape, dtype=np.float32)
    if name in ("a", "b") and parity:
        values += np.float32(0.5)
    if name == "b":
        values *= np.float32(1.0 / math.sqrt(problem.k))
    return dtype.decode(dtype.encode(values)).reshape(shape)


def draw(problem: Problem, trial: int, rng, cache: dict | None = None) -> dict[str, np.ndarray]:
    """Every logical operand of `problem` for `trial`; drawn ones are kept in `cache` (by
    operand_key) for later problems that share them."""
    found = {}
    for name in operands(problem):
        key = operand_key(name, problem, trial)
        if cache is not None and key in cache:
            found[name] = cache[key]
            continue
        found[name] = draw_operand(name, problem, trial, rng)
        if cache is not None:
            cache[key] = found[name]
    return found


def stored(problem: Problem, logical: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The device images (uint16 bits, flat) of the inputs: each operand in its layout, rows of its
    leading dimension, the padding NaN."""
    dtype = DTYPES[problem.dtype]
    layouts = {"a": (logical["a"] if problem.a_major == "k" else logical["a"].T, problem.lda),
               "b": (logical["b"].T if problem.b_major == "k" else logical["b"], problem.ldb)}
    if "bias" in logical:
        layouts["bias"] = (logical["bias"][None, :], problem.n)
    if "residual" in logical:
        layouts["residual"] = (logical["residual"], problem.ldr)
    images = {}
    for name, (matrix, ld) in layouts.items():
        rows, cols = matrix.shape
        image = np.full((rows, ld), POISON_BITS, dtype=np.uint16)
        image[:, :cols] = dtype.encode(np.ascontiguousarray(matrix, dtype=np.float32))
        images[name] = image.reshape(-1)[:problem.elements(name)]
    return images


def activation(name: str, x: np.ndarray) -> np.ndarray:
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if name == "gelu_erf":
        erf = np.frompyfunc(math.erf, 1, 1)   # numpy has no erf; math.erf is float64-accurate
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)).astype(np.float64))
    if name == "silu":
        with np.errstate(over="ignore"):
            return x / (1.0 + np.exp(-x))
    return x


def accumulation_roundings(k: int, splits: int = 1) -> int:
    return -(-k // 16) + splits


def expected(problem: Problem, logical: dict[str, np.ndarray], rows: np.ndarray,
             splits: int = 1, rounded_sum: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(reference, bound), each len(rows) x N float64, for the given output rows; `rounded_sum`: the
    realisation rounds each sum to the output type before its epilogue."""
    a = logical["a"][rows].astype(np.float64)
    b = logical["b"].astype(np.float64)
    acc = a @ b
    acc_error = 2.0 * accumulation_roundings(problem.k, splits) * U32 * np.outer(np.linalg.norm(a, axis=1),
                                                                                 np.linalg.norm(b, axis=0))
    u_out = DTYPES[problem.dtype].unit_roundoff
    if rounded_sum:
        acc_error = acc_error + u_out * (np.abs(acc) + acc_error) + SMALLEST_SUBNORMAL[problem.dtype]
    epilogue = problem.epilogue
    pre = acc + (logical["bias"].astype(np.float64)[None, :] if epilogue.bias else 0.0)
    pre_error = acc_error + U32 * np.abs(pre)
    act = activation(epilogue.activation, pre)
    act_error = LIPSCHITZ[epilogue.activation] * pre_error
    if epilogue.activation != "none":
        act_error = act_error + 8.0 * U32 * (np.abs(pre) + np.abs(act))
    post = act + (logical["residual"][rows].astype(np.float64) if epilogue.residual else 0.0)
    post_error = act_error + (U32 * np.abs(post) if epilogue.residual else 0.0)
    bound = post_error + u_out * (np.abs(post) + post_error) + SMALLEST_SUBNORMAL[problem.dtype]
    return post, bound


def checked_rows(m: int, rng, whole_up_to: int = 512, block: int = 128, edge: int = 64) -> np.ndarray:
    """Output rows compared with float64: all of them for small M; otherwise the first and last
    `edge` rows (the ragged tile among them) and a random row in every `block` rows, so that every
    row tile of any realisation is sampled in some row (columns are always checked whole)."""
    if m <= whole_up_to:
        return np.arange(m)
    starts = np.arange(0, m, block)
    sampled = starts + rng.integers(0, block, size=starts.size)
    rows = np.concatenate([np.arange(edge), np.arange(m - edge, m), sampled[sampled < m]])
    return np.unique(rows)
