// Walking one row with `lanes` cooperating threads, V elements per access when
// every row start is aligned for it, one element per access otherwise.
#pragma once
#include "aicg_types.cuh"

namespace aicg {

// Whether all rows of every given matrix can be read in packs of V: the base
// pointers aligned to the pack size and each row a whole number of packs.
template <int V, typename T>
__device__ __forceinline__ bool rows_vectorisable(int cols, const T* a, const T* b = nullptr,
                                                  const T* c = nullptr, const T* d = nullptr) {
  if (V == 1) return false;
  const unsigned long long mask = sizeof(T) * V - 1;
  const unsigned long long bits = (unsigned long long)a | (unsigned long long)b |
                                  (unsigned long long)c | (unsigned long long)d;
  return cols % V == 0 && (bits & mask) == 0;
}

// f(j, x_j) for every element j of the row that this lane owns.
template <int V, typename T, typename F>
__device__ __forceinline__ void for_each(const T* __restrict__ row, int cols, int lane, int lanes,
                                         bool vectorised, F&& f) {
  if (V > 1 && vectorised) {
    const int packs = cols / V;
    for (int i = lane; i < packs; i += lanes) {
      const Pack<T, V> p = load_pack<V>(row + (long long)i * V);
#pragma unroll
      for (int k = 0; k < V; ++k) f(i * V + k, to_float(p.v[k]));
    }
  } else {
    for (int j = lane; j < cols; j += lanes) f(j, to_float(row[j]));
  }
}

// y_j = g(j, x_j, w_j, b_j) for the lane's elements; w and b are per-column
// vectors (length cols) and may be null, in which case g sees 1 and 0.
template <int V, typename T, typename G>
__device__ __forceinline__ void map_row(const T* __restrict__ x, const T* __restrict__ w,
                                        const T* __restrict__ b, T* __restrict__ y, int cols,
                                        int lane, int lanes, bool vectorised, G&& g) {
  if (V > 1 && vectorised) {
    const int packs = cols / V;
    for (int i = lane; i < packs; i += lanes) {
      const long long at = (long long)i * V;
      const Pack<T, V> px = load_pack<V>(x + at);
      Pack<T, V> pw, pb, py;
      if (w) pw = load_pack<V>(w + at);
      if (b) pb = load_pack<V>(b + at);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float wk = w ? to_float(pw.v[k]) : 1.0f;
        const float bk = b ? to_float(pb.v[k]) : 0.0f;
        py.v[k] = from_float<T>(g(i * V + k, to_float(px.v[k]), wk, bk));
      }
      store_pack<V>(y + at, py);
    }
  } else {
    for (int j = lane; j < cols; j += lanes) {
      const float wj = w ? to_float(w[j]) : 1.0f;
      const float bj = b ? to_float(b[j]) : 0.0f;
      y[j] = from_float<T>(g(j, to_float(x[j]), wj, bj));
    }
  }
}

}  // namespace aicg
