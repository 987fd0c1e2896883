// Walking two rows of one shape together for the backward row families: the output's gradient g
// and what the forward saved (its input x or its output y), with a per-column vector w beside them
// or none. Template parameters as in softmax.cuh; the topologies are those of reduce.cuh that keep a
// row in one block (warp, block, lanes4/8/16, thread). Rows lie g_stride and a_stride elements
// apart; the gradient written is dense.
#pragma once
#include "aicg_types.cuh"
#include "reduce.cuh"
#include "row_access.cuh"

namespace aicg {

// Two row sums reduced in one tree: one set of shuffles, and one barrier for a block, for both.
struct Sums2 { float a, b; };

__device__ __forceinline__ Sums2 shfl_xor(Sums2 v, int offset, unsigned members) {
  return Sums2{shfl_xor(v.a, offset, members), shfl_xor(v.b, offset, members)};
}

struct AddSums2 {
  __device__ Sums2 identity() const { return Sums2{0.0f, 0.0f}; }
  __device__ Sums2 operator()(Sums2 x, Sums2 y) const { return Sums2{x.a + y.a, x.b + y.b}; }
};

// f(at, pg, pa, pw) for the lane's units of P elements of both rows (w's too where HAS_W), in
// increasing order; UNROLL units' loads issued before the first is used, as each_group does.
template <int P, bool HAS_W, typename T, typename F>
__device__ __forceinline__ void visit_units(const T* __restrict__ g, const T* __restrict__ a, const T* __restrict__ w,
                                            int units, int lane, int lanes, F&& f) {
  int i = lane;
  for (; i + (UNROLL - 1) * lanes < units; i += UNROLL * lanes) {
    Pack<T, P> pg[UNROLL], pa[UNROLL], pw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long at = (long long)(i + u * lanes) * P;
      pg[u] = load_pack<P>(g + at);
      pa[u] = load_pack<P>(a + at);
      if constexpr (HAS_W) pw[u] = load_column_pack<P>(w + at);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) f((long long)(i + u * lanes) * P, pg[u], pa[u], pw[u]);
  }
  for (; i < units; i += lanes) {
    const long long at = (long long)i * P;
    Pack<T, P> pw;
    if constexpr (HAS_W) pw = load_column_pack<P>(w + at);
    f(at, load_pack<P>(g + at), load_pack<P>(a + at), pw);
  }
}

// The two rows read from memory on every sweep: in packs of V where `vectorised`, one element at
// a time otherwise. each(w, f) calls f(j, g_j, a_j, w_j) for the lane's elements in order (w_j is 1
// where w is the literal nullptr); store(w, y, f) writes y_j = f(j, g_j, a_j, w_j).
template <int V, typename T>
struct Rows2Stream {
  const T* g;
  const T* a;
  int cols, lane, lanes;
  bool vectorised;

  template <typename W, typename F>
  __device__ __forceinline__ void each(W w, F&& f) const {
    constexpr bool HAS_W = is_vector<W>::value;
    const auto visit = [&](long long at, const auto& pg, const auto& pa, const auto& pw) {
      constexpr int P = sizeof(pg.v) / sizeof(T);
#pragma unroll
      for (int k = 0; k < P; ++k)
        f((int)at + k, to_float(pg.v[k]), to_float(pa.v[k]), HAS_W ? to_float(pw.v[k]) : 1.0f);
    };
    if (V > 1 && vectorised) visit_units<V, HAS_W>(g, a, vector_pointer<T>(w), cols / V, lane, lanes, visit);
    else visit_units<1, HAS_W>(g, a, vector_pointer<T>(w), cols, lane, lanes, visit);
  }

