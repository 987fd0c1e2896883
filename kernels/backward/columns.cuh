// The norms' weight (and bias) gradients: sums down the columns of the rows' contributions,
// dw_j = sum_i g_ij x_ij r_i (rmsnorm), dw_j = sum_i g_ij (x_ij - mu_i) r_i and db_j = sum_i g_ij
// (layernorm), with each row's statistics as the row pass wrote them (backward/norms.cuh).
// Two passes, no atomics, in an order fixed by the template parameters and the shape alone, so
// the bits are the same on every run:
//   column_partials: block (tile, chunk) sums rows [chunk * chunk_rows, +chunk_rows) for its tile
//     of columns; each of its ROW_LANES row lanes sums every ROW_LANES-th row of the chunk in
//     order, then the lanes' sums are added in lane order, into partials[chunk][o][j] (floats);
//   column_totals: block `tile` sums partials[0..chunks)[o][j] the same way and writes out_o[j].
// (backward/norms_columns.cuh writes the same partials from the rows' own pass.)
// A tile is COL_LANES lanes of V consecutive columns (packs, where the rows allow them) or of V
// columns COL_LANES apart (one element at a time); THREADS = COL_LANES * ROW_LANES.
#pragma once
#include "aicg_types.cuh"
#include "row_access.cuh"

namespace aicg {

enum ColumnKind { RMSNORM_WEIGHT = 1, LAYERNORM_WEIGHT_BIAS = 2 };

template <int OUTPUTS, int THREADS, int V, int COL_LANES>
struct ColumnTile {
  static_assert(THREADS % COL_LANES == 0, "a tile's threads are whole sets of column lanes");
  static constexpr int ROW_LANES = THREADS / COL_LANES, WIDTH = COL_LANES * V;
  int col_lane, row_lane, first;   // first: the tile's first column

  __device__ __forceinline__ explicit ColumnTile(int tile)
      : col_lane(threadIdx.x % COL_LANES), row_lane(threadIdx.x / COL_LANES), first(tile * WIDTH) {}

  // The column of this thread's element k.
  __device__ __forceinline__ int column(int k, bool vectorised) const {
    return first + (vectorised ? col_lane * V + k : k * COL_LANES + col_lane);
  }

