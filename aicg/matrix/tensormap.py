"""TMA descriptors of the wgmma realisation's operands.

Each operand is a 2-D tensor in the driver's terms: dimension 0 the
contiguous one. The box is what one copy moves: 64 elements (128 bytes, the
128-byte swizzle's row) along dimension 0, and along dimension 1 the tile's
rows (K-major operands) or 64 K rows (MN-major operands, copied one 64-wide
box at a time). These must match kernels/matrix/gemm_wgmma.cuh's
WgmmaTile::load_stage byte for byte: the bytes each stage's boxes fill are
the STAGE_BYTES its barrier expects.

`spec` is plain arithmetic (checked on any machine); `encode` asks the CUDA
driver for the 128-byte descriptor.
"""
from __future__ import annotations

from dataclasses import dataclass

from .problem import Problem
from .space import Realisation
from .templates.base import ELEMENT_BYTES

SWIZZLE_ROW = 64        # elements in a 128-byte swizzle row
MAX_BOX = 256           # elements along any box dimension
MAX_STRIDE = 2**40


@dataclass(frozen=True)
class TensorMapSpec:
    dims: tuple[int, int]        # elements, contiguous dimension first
    stride_bytes: int            # between successive rows (dimension 1)
    box: tuple[int, int]
    dtype: str

    @property
    def box_bytes(self) -> int:
        return self.box[0] * self.box[1] * ELEMENT_BYTES

    def problems(self, address: int) -> list[str]:
        """What cuTensorMapEncodeTiled would reject (CUDA driver API, cuTensorMapEncodeTiled)."""
        found = []
        if address % 16:
            found.append(f"base address {address:#x} is not 16-byte aligned")
        if self.stride_bytes % 16 or not 0 < self.stride_bytes < MAX_STRIDE:
            found.append(f"row stride of {self.stride_bytes} bytes is not a multiple of 16 below 2^40")
        if any(not 1 <= d <= 2**32 for d in self.dims):
            found.append(f"dimensions {self.dims} outside 1..2^32")
        if any(not 1 <= b <= MAX_BOX for b in self.box) or self.box[0] * ELEMENT_BYTES > 128:
            found.append(f"box {self.box} beyond 256 elements, or wider than the 128-byte swizzle")
        return found


def spec(real: Realisation, problem: Problem, operand: str) -> TensorMapSpec:
    """The descriptor of operand "a" or "b" for the wgmma realisation `real` on `problem`."""
    if real.template != "wgmma":
        raise ValueError(f"{real.template} realisations take no tensor maps")
    k = real.settings
    if operand == "a":
        major, ld, outer_tile = problem.a_major, problem.lda, k["block_m"] // k["cluster_n"]
        rows, cols = problem.a_stored
    elif operand == "b":
        major, ld, outer_tile = problem.b_major, problem.ldb, k["block_n"] // k["cluster_m"]
        rows, cols = problem.b_stored
    else:
        raise ValueError(f"operand {operand!r}: expected 'a' or 'b'")
    box = (SWIZZLE_ROW, outer_tile) if major == "k" else (SWIZZLE_ROW, SWIZZLE_ROW)
    return TensorMapSpec((cols, rows), ld * ELEMENT_BYTES, box, problem.dtype)


def stage_bytes(real: Realisation) -> int:
    """Bytes one stage's copies deliver to each CTA: all of A's and B's tile slices (shared or not)."""
    k = real.settings
    return (k["block_m"] + k["block_n"]) * SWIZZLE_ROW * ELEMENT_BYTES


def encode(s: TensorMapSpec, address: int):
    """The driver's CUtensorMap for `s` at device address `address` (128-byte swizzle, zero fill
    outside the tensor, L2 sectors fetched 256 bytes at a time)."""
    from cuda.bindings import driver as cu

    from ..runtime.driver import check
    problems = s.problems(address)
    if problems:
        raise ValueError("a TMA descriptor cannot describe this operand: " + "; ".join(problems))
    kind = {"bfloat16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            "float16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}[s.dtype]
    return check(cu.cuTensorMapEncodeTiled(
        kind, 2, address, [cu.cuuint64_t(d) for d in s.dims], [cu.cuuint64_t(s.stride_bytes)],
        [cu.cuuint32_t(b) for b in s.box], [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
