// Backward row families of softmax and log-softmax: the gradient of x from the output's gradient g
// and the forward's output y (saved by the forward), one row at a time. Template parameters as in
// softmax.cuh, less FAST_EXP (log-softmax's exp is libdevice's expf). g and y rows lie g_stride and
// y_stride elements apart; dx is dense.
#pragma once
#include "backward/rows.cuh"

namespace aicg {

// dx_j = y_j (g_j - s), s = sum_k g_k y_k: one sum sweep, then the write.
template <typename T, int THREADS, int VEC, int TOPOLOGY, int CACHE>
__device__ __forceinline__ void softmax_backward(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ dx,
                                                 int rows, int cols, int g_stride, int y_stride) {
  each_row2<THREADS, TOPOLOGY, VEC, CACHE>(g, g_stride, y, y_stride, rows, cols,
                                           rows_vectorisable<VEC>(cols, g_stride | y_stride, g, y, dx),
                                           [&](long long row, const auto& r) {
    float s = 0.0f;
    r.each(nullptr, [&](int, float gj, float yj, float) { s += gj * yj; });
    s = row_reduce<THREADS, TOPOLOGY>(s, Sum());
    r.store(nullptr, dx + row * cols, [&](int, float gj, float yj, float) { return yj * (gj - s); });
  });
}

// dx_j = g_j - exp(y_j) s, s = sum_k g_k (exp(y) is the softmax the forward's log-softmax is the log of).
template <typename T, int THREADS, int VEC, int TOPOLOGY, int CACHE>
__device__ __forceinline__ void log_softmax_backward(const T* __restrict__ g, const T* __restrict__ y,
                                                     T* __restrict__ dx, int rows, int cols, int g_stride,
                                                     int y_stride) {
  each_row2<THREADS, TOPOLOGY, VEC, CACHE>(g, g_stride, y, y_stride, rows, cols,
                                           rows_vectorisable<VEC>(cols, g_stride | y_stride, g, y, dx),
                                           [&](long long row, const auto& r) {
    float s = 0.0f;
    r.each(nullptr, [&](int, float gj, float, float) { s += gj; });
    s = row_reduce<THREADS, TOPOLOGY>(s, Sum());
    r.store(nullptr, dx + row * cols, [&](int, float gj, float yj, float) { return gj - expf(yj) * s; });
  });
}

}  // namespace aicg
