// Backward row families of rmsnorm and layernorm: the gradient of x from the output's gradient g,
// the forward's input x and weight w. The row statistics the forward used (rmsnorm's inverse root
// mean square; layernorm's mean and inverse deviation) are computed again here, in the sweeps that
// form the gradient's own row sums: x is read for the gradient anyway, so keeping them from the
// forward would save no memory traffic. They are written, as floats, to `stats` for the weight's
// (and bias's) gradient, a column sum (backward/columns.cuh). Template parameters as in softmax.cuh,
// less FAST_EXP. g and x rows lie g_stride and x_stride elements apart; dx is dense.
#pragma once
#include "ieee.cuh"
#include "backward/rows.cuh"

namespace aicg {

// r = 1 / sqrt(mean(x^2) + eps), d = sum_k g_k w_k x_k:
// dx_j = r g_j w_j - x_j r^3 d / cols. stats[row] = r.
template <typename T, int THREADS, int VEC, int TOPOLOGY, int CACHE>
__device__ __forceinline__ void rmsnorm_backward(const T* __restrict__ g, const T* __restrict__ x,
                                                 const T* __restrict__ w, T* __restrict__ dx,
                                                 float* __restrict__ stats, int rows, int cols, int g_stride,
                                                 int x_stride, float eps) {
  each_row2<THREADS, TOPOLOGY, VEC, CACHE>(g, g_stride, x, x_stride, rows, cols,
                                           rows_vectorisable<VEC>(cols, g_stride | x_stride, g, x, w, dx),
                                           [&](long long row, const auto& r) {
    Sums2 s = AddSums2().identity();
    r.each(w, [&](int, float gj, float xj, float wj) { s.a += xj * xj; s.b += gj * wj * xj; });
    s = row_reduce<THREADS, TOPOLOGY>(s, AddSums2());
    const float inv = reciprocal_sqrt(s.a / cols + eps);   // as the forward computes it (norms.cuh)
    const float c = inv * inv * inv * (s.b / cols);
    r.store(w, dx + row * cols, [&](int, float gj, float xj, float wj) { return inv * (gj * wj) - xj * c; });
    if (RowGroup<THREADS, TOPOLOGY>::lane() == 0) stats[row] = inv;
  });
}

// mu = mean(x), r = 1 / sqrt(mean((x - mu)^2) + eps), a = mean(g w), d = sum_k g_k w_k (x_k - mu):
// dx_j = r (g_j w_j - a) - (x_j - mu) r^3 d / cols, in three sweeps (the mean first, then the
// deviations, as layernorm_twopass computes them). stats[2 row] = mu, stats[2 row + 1] = r.
template <typename T, int THREADS, int VEC, int TOPOLOGY, int CACHE>
__device__ __forceinline__ void layernorm_backward(const T* __restrict__ g, const T* __restrict__ x,
                                                   const T* __restrict__ w, T* __restrict__ dx,
                                                   float* __restrict__ stats, int rows, int cols, int g_stride,
                                                   int x_stride, float eps) {
  each_row2<THREADS, TOPOLOGY, VEC, CACHE>(g, g_stride, x, x_stride, rows, cols,
                                           rows_vectorisable<VEC>(cols, g_stride | x_stride, g, x, w, dx),
                                           [&](long long row, const auto& r) {
    Sums2 s = AddSums2().identity();
    r.each(w, [&](int, float gj, float xj, float wj) { s.a += xj; s.b += gj * wj; });
    s = row_reduce<THREADS, TOPOLOGY>(s, AddSums2());
    const float mean = s.a / cols, a = s.b / cols;
    Sums2 d = AddSums2().identity();
    r.each(w, [&](int, float gj, float xj, float wj) {
      const float centred = xj - mean;
      d.a += centred * centred;
      d.b += gj * wj * centred;
    });
    d = row_reduce<THREADS, TOPOLOGY>(d, AddSums2());
    const float inv = reciprocal_sqrt(d.a / cols + eps);
    const float c = inv * inv * inv * (d.b / cols);
    r.store(w, dx + row * cols, [&](int, float gj, float xj, float wj) { return inv * (gj * wj - a) - (xj - mean) * c; });
    if (RowGroup<THREADS, TOPOLOGY>::lane() == 0) {
      stats[2 * row] = mean;
      stats[2 * row + 1] = inv;
    }
  });
}

}  // namespace aicg