  // The row lanes' sums added in lane order; write(o, j, total) for every column j < cols of the tile.
  template <typename Write>
  __device__ __forceinline__ void fold(const float (&acc)[OUTPUTS][V], bool vectorised, int cols, Write&& write) const {
    __shared__ float part[OUTPUTS][ROW_LANES][WIDTH];
#pragma unroll
    for (int o = 0; o < OUTPUTS; ++o)
#pragma unroll
      for (int k = 0; k < V; ++k) part[o][row_lane][column(k, vectorised) - first] = acc[o][k];
    __syncthreads();
    for (int t = threadIdx.x; t < WIDTH; t += THREADS) {
      if (first + t >= cols) break;
#pragma unroll
      for (int o = 0; o < OUTPUTS; ++o) {
        float total = part[o][0][t];
#pragma unroll
        for (int l = 1; l < ROW_LANES; ++l) total += part[o][l][t];
        write(o, first + t, total);
      }
    }
  }
};

// One row's contribution to the thread's sums for element k: (g x r) or (g (x - mu) r, g).
template <int KIND, int V>
__device__ __forceinline__ void contribute(float (&acc)[KIND][V], int k, float gj, float xj, const float (&st)[KIND]) {
  if constexpr (KIND == RMSNORM_WEIGHT) {
    acc[0][k] += gj * xj * st[0];
  } else {
    acc[0][k] += gj * (xj - st[0]) * st[1];
    acc[1][k] += gj;
  }
}

// Pass 1. stats: KIND floats a row (rmsnorm: r; layernorm: mu, r); partials: chunks x KIND x cols.
template <int KIND, typename T, int THREADS, int V, int COL_LANES>
__device__ __forceinline__ void column_partials(const T* __restrict__ g, const T* __restrict__ x,
                                                const float* __restrict__ stats, float* __restrict__ partials,
                                                int rows, int cols, int g_stride, int x_stride, int chunk_rows) {
  using Tile = ColumnTile<KIND, THREADS, V, COL_LANES>;
  constexpr int ROW_LANES = Tile::ROW_LANES;
  const Tile tile(blockIdx.x);
  const long long begin = (long long)blockIdx.y * chunk_rows;
  const long long end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  const bool vectorised = rows_vectorisable<V>(cols, g_stride | x_stride, g, x);
  float acc[KIND][V];
#pragma unroll
  for (int o = 0; o < KIND; ++o)
#pragma unroll
    for (int k = 0; k < V; ++k) acc[o][k] = 0.0f;
  const auto row_stats = [&](long long row, float (&st)[KIND]) {
#pragma unroll
    for (int s = 0; s < KIND; ++s) st[s] = stats[row * KIND + s];
  };
  long long row = begin + tile.row_lane;
  if (V > 1 && vectorised) {
    const int at = tile.column(0, true);
    if (at < cols) {
      // UNROLL rows' loads issued before the first is added (each_group's reason, row_access.cuh)
      for (; row + (UNROLL - 1) * ROW_LANES < end; row += UNROLL * ROW_LANES) {
        Pack<T, V> pg[UNROLL], px[UNROLL];
        float st[UNROLL][KIND];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const long long r = row + u * ROW_LANES;
          pg[u] = load_pack<V>(g + r * g_stride + at);
          px[u] = load_pack<V>(x + r * x_stride + at);
          row_stats(r, st[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
          for (int k = 0; k < V; ++k) contribute<KIND, V>(acc, k, to_float(pg[u].v[k]), to_float(px[u].v[k]), st[u]);
      }
      for (; row < end; row += ROW_LANES) {
        const Pack<T, V> pg = load_pack<V>(g + row * g_stride + at), px = load_pack<V>(x + row * x_stride + at);
        float st[KIND];
        row_stats(row, st);
#pragma unroll
        for (int k = 0; k < V; ++k) contribute<KIND, V>(acc, k, to_float(pg.v[k]), to_float(px.v[k]), st);
      }
    }
  } else {
    for (; row < end; row += ROW_LANES) {
      float st[KIND];
      row_stats(row, st);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int j = tile.column(k, false);
        if (j < cols) contribute<KIND, V>(acc, k, to_float(g[row * g_stride + j]), to_float(x[row * x_stride + j]), st);
      }
    }
  }
  tile.fold(acc, V > 1 && vectorised, cols, [&](int o, int j, float total) {
    partials[((long long)blockIdx.y * KIND + o) * cols + j] = total;
  });
}

// Pass 2: out_o[j] = sum over chunks of partials[chunk][o][j], rounded to T. V here counts floats.
template <int OUTPUTS, typename T, int THREADS, int V, int COL_LANES>
__device__ __forceinline__ void column_totals(const float* __restrict__ partials, T* __restrict__ out0,
                                              T* __restrict__ out1, int chunks, int cols) {
  using Tile = ColumnTile<OUTPUTS, THREADS, V, COL_LANES>;
  constexpr int ROW_LANES = Tile::ROW_LANES;
  const Tile tile(blockIdx.x);
  // every output's block of partials starts on a pack when the rows are whole packs
  const bool vectorised = rows_vectorisable<V>(cols, cols, partials);
  float acc[OUTPUTS][V];
#pragma unroll
  for (int o = 0; o < OUTPUTS; ++o)
#pragma unroll
    for (int k = 0; k < V; ++k) acc[o][k] = 0.0f;
  if (V > 1 && vectorised) {
    const int at = tile.column(0, true);
    if (at < cols) {
      for (int c = tile.row_lane; c < chunks; c += ROW_LANES) {
#pragma unroll
        for (int o = 0; o < OUTPUTS; ++o) {
          const Pack<float, V> p = load_pack<V>(partials + ((long long)c * OUTPUTS + o) * cols + at);
#pragma unroll
          for (int k = 0; k < V; ++k) acc[o][k] += p.v[k];
        }
      }
    }
  } else {
    for (int c = tile.row_lane; c < chunks; c += ROW_LANES) {
#pragma unroll
      for (int o = 0; o < OUTPUTS; ++o)
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const int j = tile.column(k, false);
          if (j < cols) acc[o][k] += partials[((long long)c * OUTPUTS + o) * cols + j];
        }
    }
  }
  tile.fold(acc, V > 1 && vectorised, cols, [&](int o, int j, float total) {
    (o == 0 ? out0 : out1)[j] = from_float<T>(total);
  });
}

}  // namespace aicg
