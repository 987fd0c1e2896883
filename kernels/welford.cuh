// Welford state (count, mean, M2) with Chan et al.'s (1979) pairwise merge:
// one pass yields mean and variance without the cancellation of E[x^2]-E[x]^2.
#pragma once
#include "reduce.cuh"

namespace aicg {

struct Welford { float n, mean, m2; };

__device__ __forceinline__ Welford shfl_xor(Welford v, int offset, unsigned members) {
  return Welford{shfl_xor(v.n, offset, members), shfl_xor(v.mean, offset, members), shfl_xor(v.m2, offset, members)};
}

struct MergeWelford {
  __device__ Welford identity() const { return Welford{0.0f, 0.0f, 0.0f}; }
  __device__ Welford operator()(Welford a, Welford b) const {
    if (b.n == 0.0f) return a;
    if (a.n == 0.0f) return b;
    const float n = a.n + b.n;
    const float d = b.mean - a.mean;
    const float wb = b.n / n;
    return Welford{n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
  }
  __device__ Welford add(Welford a, float x) const {
    const float n = a.n + 1.0f;
    const float d = x - a.mean;
    const float mean = a.mean + d / n;
    return Welford{n, mean, a.m2 + d * (x - mean)};
  }
};

}  // namespace aicg
