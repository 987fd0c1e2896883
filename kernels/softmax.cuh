// Row softmax families. Template parameters (shared by every family):
//   T         element type (float or aicg::bf16); arithmetic in float
//   THREADS   threads per block
//   VEC       elements per access when rows allow it (see row_access.cuh)
//   TOPOLOGY  how a row is split over threads (see reduce.cuh)
//   FAST_EXP  __expf instead of expf
//   CACHE     packs per thread held in registers between sweeps (0: re-read)
// Input rows lie x_stride elements apart (cols for a dense matrix); y is dense.
#pragma once
#include "online_softmax.cuh"
#include "reduce.cuh"
#include "row_access.cuh"

namespace aicg {

// Three sweeps: max, sum of exp(x - max), write exp(x - max) / sum. A row
// held in registers keeps each exp(x - max) from the second sweep for the
// third, so every element costs one exp; the values, and so the bits, are
// those a streamed row computes twice.
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void softmax_twopass(const T* __restrict__ x, T* __restrict__ y,
                                                int rows, int cols, int x_stride) {
  each_row<THREADS, TOPOLOGY, VEC, CACHE, true>(x, rows, cols, x_stride, rows_vectorisable<VEC>(cols, x_stride, x, y),
                                                [&](long long row, auto& r) {
    float m = ShiftMax().identity();
    r.each([&](int, float v) { m = ShiftMax()(m, v); });
    m = row_reduce<THREADS, TOPOLOGY>(m, ShiftMax());
    float s = 0.0f;
    if constexpr (held_in_registers<decltype(r)>::value) {
      r.update([&](int, float v) { const float e = exp_<FAST_EXP>(v - m); s += e; return e; });
    } else {
      r.each([&](int, float v) { s += exp_<FAST_EXP>(v - m); });
    }
    s = row_reduce<THREADS, TOPOLOGY>(s, Sum());
    const float inv = 1.0f / s;
    r.store((const T*)nullptr, (const T*)nullptr, y + row * cols, [&](int, float v, float, float) {
      if constexpr (held_in_registers<decltype(r)>::value) return v * inv;
      else return exp_<FAST_EXP>(v - m) * inv;
    });
  });
}

// Two sweeps: (max, sum) together as an online state, then write.
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void softmax_online(const T* __restrict__ x, T* __restrict__ y,
                                               int rows, int cols, int x_stride) {
  each_row<THREADS, TOPOLOGY, VEC, CACHE>(x, rows, cols, x_stride, rows_vectorisable<VEC>(cols, x_stride, x, y),
                                          [&](long long row, auto& r) {
    const MergeMaxSum<FAST_EXP> merge;
    MaxSum state = merge.identity();
    r.each([&](int, float v) { state = merge.add(state, v); });
    state = row_reduce<THREADS, TOPOLOGY>(state, merge);
    const float m = state.m, inv = 1.0f / state.s;
    r.store((const T*)nullptr, (const T*)nullptr, y + row * cols,
            [&](int, float v, float, float) { return exp_<FAST_EXP>(v - m) * inv; });
  });
}

}  // namespace aicg
