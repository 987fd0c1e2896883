// Correctly rounded operations without the branch CUDA's own take to a
// slow-path call for operands outside their fast range. Each such call sits
// in its own convergence region, so a thread serving eight tiny rows ran the
// rows' arithmetic one row after another; branch-free, the rows interleave.
// tests/test_gpu_arithmetic.py compares each with the CUDA operation it
// replaces, bit for bit.
#pragma once

namespace aicg {

// CUDA's fast path of 1.0f / s (MUFU.RCP and one Newton step), right where
// it takes no slow path: s normal, with an exponent below the top three.
__device__ __forceinline__ float reciprocal_in_range(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return fmaf(r, -fmaf(s, r, -1.0f), r);
}

// 1 / s for a softmax sum, which is at least 1 (the maximum's own exp(0)) or
// NaN: in range, or NaN in and NaN out. Checked on every float in [1, 2^17).
__device__ __forceinline__ float reciprocal_of_sum(float s) { return reciprocal_in_range(s); }

// 1.0f / sqrtf(x) for every float x. sqrtf's fast path (MUFU.RSQ and one
// Newton step) covers x from 2^-101 up; a smaller x is scaled up by 2^126
// and its root down by 2^63, both exact. The root, from 2^-74.5 to 2^64, is
// in the reciprocal's range. Zeros, infinity and NaN are answered directly.
// Checked on all 2^32 floats.
__device__ __forceinline__ float reciprocal_sqrt(float x) {
  const bool small = x < 0x1p-100f;
  const float scaled = small ? x * 0x1p126f : x;
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(scaled));
  const float y = scaled * r;
  float root = fmaf(fmaf(-y, y, scaled), r * 0.5f, y);
  if (small) root *= 0x1p-63f;
  const float inverse = reciprocal_in_range(root);
  if (x == 0.0f) return __int_as_float(0x7f800000 | (__float_as_int(x) & 0x80000000));   // 1 / +-0
  if (x == __int_as_float(0x7f800000)) return 0.0f;                                      // 1 / inf
  return inverse;   // a negative x or NaN gives NaN on its own
}

}  // namespace aicg
