// Row softmax and log-softmax families. Template parameters (shared by every family):
//   T         element type (float, aicg::bf16 or aicg::f16); arithmetic in float
//   THREADS   threads per block
//   VEC       elements per access when rows allow it (see row_access.cuh)
//   TOPOLOGY  how a row is split over threads (see reduce.cuh)
//   FAST_EXP  __expf instead of expf
//   CACHE     packs per thread held in registers between sweeps (0: re-read)
// Input rows lie x_stride elements apart (cols for a dense matrix); y is dense.
#pragma once
#include "ieee.cuh"
#include "online_softmax.cuh"
#include "reduce.cuh"
#include "row_access.cuh"

namespace aicg {

// The row's maximum (ShiftMax: see reduce.cuh), one sweep.
template <int THREADS, int TOPOLOGY, typename R>
__device__ __forceinline__ float row_shift(R& r) {
  float m = ShiftMax().identity();
  r.each([&](int, float v) { m = ShiftMax()(m, v); });
  return row_reduce<THREADS, TOPOLOGY>(m, ShiftMax());
}

// The row's (max, sum of exp(x - max)) as one online state, one sweep.
template <int THREADS, int TOPOLOGY, bool FAST_EXP, typename R>
__device__ __forceinline__ MaxSum row_max_sum(R& r) {
  const MergeMaxSum<FAST_EXP> merge;
  MaxSum state = merge.identity();
  r.each([&](int, float v) { state = merge.add(state, v); });
  return row_reduce<THREADS, TOPOLOGY>(state, merge);
}

// Three sweeps: max, sum of exp(x - max), write exp(x - max) / sum. A row
// held in registers keeps each exp(x - max) from the second sweep for the
// third, so every element costs one exp, while its exps as floats fit in 32
// registers a lane; a longer 16-bit row is held as loaded and computes each
// exp again in the third sweep (bfloat16 t512 v16 c8 keeping its 64 floats took
// 128 registers and one block to an SM, 176.5 us at 4096x32768 on the H200;
// computing again, 64 registers, two blocks, 146.5 us). Either way the
// values, and so the bits, are those a streamed row computes twice.
// ROUNDED (softmax_rounded_exps): that longer 16-bit row keeps its exps instead, rounded to its
// type in the slots that held x, so the write computes no exp; each output is rounded twice.
template <bool ROUNDED, typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void softmax_sweeps(const T* __restrict__ x, T* __restrict__ y,
                                               int rows, int cols, int x_stride) {
  constexpr bool KEEP_EXP = sizeof(T) == sizeof(float) || CACHE * VEC <= 32;
  each_row<THREADS, TOPOLOGY, VEC, CACHE, KEEP_EXP>(x, rows, cols, x_stride,
                                                    rows_vectorisable<VEC>(cols, x_stride, x, y),
                                                    [&](long long row, auto& r) {
    constexpr bool held = held_in_registers<decltype(r)>::value;
    constexpr bool kept = KEEP_EXP && held, rounded = ROUNDED && !KEEP_EXP && held;
    const float m = row_shift<THREADS, TOPOLOGY>(r);
    float s = 0.0f;
    const auto exp_summed = [&](int, float v) { const float e = exp_<FAST_EXP>(v - m); s += e; return e; };
    if constexpr (kept) {
      r.update(exp_summed);
    } else if constexpr (rounded) {
      r.update_rounded(exp_summed);
    } else {
      r.each(exp_summed);
    }
    s = row_reduce<THREADS, TOPOLOGY>(s, Sum());
    const float inv = reciprocal_of_sum(s);
    r.store(nullptr, nullptr, y + row * cols, [&](int, float v, float, float) {
      if constexpr (kept || rounded) return v * inv;
      else return exp_<FAST_EXP>(v - m) * inv;
    });
  });
}

template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void softmax_twopass(const T* __restrict__ x, T* __restrict__ y,
                                                int rows, int cols, int x_stride) {
  softmax_sweeps<false, T, THREADS, VEC, TOPOLOGY, FAST_EXP, CACHE>(x, y, rows, cols, x_stride);
}

template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void softmax_rounded_exps(const T* __restrict__ x, T* __restrict__ y,
                                                     int rows, int cols, int x_stride) {
  softmax_sweeps<true, T, THREADS, VEC, TOPOLOGY, FAST_EXP, CACHE>(x, y, rows, cols, x_stride);
}

// Two sweeps: (max, sum) together as an online state, then write
// exp(x - max) / sum, or for LOG (x - max) - log(sum).
template <bool LOG, typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void normalise_online(const T* __restrict__ x, T* __restrict__ y,
                                                 int rows, int cols, int x_stride) {
  each_row<THREADS, TOPOLOGY, VEC, CACHE>(x, rows, cols, x_stride, rows_vectorisable<VEC>(cols, x_stride, x, y),
                                          [&](long long row, auto& r) {
    const MaxSum state = row_max_sum<THREADS, TOPOLOGY, FAST_EXP>(r);
    const float m = state.m, inv = LOG ? 0.0f : reciprocal_of_sum(state.s), log_s = LOG ? logf(state.s) : 0.0f;
    r.store(nullptr, nullptr, y + row * cols, [&](int, float v, float, float) {
      if constexpr (LOG) return (v - m) - log_s;
      else return exp_<FAST_EXP>(v - m) * inv;
    });
  });
}

template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void softmax_online(const T* __restrict__ x, T* __restrict__ y,
                                               int rows, int cols, int x_stride) {
  normalise_online<false, T, THREADS, VEC, TOPOLOGY, FAST_EXP, CACHE>(x, y, rows, cols, x_stride);
}

// Log-softmax, y = (x - max) - log(sum of exp(x - max)), in the atlas's
// order: the shift first, the log of the sum (>= 1) once per row. Three
// sweeps (max, sum of exp, write) as softmax_twopass; the write needs no
// exp, so a held row keeps x itself.
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void log_softmax_twopass(const T* __restrict__ x, T* __restrict__ y,
                                                    int rows, int cols, int x_stride) {
  each_row<THREADS, TOPOLOGY, VEC, CACHE>(x, rows, cols, x_stride, rows_vectorisable<VEC>(cols, x_stride, x, y),
                                          [&](long long row, auto& r) {
    const float m = row_shift<THREADS, TOPOLOGY>(r);
    float s = 0.0f;
    r.each([&](int, float v) { s += exp_<FAST_EXP>(v - m); });
    const float log_s = logf(row_reduce<THREADS, TOPOLOGY>(s, Sum()));
    r.store(nullptr, nullptr, y + row * cols,
            [&](int, float v, float, float) { return (v - m) - log_s; });
  });
}

// Log-softmax in two sweeps: the online (max, sum) state, then write.
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void log_softmax_online(const T* __restrict__ x, T* __restrict__ y,
                                                   int rows, int cols, int x_stride) {
  normalise_online<true, T, THREADS, VEC, TOPOLOGY, FAST_EXP, CACHE>(x, y, rows, cols, x_stride);
}

}  // namespace aicg
