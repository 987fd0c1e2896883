"""GPU checks of kernels/ieee.cuh: each branch-free operation against the CUDA operation it replaces.

Compiled for this machine's GPU (its hwdb entry); skipped without a GPU that hwdb/ has an entry for.
Run on a GPU node with `pytest -m gpu`.
"""
from __future__ import annotations

import numpy as np
import pytest

from aicg import nvrtc
from aicg.runtime import driver

pytestmark = pytest.mark.gpu

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

# aicg::Max against the rule it keeps (kernels/reduce.cuh), written plainly: a NaN on either side
# gives a NaN, of two zeros +0 wins, otherwise the larger. Pairs are every two of SPECIAL, then
# pseudo-random bit patterns; fmaxf, which drops NaN, must show mismatches.
MAX_MISMATCHES = r"""
#include "reduce.cuh"
__device__ const unsigned SPECIAL[] = {
  0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00800000u, 0x80800000u,
  0x3f800000u, 0xbf800000u, 0x3f800001u, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
  0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x7fa00000u, 0x40490fdbu, 0xc0490fdbu};
constexpr unsigned SPECIALS = sizeof(SPECIAL) / sizeof(SPECIAL[0]);
__device__ __forceinline__ unsigned mix(unsigned long long i) {   // splitmix64's finaliser, cut to 32 bits
  i = (i ^ (i >> 30)) * 0xbf58476d1ce4e5b9ull;
  i = (i ^ (i >> 27)) * 0x94d049bb133111ebull;
  return (unsigned)(i ^ (i >> 31));
}
__device__ __forceinline__ float rule(float a, float b) {
  if (a != a || b != b) return __int_as_float(0x7fffffff);
  if (a == 0.0f && b == 0.0f) return (signbit(a) && signbit(b)) ? -0.0f : 0.0f;
  return a > b ? a : b;
}
template <typename Max>
__device__ void count(unsigned long long pairs, unsigned long long* mismatches, Max max) {
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += step) {
    const bool special = i < SPECIALS * SPECIALS;
    const float a = __uint_as_float(special ? SPECIAL[i % SPECIALS] : mix(2 * i));
    const float b = __uint_as_float(special ? SPECIAL[i / SPECIALS] : mix(2 * i + 1));
    const float mine = max(a, b), theirs = rule(a, b);
    const bool same = theirs == theirs ? __float_as_uint(mine) == __float_as_uint(theirs) : mine != mine;
    if (!same) atomicAdd(mismatches, 1ull);
  }
}
extern "C" __global__ void max_of_pairs(unsigned long long pairs, unsigned long long* out) {
  count(pairs, out, aicg::Max());
}
extern "C" __global__ void fmaxf_of_pairs(unsigned long long pairs, unsigned long long* out) {
  count(pairs, out, [](float a, float b) { return fmaxf(a, b); });
}
"""


@pytest.fixture(scope="module")
def mismatches(repo, device_target):
    cubin = nvrtc.compile_cubin(MISMATCHES, "ieee_check.cu", nvrtc.include_closure("ieee.cuh", repo / "kernels"),
                                device_target.arch)[0]
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


@pytest.fixture(scope="module")
def max_mismatches(repo, device_target):
    cubin = nvrtc.compile_cubin(MAX_MISMATCHES, "max_check.cu",
                                nvrtc.include_closure("reduce.cuh", repo / "kernels"), device_target.arch)[0]
    kernels = {name: driver.Kernel(cubin, name) for name in ("max_of_pairs", "fmaxf_of_pairs")}

    def count(kernel: str, pairs: int) -> int:
        with driver.Buffer(8) as out:
            out.fill_byte(0)
            kernels[kernel].launch(4096, 256, [(pairs, "u64"), (out.ptr, "ptr")])
            driver.synchronize()
            return int(out.download(np.uint64, 1)[0])
    return count


def test_the_row_maximum_keeps_its_rule_on_special_values_and_a_billion_random_pairs(max_mismatches):
    assert max_mismatches("max_of_pairs", 1 << 30) == 0


def test_the_maximum_check_sees_a_maximum_that_drops_nan(max_mismatches):
    assert max_mismatches("fmaxf_of_pairs", 24 * 24) > 0
