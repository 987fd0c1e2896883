// Fused chains over rows: x and a residual r of the same shape read
// together, per-column vectors beside them, one output written once.
// Template parameters as in softmax.cuh (FAST_EXP unused; CACHE only by residual_rmsnorm). Input rows lie
// x_stride and r_stride elements apart; y is dense.
#pragma once
#include "ieee.cuh"
#include "reduce.cuh"
#include "row_access.cuh"

namespace aicg {

// consume(px, pr, i) for the lane's whole groups of packs of two rows, the
// loads of a group issued together (as each_group does for one row).
template <int V, typename T, typename C>
__device__ __forceinline__ int each_group_pair(const T* __restrict__ x, const T* __restrict__ r, int packs,
                                               int lane, int lanes, C&& consume) {
  int i = lane;
  for (; i + (UNROLL - 1) * lanes < packs; i += UNROLL * lanes) {
    Pack<T, V> px[UNROLL], pr[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      px[u] = load_pack<V>(x + (long long)(i + u * lanes) * V);
      pr[u] = load_pack<V>(r + (long long)(i + u * lanes) * V);
    }
    consume(px, pr, i);
  }
  return i;
}

// f(x_j, r_j) for the lane's elements of two rows, in increasing order.
template <int V, typename T, typename F>
__device__ __forceinline__ void for_each_pair(const T* __restrict__ x, const T* __restrict__ r, int cols,
                                              int lane, int lanes, bool vectorised, F&& f) {
  if (V > 1 && vectorised) {
    const int packs = cols / V;
    int i = each_group_pair<V>(x, r, packs, lane, lanes,
                               [&](const Pack<T, V> (&px)[UNROLL], const Pack<T, V> (&pr)[UNROLL], int) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) f(to_float(px[u].v[k]), to_float(pr[u].v[k]));
    });
    for (; i < packs; i += lanes) {
      const Pack<T, V> px = load_pack<V>(x + (long long)i * V), pr = load_pack<V>(r + (long long)i * V);
#pragma unroll
      for (int k = 0; k < V; ++k) f(to_float(px.v[k]), to_float(pr.v[k]));
    }
  } else {
    for (int j = lane; j < cols; j += lanes) f(to_float(x[j]), to_float(r[j]));
  }
}

// y_j = g(x_j, r_j, c_j) for the V elements of a pack at `at`; c is a per-column vector.
template <int V, typename T, typename G>
__device__ __forceinline__ Pack<T, V> map_pair_pack(const Pack<T, V>& px, const Pack<T, V>& pr,
                                                    const T* __restrict__ c, long long at, G& g) {
  const Pack<T, V> pc = load_pack<V>(c + at);
  float y[V];
#pragma unroll
  for (int k = 0; k < V; ++k) y[k] = g(to_float(px.v[k]), to_float(pr.v[k]), to_float(pc.v[k]));
  return pack_floats<T, V>(y);
}

// y_j = g(x_j, r_j, c_j) for the lane's elements; c is a per-column vector.
template <int V, typename T, typename G>
__device__ __forceinline__ void map_pair(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ c,
                                         T* __restrict__ y, int cols, int lane, int lanes, bool vectorised, G&& g) {
  if (V > 1 && vectorised) {
    const int packs = cols / V;
    int i = each_group_pair<V>(x, r, packs, lane, lanes,
                               [&](const Pack<T, V> (&px)[UNROLL], const Pack<T, V> (&pr)[UNROLL], int first) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const long long at = (long long)(first + u * lanes) * V;
        store_pack<V>(y + at, map_pair_pack<V>(px[u], pr[u], c, at, g));
      }
    });
    for (; i < packs; i += lanes) {
      const long long at = (long long)i * V;
      store_pack<V>(y + at, map_pair_pack<V>(load_pack<V>(x + at), load_pack<V>(r + at), c, at, g));
    }
  } else {
    for (int j = lane; j < cols; j += lanes) y[j] = from_float<T>(g(to_float(x[j]), to_float(r[j]), to_float(c[j])));
  }
}

// y = gelu(x + b) + r, gelu(z) = z (1 + erf(z / sqrt 2)) / 2
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void bias_gelu_residual(const T* __restrict__ x, const T* __restrict__ r,
                                                   const T* __restrict__ b, T* __restrict__ y, int rows, int cols,
                                                   int x_stride, int r_stride) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  static_assert(G::rows_per_thread == 1, "fused chains serve one row per thread");
  const long long row = G::row();
  if (row >= rows) return;
  map_pair<VEC>(x + row * x_stride, r + row * r_stride, b, y + row * cols, cols, G::lane(), G::lanes,
                rows_vectorisable<VEC>(cols, x_stride | r_stride, x, r, b, y),
                [](float xj, float rj, float bj) {
    const float z = xj + bj;
    return 0.5f * z * (1.0f + erff(z * 0.707106781186547524f)) + rj;
  });
}

// y = h / sqrt(mean(h^2) + eps) * w with h = x + r: held in registers as floats when CACHE
// packs per lane hold the row (the peers' way for long rows: x and r are read once), else
// recomputed in the second sweep. Each lane meets its elements in the same order either way,
// so the bits are the same.
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void residual_rmsnorm(const T* __restrict__ x, const T* __restrict__ r,
                                                 const T* __restrict__ w, T* __restrict__ y, int rows, int cols,
                                                 int x_stride, int r_stride, float eps) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  static_assert(G::rows_per_thread == 1, "fused chains serve one row per thread");
  const long long row = G::row();
  if (row >= rows) return;
  const T* xr = x + row * x_stride;
  const T* rr = r + row * r_stride;
  T* yr = y + row * cols;
  const bool vec = rows_vectorisable<VEC>(cols, x_stride | r_stride, x, r, w, y);
  const auto normalise = [&](auto& h) {
    float ss = 0.0f;
    h.each([&](int, float v) { ss += v * v; });
    ss = row_reduce<THREADS, TOPOLOGY>(ss, Sum());
    const float scale = reciprocal_sqrt(ss / cols + eps);
    h.store(w, (const T*)nullptr, yr, [&](int, float v, float wj, float) { return v * scale * wj; });
  };
  if constexpr (CACHE > 0) {
    if ((VEC == 1 || vec) && cols <= G::lanes * VEC * CACHE) {
      if (cols == G::lanes * VEC * CACHE) {
        RowCache<VEC, CACHE, T, true, true> h;
        h.load_sum(xr, rr, cols, G::lane(), G::lanes);
        normalise(h);
      } else {
        RowCache<VEC, CACHE, T, false, true> h;
        h.load_sum(xr, rr, cols, G::lane(), G::lanes);
        normalise(h);
      }
      return;
    }
  }
  float ss = 0.0f;
  for_each_pair<VEC>(xr, rr, cols, G::lane(), G::lanes, vec, [&](float xj, float rj) {
    const float h = xj + rj;
    ss += h * h;
  });
  ss = row_reduce<THREADS, TOPOLOGY>(ss, Sum());
  const float scale = reciprocal_sqrt(ss / cols + eps);
  map_pair<VEC>(xr, rr, w, yr, cols, G::lane(), G::lanes, vec,
                [&](float xj, float rj, float wj) { return (xj + rj) * scale * wj; });
}

}  // namespace aicg
