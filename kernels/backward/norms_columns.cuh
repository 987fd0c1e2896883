// The norms' backward in one pass over g and x: each row group takes a chunk of consecutive rows,
// writes each row's dx as backward/norms.cuh does, and sums the weight's (and bias's) gradient down
// its own columns as it goes, in registers; at the chunk's end it writes those sums as the chunk's
// partials, which column_totals (backward/columns.cuh) adds in chunk order. Against the two-pass
// form (norms.cuh, then column_partials) g and x are read once, not twice.
//
// A lane holds both rows in registers (whole packs of V elements, or one element at a time where
// the rows are not whole aligned packs: the same columns a lane, SLOTS slots of them), so its
// columns are the same on every row of the chunk and its sums stay at fixed register indices: the
// host launches this family only on rows a lane group holds whole (cols <= lanes * V * CACHE).
//
// Orders, all fixed by the template parameters and the shape: each row's sums in norms.cuh's order
// (a lane's elements in increasing order, then the group's tree); each column's sum down a chunk
// in row order; the chunks' partials in chunk order (column_totals). The rows of chunk c are
// [c * chunk_rows, (c + 1) * chunk_rows) of the launch, and its partials are
// partials[(c * KIND + o) * cols + j]: a launch over later rows passes partials advanced to its
// first chunk.
#pragma once
#include "ieee.cuh"
#include "backward/columns.cuh"
#include "backward/rows.cuh"

namespace aicg {

// RowCache's slots (the same columns a lane, held the same way) loaded one element at a time, for
// rows that are not whole aligned packs; elements past the row's end are held as zeros and
// `valid` tells them apart.
template <int V, int SLOTS, typename T>
struct ElementRow {
  static constexpr bool PAIRED = sizeof(T) == 2 && V % 2 == 0;
  using Held = typename pick<PAIRED, Pack<unsigned, (PAIRED ? V / 2 : V)>, Pack<T, V>>::type;
  Held slot[SLOTS];
  int cols, lane, lanes;

  __device__ __forceinline__ ElementRow(const T* row, int cols_, int lane_, int lanes_) {
    load(row, cols_, lane_, lanes_);
  }
  __device__ __forceinline__ int start(int u) const { return (lane + u * lanes) * V; }
  __device__ __forceinline__ bool holds(int u) const { return start(u) < cols; }
  __device__ __forceinline__ bool valid(int u, int k) const { return start(u) + k < cols; }
  __device__ __forceinline__ float value(int u, int k) const {
    if constexpr (PAIRED) return half_of(slot[u].v[k / 2], k % 2, T{});
    else return to_float(slot[u].v[k]);
  }

