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

// y = g(x, r, c) over the elements of y in order as one range spread over the whole grid, V at a
// time (launch_geometry gives each pack a thread; the loop strides on where the grid was capped).
// Where x and r are dense like y, a pack runs on across row ends, each element stepping its
// column on from the pack's first; where rows lie apart, a pack stays in its row (whole packs
// per row, or V == 1). c is read a pack at a time where each pack is one of c's (c_packed).
// Index is 32 bits wherever the elements allow it: the division that finds a pack's row is a
// long subroutine in 64.
template <int V, typename Index, typename T, typename G>
__device__ __forceinline__ void map_pair_flat_in(const T* __restrict__ x, const T* __restrict__ r,
                                                 const T* __restrict__ c, T* __restrict__ y, Index elements,
                                                 Index cols, Index x_stride, Index r_stride, bool c_packed, G& g) {
  const bool dense = x_stride == cols && r_stride == cols;
  const Index first = (Index)blockIdx.x * blockDim.x + threadIdx.x, step = (Index)gridDim.x * blockDim.x;
  const Index packs = elements / V;
  for (Index i = first; i < packs; i += step) {
    const Index e = i * V, row = e / cols, j = e - row * cols;
    const Pack<T, V> px = load_pack<V>(x + (dense ? e : row * x_stride + j));
    const Pack<T, V> pr = load_pack<V>(r + (dense ? e : row * r_stride + j));
    if (c_packed) {
      store_pack<V>(y + e, map_pair_pack<V>(px, pr, c, j, g));
      continue;
    }
    float out[V];
    Index column = j;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      out[k] = g(to_float(px.v[k]), to_float(pr.v[k]), to_float(c[column]));
      column = column + 1 == cols ? 0 : column + 1;
    }
    store_pack<V>(y + e, pack_floats<T, V>(out));
  }
  for (Index e = packs * V + first; e < elements; e += step)   // dense rows' last partial pack
    y[e] = from_float<T>(g(to_float(x[e]), to_float(r[e]), to_float(c[e % cols])));
}

template <int V, typename T, typename G>
__device__ __forceinline__ void map_pair_flat(const T* __restrict__ x, const T* __restrict__ r,
                                              const T* __restrict__ c, T* __restrict__ y, int rows, int cols,
                                              int x_stride, int r_stride, G&& g) {
  const long long elements = (long long)rows * cols;
  const long long reach = (long long)(rows - 1) * (x_stride > r_stride ? x_stride : r_stride) + cols;
  // Dense rows are one row of rows * cols elements to the packs' alignment; c is its own row.
  const bool dense = x_stride == cols && r_stride == cols;
  const bool packs = dense ? rows_vectorisable<V>(V, 0, x, r, y)
                           : rows_vectorisable<V>(cols, x_stride | r_stride, x, r, y);
  const bool c_packed = packs && rows_vectorisable<V>(cols, 0, c);
  const auto walk = [&](auto index) {
    using Index = decltype(index);
    if (packs) {
      map_pair_flat_in<V, Index>(x, r, c, y, (Index)elements, (Index)cols, (Index)x_stride, (Index)r_stride,
                                 c_packed, g);
    } else {
      map_pair_flat_in<1, Index>(x, r, c, y, (Index)elements, (Index)cols, (Index)x_stride, (Index)r_stride,
                                 false, g);
    }
  };
  if (elements < (1ll << 31) && reach < (1ll << 31)) {
    walk(0u);
  } else {
    walk(0ull);
  }
}

// y = gelu(x + b) + r, gelu(z) = z (1 + erf(z / sqrt 2)) / 2
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void bias_gelu_residual(const T* __restrict__ x, const T* __restrict__ r,
                                                   const T* __restrict__ b, T* __restrict__ y, int rows, int cols,
                                                   int x_stride, int r_stride) {
  const auto gelu_residual = [](float xj, float rj, float bj) {
    const float z = xj + bj;
    return 0.5f * z * (1.0f + erff(z * 0.707106781186547524f)) + rj;
  };
  if constexpr (TOPOLOGY == FLAT) {
    map_pair_flat<VEC>(x, r, b, y, rows, cols, x_stride, r_stride, gelu_residual);
  } else {
    const bool vec = rows_vectorisable<VEC>(cols, x_stride | r_stride, x, r, b, y);
    using G = RowGroup<THREADS, TOPOLOGY>;
    static_assert(G::rows_per_thread == 1, "fused chains serve one row per thread");
    const long long row = G::row();
    if (row >= rows) return;
    map_pair<VEC>(x + row * x_stride, r + row * r_stride, b, y + row * cols, cols, G::lane(), G::lanes, vec,
                  gelu_residual);
  }
}

