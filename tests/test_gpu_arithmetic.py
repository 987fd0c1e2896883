"""GPU checks of kernels/ieee.cuh: each branch-free operation against the CUDA operation it replaces.

Skipped without a GPU; run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import numpy as np
import pytest

from aicg import nvrtc
from aicg.runtime import driver

DEVICE = driver.probe_device()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason="needs a CUDA GPU")]

# Each entry counts the floats of [first, first + count) (as bit patterns, the count wrapping past
# 2^32 - 1) on which the operation differs from CUDA's bit for bit; where CUDA's is NaN, any NaN is right.
MISMATCHES = r"""
#include "ieee.cuh"
template <typename Ours, typename Cuda>
__device__ void count_mismatches(unsigned first, unsigned long long count, unsigned long long* mismatches,
                                 Ours ours, Cuda cuda) {
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
    const float x = __uint_as_float(first + (unsigned)i);
    const float mine = ours(x), theirs = cuda(x);
    const bool same = theirs == theirs ? __float_as_uint(mine) == __float_as_uint(theirs) : mine != mine;
    if (!same) atomicAdd(mismatches, 1ull);
  }
}
extern "C" __global__ void reciprocal_of_sum(unsigned first, unsigned long long count, unsigned long long* out) {
  count_mismatches(first, count, out, [](float s) { return aicg::reciprocal_of_sum(s); },
                   [](float s) { return 1.0f / s; });
}
extern "C" __global__ void reciprocal_sqrt(unsigned first, unsigned long long count, unsigned long long* out) {
  count_mismatches(first, count, out, [](float x) { return aicg::reciprocal_sqrt(x); },
                   [](float x) { return 1.0f / sqrtf(x); });
}
"""


@pytest.fixture(scope="module")
def mismatches(repo):
    arch = "sm_%d%d" % DEVICE.compute_capability
    cubin = nvrtc.compile_cubin(MISMATCHES, "ieee_check.cu", nvrtc.include_closure("ieee.cuh", repo / "kernels"),
                                arch)[0]
    kernels = {name: driver.Kernel(cubin, name) for name in ("reciprocal_of_sum", "reciprocal_sqrt")}

    def count(operation: str, first: int, n: int) -> int:
        with driver.Buffer(8) as out:
            out.fill_byte(0)
            kernels[operation].launch(4096, 256, [(first, "u32"), (n, "u64"), (out.ptr, "ptr")])
            driver.synchronize()
            return int(out.download(np.uint64, 1)[0])
    return count


def _bits(value: float) -> int:
    return int(np.float32(value).view(np.uint32))


def test_the_softmax_sum_reciprocal_is_cudas_on_every_float_from_1_to_2_to_the_17(mismatches):
    assert mismatches("reciprocal_of_sum", _bits(1.0), 17 << 23) == 0   # sums of rows up to 131071 elements
    assert mismatches("reciprocal_of_sum", 0x7F800001, (1 << 23) - 1) == 0   # every positive NaN stays a NaN
    assert mismatches("reciprocal_of_sum", 0xFF800001, (1 << 23) - 1) == 0


def test_the_reciprocal_square_root_is_cudas_on_every_float(mismatches):
    assert mismatches("reciprocal_sqrt", 0, 1 << 32) == 0


def test_the_checks_see_a_difference(mismatches):
    # Past its range the sum's reciprocal differs: the top binade's reciprocals are subnormal, and it flushes them.
    assert mismatches("reciprocal_of_sum", 0x7F000000, 1 << 23) > 0