  __device__ __forceinline__ void load(const T* row, int cols_, int lane_, int lanes_) {
    cols = cols_, lane = lane_, lanes = lanes_;
#pragma unroll
    for (int u = 0; u < SLOTS; ++u) {
      if (!holds(u)) continue;
      if constexpr (PAIRED) {
        const unsigned short* bits = reinterpret_cast<const unsigned short*>(row);
#pragma unroll
        for (int k = 0; k < V; k += 2) {
          const unsigned lo = valid(u, k) ? bits[start(u) + k] : 0u, hi = valid(u, k + 1) ? bits[start(u) + k + 1] : 0u;
          slot[u].v[k / 2] = lo | (hi << 16);
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) slot[u].v[k] = valid(u, k) ? row[start(u) + k] : T{};
      }
    }
  }
};

// Asks the L2 for the 16-byte pack at `p` (or its line) ahead of its load: no register waits for it.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" : : "l"(p)); }

// A held row of either kind: WHOLE rows are whole aligned packs (RowCache), the rest ElementRow.
template <bool WHOLE, int V, int SLOTS, typename T>
using HeldRow = typename pick<WHOLE, RowCache<V, SLOTS, T, false>, ElementRow<V, SLOTS, T>>::type;

template <bool WHOLE, typename Row>
__device__ __forceinline__ bool element_valid(const Row& row, int u, int k) {
  if constexpr (WHOLE) return true;
  else return row.valid(u, k);
}

// y[start(u) + k] = out[k] for the slot's elements in the row.
template <bool WHOLE, int V, typename T, typename Row>
__device__ __forceinline__ void store_slot(T* __restrict__ y, const Row& row, int u, const float (&out)[V]) {
  if constexpr (WHOLE) {
    store_pack<V>(y + row.start(u), pack_floats<T, V>(out));
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (row.valid(u, k)) y[row.start(u) + k] = from_float<T>(out[k]);
  }
}

constexpr int AHEAD = 2;   // rows requested into the L2 before a group reaches them

template <int KIND, bool WHOLE, typename T, int THREADS, int V, int TOPOLOGY, int SLOTS, typename RowFn>
__device__ __forceinline__ void chunk_rows_with_columns(const T* __restrict__ g, const T* __restrict__ x,
                                                        float* __restrict__ partials, int rows, int cols, int g_stride,
                                                        int x_stride, int chunk_rows, RowFn&& row_fn) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  constexpr int GROUPS = G::rows_per_block;   // row groups a block (a cluster of G::blocks has one)
  const long long chunk = G::blocks > 1 ? (long long)(blockIdx.x / G::blocks)
                                        : (long long)blockIdx.x * GROUPS + threadIdx.x / G::lanes;
  const long long begin = chunk * chunk_rows;
  if (begin >= rows) return;   // whole row groups leave together (a block, or a cluster, is one group)
  const long long end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  const int lane = G::lane();
  float acc[KIND][SLOTS][V];
#pragma unroll
  for (int o = 0; o < KIND; ++o)
#pragma unroll
    for (int u = 0; u < SLOTS; ++u)
#pragma unroll
      for (int k = 0; k < V; ++k) acc[o][u][k] = 0.0f;
  for (long long row = begin; row < end; ++row) {
    // A group walks its chunk row by row and each row waits on its sums: the rows AHEAD on are
    // requested into the L2 first, so that their reads overlap this row's reductions.
    if (row + AHEAD < end) {
#pragma unroll
      for (int u = 0; u < SLOTS; ++u) {
        const int at = (lane + u * G::lanes) * V;
        if (at < cols) {
          prefetch_l2(g + (row + AHEAD) * g_stride + at);
          prefetch_l2(x + (row + AHEAD) * x_stride + at);
        }
      }
    }
    const HeldRow<WHOLE, V, SLOTS, T> hg(g + row * g_stride, cols, lane, G::lanes), hx(x + row * x_stride, cols, lane,
                                                                                        G::lanes);
    row_fn(row, hg, hx, acc);
  }
  if (partials == nullptr) return;   // the weight's gradient not asked for
  float* out = partials + chunk * KIND * cols;
#pragma unroll
  for (int u = 0; u < SLOTS; ++u) {
    const int at = (lane + u * G::lanes) * V;
#pragma unroll
    for (int o = 0; o < KIND; ++o)
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (at + k < cols) out[o * cols + at + k] = acc[o][u][k];
  }
}

// rmsnorm: dx as rmsnorm_backward (norms.cuh) computes it; partials[c][0][j] = sum over the chunk's
// rows of g_ij x_ij r_i.
template <bool WHOLE, typename T, int THREADS, int V, int TOPOLOGY, int SLOTS>
__device__ __forceinline__ void rmsnorm_backward_chunks(const T* __restrict__ g, const T* __restrict__ x,
                                                        const T* __restrict__ w, T* __restrict__ dx,
                                                        float* __restrict__ partials, int rows, int cols, int g_stride,
                                                        int x_stride, float eps, int chunk_rows) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  const HeldRow<WHOLE, V, SLOTS, T> hw(w, cols, G::lane(), G::lanes);   // w held as the rows are
  chunk_rows_with_columns<1, WHOLE, T, THREADS, V, TOPOLOGY, SLOTS>(
      g, x, partials, rows, cols, g_stride, x_stride, chunk_rows,
      [&](long long row, const auto& hg, const auto& hx, float (&acc)[1][SLOTS][V]) {
        Sums2 s = AddSums2().identity();
#pragma unroll
        for (int u = 0; u < SLOTS; ++u) {
          if (!hg.holds(u)) continue;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float xj = hx.value(u, k);   // zeros past the row's end add nothing
            s.a += xj * xj;
            s.b += hg.value(u, k) * hw.value(u, k) * xj;
          }
        }
        s = row_reduce<THREADS, TOPOLOGY>(s, AddSums2());
        const float inv = reciprocal_sqrt(s.a / cols + eps);   // as the forward computes it (norms.cuh)
        const float c = inv * inv * inv * (s.b / cols);
#pragma unroll
        for (int u = 0; u < SLOTS; ++u) {
          if (!hg.holds(u)) continue;
          float out[V];
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float gj = hg.value(u, k), xj = hx.value(u, k);
            out[k] = inv * (gj * hw.value(u, k)) - xj * c;
            acc[0][u][k] += gj * xj * inv;
          }
          store_slot<WHOLE, V>(dx + row * cols, hg, u, out);
        }
      });
}

