// Normalisation families over rows: rmsnorm and layernorm. Template
// parameters as in softmax.cuh (FAST_EXP unused). w and b have `cols` entries.
#pragma once
#include "ieee.cuh"
#include "reduce.cuh"
#include "row_access.cuh"
#include "welford.cuh"

namespace aicg {

// y = x / sqrt(mean(x^2) + eps) * w
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void rmsnorm(const T* __restrict__ x, const T* __restrict__ w,
                                        T* __restrict__ y, int rows, int cols, int x_stride,
                                        float eps) {
  each_row<THREADS, TOPOLOGY, VEC, CACHE>(x, rows, cols, x_stride, rows_vectorisable<VEC>(cols, x_stride, x, w, y),
                                          [&](long long row, auto& r) {
    float ss = 0.0f;
    r.each([&](int, float v) { ss += v * v; });
    ss = row_reduce<THREADS, TOPOLOGY>(ss, Sum());
    const float scale = reciprocal_sqrt(ss / cols + eps);
    r.store(w, nullptr, y + row * cols, [&](int, float v, float wj, float) { return v * scale * wj; });
  });
}

// Layernorm with mean and variance in two sweeps: sum, then sum of squared deviations.
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void layernorm_twopass(const T* __restrict__ x, const T* __restrict__ w,
                                                  const T* __restrict__ b, T* __restrict__ y,
                                                  int rows, int cols, int x_stride, float eps) {
  each_row<THREADS, TOPOLOGY, VEC, CACHE>(x, rows, cols, x_stride, rows_vectorisable<VEC>(cols, x_stride, x, w, b, y),
                                          [&](long long row, auto& r) {
    float s = 0.0f;
    r.each([&](int, float v) { s += v; });
    const float mean = row_reduce<THREADS, TOPOLOGY>(s, Sum()) / cols;
    float d2 = 0.0f;
    r.each([&](int, float v) { d2 += (v - mean) * (v - mean); });
    const float var = row_reduce<THREADS, TOPOLOGY>(d2, Sum()) / cols;
    const float scale = reciprocal_sqrt(var + eps);
    r.store(w, b, y + row * cols, [&](int, float v, float wj, float bj) { return (v - mean) * scale * wj + bj; });
  });
}

// Layernorm with mean and variance from one sweep of Welford states.
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void layernorm_welford(const T* __restrict__ x, const T* __restrict__ w,
                                                  const T* __restrict__ b, T* __restrict__ y,
                                                  int rows, int cols, int x_stride, float eps) {
  each_row<THREADS, TOPOLOGY, VEC, CACHE>(x, rows, cols, x_stride, rows_vectorisable<VEC>(cols, x_stride, x, w, b, y),
                                          [&](long long row, auto& r) {
    const MergeWelford merge;
    Welford st = merge.identity();
    r.each([&](int, float v) { st = merge.add(st, v); });
    st = row_reduce<THREADS, TOPOLOGY>(st, merge);
    const float mean = st.mean, scale = reciprocal_sqrt(st.m2 / st.n + eps);
    r.store(w, b, y + row * cols, [&](int, float v, float wj, float bj) { return (v - mean) * scale * wj + bj; });
  });
}

}  // namespace aicg
