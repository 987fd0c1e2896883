"""GPU checks of the kernels' arithmetic shortcuts against the IEEE operation they stand for.

Skipped without a GPU; run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import numpy as np
import pytest

from aicg import nvrtc
from aicg.runtime import driver

DEVICE = driver.probe_device()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason="needs a CUDA GPU")]

# Counts the floats of [first, first + count) (as bit patterns) on which reciprocal_of_sum
# differs from 1.0f / s bit for bit; for a NaN it must give a NaN.
MISMATCHES = r"""
#include "softmax.cuh"
extern "C" __global__ void reciprocal_mismatches(unsigned first, unsigned count, unsigned* mismatches) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    const float s = __uint_as_float(first + i);
    const float fast = aicg::reciprocal_of_sum(s), ieee = 1.0f / s;
    const bool same = s == s ? __float_as_uint(fast) == __float_as_uint(ieee) : fast != fast;
    if (!same) atomicAdd(mismatches, 1u);
  }
}
"""


@pytest.fixture(scope="module")
def count_mismatches(repo):
    arch = "sm_%d%d" % DEVICE.compute_capability
    cubin = nvrtc.compile_cubin(MISMATCHES, "reciprocal_check.cu",
                                nvrtc.include_closure("softmax.cuh", repo / "kernels"), arch)[0]
    kernel = driver.Kernel(cubin, "reciprocal_mismatches")

    def count(first: int, n: int) -> int:
        with driver.Buffer(4) as out:
            out.fill_byte(0)
            kernel.launch(1024, 256, [(first, "u32"), (n, "u32"), (out.ptr, "ptr")])
            driver.synchronize()
            return int(out.download(np.uint32, 1)[0])
    return count


def test_the_softmax_sum_reciprocal_is_ieee_division_on_every_float_from_1_to_2_to_the_17(count_mismatches):
    one = int(np.float32(1.0).view(np.uint32))
    assert count_mismatches(one, 17 << 23) == 0          # every float in [1, 2^17): rows up to 131071 elements
    assert count_mismatches(0x7F800001, (1 << 23) - 1) == 0   # every positive NaN stays a NaN
    assert count_mismatches(0xFF800001, (1 << 23) - 1) == 0


def test_the_check_sees_a_difference(count_mismatches):
    # Past its range the shortcut differs: the top binade's reciprocals are subnormal, and it flushes them.
    assert count_mismatches(0x7F000000, 1 << 23) > 0