// layernorm: dx as layernorm_backward computes it; partials[c][0][j] = sum of g_ij (x_ij - mu_i) r_i,
// partials[c][1][j] = sum of g_ij.
template <bool WHOLE, typename T, int THREADS, int V, int TOPOLOGY, int SLOTS>
__device__ __forceinline__ void layernorm_backward_chunks(const T* __restrict__ g, const T* __restrict__ x,
                                                          const T* __restrict__ w, T* __restrict__ dx,
                                                          float* __restrict__ partials, int rows, int cols,
                                                          int g_stride, int x_stride, float eps, int chunk_rows) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  const HeldRow<WHOLE, V, SLOTS, T> hw(w, cols, G::lane(), G::lanes);   // w held as the rows are
  chunk_rows_with_columns<2, WHOLE, T, THREADS, V, TOPOLOGY, SLOTS>(
      g, x, partials, rows, cols, g_stride, x_stride, chunk_rows,
      [&](long long row, const auto& hg, const auto& hx, float (&acc)[2][SLOTS][V]) {
        Sums2 s = AddSums2().identity();
#pragma unroll
        for (int u = 0; u < SLOTS; ++u) {
          if (!hg.holds(u)) continue;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            s.a += hx.value(u, k);
            s.b += hg.value(u, k) * hw.value(u, k);
          }
        }
        s = row_reduce<THREADS, TOPOLOGY>(s, AddSums2());
        const float mean = s.a / cols, a = s.b / cols;
        Sums2 d = AddSums2().identity();
#pragma unroll
        for (int u = 0; u < SLOTS; ++u) {
          if (!hg.holds(u)) continue;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            if (!element_valid<WHOLE>(hg, u, k)) continue;   // past the row's end x - mu is not zero
            const float centred = hx.value(u, k) - mean;
            d.a += centred * centred;
            d.b += hg.value(u, k) * hw.value(u, k) * centred;
          }
        }
        d = row_reduce<THREADS, TOPOLOGY>(d, AddSums2());
        const float inv = reciprocal_sqrt(d.a / cols + eps);
        const float c = inv * inv * inv * (d.b / cols);
#pragma unroll
        for (int u = 0; u < SLOTS; ++u) {
          if (!hg.holds(u)) continue;
          float out[V];
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float gj = hg.value(u, k), centred = hx.value(u, k) - mean;
            out[k] = inv * (gj * hw.value(u, k) - a) - centred * c;
            acc[0][u][k] += gj * centred * inv;   // g is zero past the row's end
            acc[1][u][k] += gj;
          }
          store_slot<WHOLE, V>(dx + row * cols, hg, u, out);
        }
      });
}

// The entries' functions: the rows as whole packs where they, w and dx allow it, else element by
// element into the same slots (the same columns a lane, in the same order: the same bits).
template <bool B> struct WholeRows { static constexpr bool value = B; };

template <int V, typename T, typename Run>
__device__ __forceinline__ void whole_or_elements(int cols, int strides, const T* g, const T* x, const T* w,
                                                  const T* dx, Run&& run) {
  if (V > 1 && rows_vectorisable<V>(cols, strides, g, x, w, dx)) run(WholeRows<true>{});
  else run(WholeRows<false>{});
}

#define AICG_NORM_BACKWARD_COLUMNS(name, chunks)                                                                \
  template <typename T, int THREADS, int V, int TOPOLOGY, int CACHE>                                            \
  __device__ __forceinline__ void name(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w, \
                                       T* __restrict__ dx, float* __restrict__ partials, int rows, int cols,    \
                                       int g_stride, int x_stride, float eps, int chunk_rows) {                 \
    static_assert(CACHE > 0, "the rows are held: the column sums stay at fixed registers");                    \
    whole_or_elements<V>(cols, g_stride | x_stride, g, x, w, dx, [&](auto whole) {                            \
      chunks<decltype(whole)::value, T, THREADS, V, TOPOLOGY, CACHE>(g, x, w, dx, partials, rows, cols,       \
                                                                     g_stride, x_stride, eps, chunk_rows);    \
    });                                                                                                         \
  }

AICG_NORM_BACKWARD_COLUMNS(rmsnorm_backward_columns, rmsnorm_backward_chunks)
AICG_NORM_BACKWARD_COLUMNS(layernorm_backward_columns, layernorm_backward_chunks)
#undef AICG_NORM_BACKWARD_COLUMNS

}  // namespace aicg