// y = h / sqrt(mean(h^2) + eps) * w with h = x + r: held in registers as floats when CACHE
// packs per lane hold the row (the peers' way for long rows: x and r are read once), else
// recomputed in the second sweep. Each lane meets its elements in the same order either way,
// so the bits are the same.
template <int THREADS, int TOPOLOGY, typename T, typename Held>
__device__ __forceinline__ void normalise_held(Held& h, const T* __restrict__ w, T* __restrict__ y, int cols,
                                               float eps) {
  float ss = 0.0f;
  h.each([&](int, float v) { ss += v * v; });
  ss = row_reduce<THREADS, TOPOLOGY>(ss, Sum());
  const float scale = reciprocal_sqrt(ss / cols + eps);
  h.store(w, nullptr, y, [&](int, float v, float wj, float) { return v * scale * wj; });
}

template <int THREADS, int TOPOLOGY, int VEC, int CACHE, typename T>
__device__ __forceinline__ void residual_rmsnorm_row(const T* __restrict__ xr, const T* __restrict__ rr,
                                                     const T* __restrict__ w, T* __restrict__ yr, int cols,
                                                     bool vec, float eps) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  const auto normalise = [&](auto& h) { normalise_held<THREADS, TOPOLOGY>(h, w, yr, cols, eps); };
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

// A thread's R tiny rows of exactly COLS elements (THREAD_PER_8_ROWS): every row's h = x + r
// loaded first, then each row normalised, so R rows' loads are in flight at once (one row
// per thread waits for each in turn). Each row meets its elements in order, as with a thread
// per row: the same bits.
template <int COLS, int THREADS, int TOPOLOGY, typename T>
__device__ __forceinline__ void residual_rmsnorm_tiny(const T* __restrict__ x, const T* __restrict__ r,
                                                      const T* __restrict__ w, T* __restrict__ y, int rows,
                                                      int x_stride, int r_stride, float eps) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  constexpr int R = G::rows_per_thread;
  RowCache<1, COLS, T, true, true> held[R];
#pragma unroll
  for (int u = 0; u < R; ++u)
    if (G::row(u) < rows) held[u].load_sum(x + G::row(u) * x_stride, r + G::row(u) * r_stride, COLS, 0, 1);
#pragma unroll
  for (int u = 0; u < R; ++u)
    if (G::row(u) < rows) normalise_held<THREADS, TOPOLOGY>(held[u], w, y + G::row(u) * COLS, COLS, eps);
}

// y = h / sqrt(mean(h^2) + eps) * w with h = x + r.
template <typename T, int THREADS, int VEC, int TOPOLOGY, bool FAST_EXP, int CACHE>
__device__ __forceinline__ void residual_rmsnorm(const T* __restrict__ x, const T* __restrict__ r,
                                                 const T* __restrict__ w, T* __restrict__ y, int rows, int cols,
                                                 int x_stride, int r_stride, float eps) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  if constexpr (G::rows_per_thread == 1) {
    const long long row = G::row();
    if (row >= rows) return;   // whole row groups leave together: no barrier is skipped
    const T* xr = x + row * x_stride;
    const T* rr = r + row * r_stride;
    T* yr = y + row * cols;
    const bool vec = rows_vectorisable<VEC>(cols, x_stride | r_stride, x, r, w, y);
    residual_rmsnorm_row<THREADS, TOPOLOGY, VEC, CACHE>(xr, rr, w, yr, cols, vec, eps);
  } else {
    static_assert(G::lanes == 1, "several rows per thread: one lane per row");
    static_assert(TINY_ROW == 4, "one case per tiny row length");
    switch (cols) {
      case 1: return residual_rmsnorm_tiny<1, THREADS, TOPOLOGY>(x, r, w, y, rows, x_stride, r_stride, eps);
      case 2: return residual_rmsnorm_tiny<2, THREADS, TOPOLOGY>(x, r, w, y, rows, x_stride, r_stride, eps);
      case 3: return residual_rmsnorm_tiny<3, THREADS, TOPOLOGY>(x, r, w, y, rows, x_stride, r_stride, eps);
      case 4: return residual_rmsnorm_tiny<4, THREADS, TOPOLOGY>(x, r, w, y, rows, x_stride, r_stride, eps);
    }
    const bool vec = rows_vectorisable<VEC>(cols, x_stride | r_stride, x, r, w, y);
    for (int u = 0; u < G::rows_per_thread; ++u) {
      const long long row = G::row(u);
      if (row < rows)
        residual_rmsnorm_row<THREADS, TOPOLOGY, VEC, CACHE>(x + row * x_stride, r + row * r_stride, w,
                                                            y + row * cols, cols, vec, eps);
    }
  }
}

}  // namespace aicg
