// Online softmax state: a running maximum m and the sum s of exp(x - m) over
// the elements seen, with the associative merge of Milakov & Gimelshein (2018).
#pragma once
#include "aicg_types.cuh"
#include "reduce.cuh"

namespace aicg {

struct MaxSum { float m, s; };

__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int offset, unsigned members) {
  return MaxSum{shfl_xor(v.m, offset, members), shfl_xor(v.s, offset, members)};
}

template <bool FAST_EXP>
struct MergeMaxSum {
  __device__ MaxSum identity() const { return MaxSum{Max().identity(), 0.0f}; }
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const {
    const float m = Max()(a.m, b.m);
    // A side that saw no finite value contributes nothing (avoids -inf - -inf).
    const float sa = a.s == 0.0f ? 0.0f : a.s * exp_<FAST_EXP>(a.m - m);
    const float sb = b.s == 0.0f ? 0.0f : b.s * exp_<FAST_EXP>(b.m - m);
    return MaxSum{m, sa + sb};
  }
  __device__ MaxSum add(MaxSum a, float x) const { return (*this)(a, MaxSum{x, 1.0f}); }
};

}  // namespace aicg
