"""How far a matrix realisation's result may be from the exact one, against the profile's rtol.

The bound is aicg/matrix/reference.py's, step by step, relative to
sum_k |a_ik b_kj| (the scale of a sum in aicg/ops.py: the error of adding n
terms is bounded by their magnitudes, whatever their cancellation):

  accumulation  2 (ceil(K/16) + s) u        (s: the parts K is split into)
  rounded sum   u_T, where the realisation rounds the sum to T before its epilogue
  activation    times its largest slope, plus 8 u for its float evaluation
  bias, residual one float addition each: u
  output        u_T, the output type's unit roundoff

A realisation serves a workload shape only where that sum fits the dtype's
rtol: with float32 accumulation that is K up to about 68 thousand in float16
(rtol 1e-3) and 1.6 million in bfloat16 (rtol 1.6e-2), so the check decides
little today; it is the matrix family's counterpart of the row families'
longest row (aicg/semantics/accuracy.py), and it rules every realisation out
where rtol is 0 (bit equality with the reference order, which tensor cores
never give).
"""
from __future__ import annotations

from ..dtypes import DTYPES
from .reference import LIPSCHITZ, U32, accumulation_roundings
from .space import Epilogue

ACTIVATION_EVALUATION = 8.0     # reference.py's allowance for tanhf / erff / expf and the float operations around them


def relative_bound(dtype: str, k: int, splits: int, epilogue: Epilogue, rounded_sum: bool = False) -> float:
    """The realisation's error bound at depth `k`, split `splits` ways, relative to sum_k |a b|;
    `rounded_sum`: it rounds each sum to the output type before the epilogue."""
    bound = 2.0 * accumulation_roundings(k, splits) * U32 * LIPSCHITZ[epilogue.activation]
    bound += (DTYPES[dtype].unit_roundoff * LIPSCHITZ[epilogue.activation] if rounded_sum else 0.0)
    bound += (ACTIVATION_EVALUATION if epilogue.activation != "none" else 0.0) * U32
    bound += (epilogue.bias + epilogue.residual) * U32
    return bound + DTYPES[dtype].unit_roundoff


def keeps(dtype: str, k: int, splits: int, epilogue: Epilogue, rtol: float, rounded_sum: bool = False) -> bool:
    return relative_bound(dtype, k, splits, epilogue, rounded_sum) <= rtol


def longest_k(dtype: str, splits: int, epilogue: Epilogue, rtol: float, rounded_sum: bool = False) -> int:
    """The deepest K whose bound fits `rtol` with `splits` parts (0: none does)."""
    fixed = relative_bound(dtype, 0, splits, epilogue, rounded_sum) - 2.0 * splits * U32 * LIPSCHITZ[epilogue.activation]
    per_step = 2.0 * U32 * LIPSCHITZ[epilogue.activation]
    room = rtol - fixed - splits * per_step
    return max(0, int(room // per_step) * 16) if room > 0 else 0
