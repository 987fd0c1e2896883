// Row sum and row max families: y[r] = reduce_j x[r, j]. Template parameters
// as in softmax.cuh (FAST_EXP and CACHE unused: one sweep reads each element once).
#pragma once
#include "reduce.cuh"
#include "row_access.cuh"

namespace aicg {

template <typename T, int THREADS, int VEC, int TOPOLOGY, typename Op>
__device__ __forceinline__ void reduce_rows(const T* __restrict__ x, T* __restrict__ y, int rows,
                                            int cols, int x_stride, Op op) {
  // CACHE 0: a row is streamed (one sweep reads each element once), unless a thread serves tiny rows.
  each_row<THREADS, TOPOLOGY, VEC, 0>(x, rows, cols, x_stride, rows_vectorisable<VEC>(cols, x_stride, x),
                                      [&](long long row, auto& r) {
    float acc = op.identity();
    r.each([&](int, float v) { acc = op(acc, v); });
    acc = row_reduce<THREADS, TOPOLOGY>(acc, op);
    if (RowGroup<THREADS, TOPOLOGY>::lane() == 0) y[row] = from_float<T>(acc);
  });
}

template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void row_sum(const T* __restrict__ x, T* __restrict__ y, int rows, int cols,
                                        int x_stride) {
  reduce_rows<T, THREADS, VEC, TOPOLOGY>(x, y, rows, cols, x_stride, Sum());
}

template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void row_max(const T* __restrict__ x, T* __restrict__ y, int rows, int cols,
                                        int x_stride) {
  reduce_rows<T, THREADS, VEC, TOPOLOGY>(x, y, rows, cols, x_stride, Max());
}

}  // namespace aicg
