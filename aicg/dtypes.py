"""Element types aicg generates kernels for, and their host-side encoding.

numpy has no bfloat16, so bfloat16 (and, alike, float16) arrays live on the
host as their uint16 bit patterns; `encode` rounds float values to the dtype (round to nearest
even, as the device does) and `decode` widens them back to float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    ctype: str          # the element type in kernels/
    size: int           # bytes
    storage: type       # numpy dtype of the host bits
    unit_roundoff: float   # 2^-p for p bits of significand: the relative error of one rounding to nearest

    def encode(self, values: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):   # beyond the dtype's range is inf, as on the device
            return _ENCODERS[self.name](np.asarray(values, dtype=np.float32))

    def decode(self, stored: np.ndarray) -> np.ndarray:
        return _DECODERS[self.name](stored)


def _to_bf16_bits(f32: np.ndarray) -> np.ndarray:
    bits = f32.view(np.uint32)
    # bits + 0x7FFF + lsb, in place in 32 bits: it wraps only for NaN bit patterns, replaced below
    total = (bits >> 16) & 1
    total += 0x7FFF
    total += bits
    rounded = (total >> 16).astype(np.uint16)
    rounded[np.isnan(f32)] = 0x7FC0
    return rounded


def _from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


_ENCODERS = {"float32": lambda a: a.copy(), "bfloat16": _to_bf16_bits,
             "float16": lambda a: a.astype(np.float16).view(np.uint16)}     # numpy rounds to nearest even
_DECODERS = {"float32": lambda a: a.astype(np.float32), "bfloat16": _from_bf16_bits,
             "float16": lambda a: np.asarray(a, dtype=np.uint16).view(np.float16).astype(np.float32)}

DTYPES: dict[str, DType] = {
    "float32": DType("float32", "float", 4, np.float32, 2.0**-24),
    "bfloat16": DType("bfloat16", "aicg::bf16", 2, np.uint16, 2.0**-8),
    "float16": DType("float16", "aicg::f16", 2, np.uint16, 2.0**-11),
}
ACCUMULATOR = DTYPES["float32"]   # what every family computes in (kernels/aicg_types.cuh: to_float)