  template <typename W, typename F>
  __device__ __forceinline__ void store(W w, T* __restrict__ y, F&& f) const {
    constexpr bool HAS_W = is_vector<W>::value;
    const auto write = [&](long long at, const auto& pg, const auto& pa, const auto& pw) {
      constexpr int P = sizeof(pg.v) / sizeof(T);
      float out[P];
#pragma unroll
      for (int k = 0; k < P; ++k)
        out[k] = f((int)at + k, to_float(pg.v[k]), to_float(pa.v[k]), HAS_W ? to_float(pw.v[k]) : 1.0f);
      store_pack<P>(y + at, pack_floats<T, P>(out));
    };
    if (V > 1 && vectorised) visit_units<V, HAS_W>(g, a, vector_pointer<T>(w), cols / V, lane, lanes, write);
    else visit_units<1, HAS_W>(g, a, vector_pointer<T>(w), cols, lane, lanes, write);
  }
};

// The two rows held in registers (each as row_access.cuh's RowCache holds one), read once; the
// same elements in the same order as Rows2Stream, so the same bits.
template <int V, int CACHE, typename T>
struct Rows2Held {
  RowCache<V, CACHE, T, false> g, a;

  __device__ __forceinline__ Rows2Held(const T* g_row, const T* a_row, int cols, int lane, int lanes)
      : g(g_row, cols, lane, lanes), a(a_row, cols, lane, lanes) {}

  template <typename W, typename F>
  __device__ __forceinline__ void each(W w, F&& f) const {
    constexpr bool HAS_W = is_vector<W>::value;
#pragma unroll
    for (int u = 0; u < CACHE; ++u) {
      if (!g.holds(u)) continue;
      const int at = g.start(u);
      Pack<T, V> pw;
      if constexpr (HAS_W) pw = load_column_pack<V>(vector_pointer<T>(w) + at);
#pragma unroll
      for (int k = 0; k < V; ++k) f(at + k, g.value(u, k), a.value(u, k), HAS_W ? to_float(pw.v[k]) : 1.0f);
    }
  }

  template <typename W, typename F>
  __device__ __forceinline__ void store(W w, T* __restrict__ y, F&& f) const {
    constexpr bool HAS_W = is_vector<W>::value;
#pragma unroll
    for (int u = 0; u < CACHE; ++u) {
      if (!g.holds(u)) continue;
      const int at = g.start(u);
      Pack<T, V> pw;
      if constexpr (HAS_W) pw = load_column_pack<V>(vector_pointer<T>(w) + at);
      float out[V];
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = f(at + k, g.value(u, k), a.value(u, k), HAS_W ? to_float(pw.v[k]) : 1.0f);
      store_pack<V>(y + at, pack_floats<T, V>(out));
    }
  }
};

// body(row, r) for the row this thread's group serves, r holding both rows in registers where
// CACHE slots a lane hold them (whole packs), streaming them otherwise. Returns the group's lane.
template <int THREADS, int TOPOLOGY, int V, int CACHE, typename T, typename Body>
__device__ __forceinline__ void each_row2(const T* g, int g_stride, const T* a, int a_stride, int rows, int cols,
                                          bool vectorised, Body&& body) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  static_assert(G::rows_per_thread == 1 && G::blocks == 1 && TOPOLOGY != STAGED_BLOCK_PER_ROW &&
                    TOPOLOGY != PREFETCH_BLOCK_PER_ROW,
                "the backward rows take one row per lane group, in one block, read from global memory");
  const long long row = G::row();
  if (row >= rows) return;   // whole row groups leave together: no barrier is skipped
  const T* g_row = g + row * g_stride;
  const T* a_row = a + row * a_stride;
  if constexpr (CACHE > 0) {
    if ((V == 1 || vectorised) && cols <= G::lanes * V * CACHE) {
      const Rows2Held<V, CACHE, T> held(g_row, a_row, cols, G::lane(), G::lanes);
      body(row, held);
      return;
    }
  }
  const Rows2Stream<V, T> streamed{g_row, a_row, cols, G::lane(), G::lanes, vectorised};
  body(row, streamed);
}

}  // namespace aicg
