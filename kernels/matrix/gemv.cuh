// The decode GEMM: C = epilogue(A W^T) for M = 1..16 rows of A (tokens) and
// a weight W of N x K (the F.linear layout, K contiguous). Memory-bound: W's
// N K elements are read once and dominate, so the kernel is built to keep
// many 16-byte loads of W in flight and to spread them over every SM.
//
// Skeleton:
//   columns      a CTA of WARPS warps owns WARPS x TILES x 8 output columns;
//                a warp, TILES groups of 8 (8 rows of W each)
//   split-K      grid.y = splits: split s sums K range [s k_split, (s+1) k_split)
//   loads        per 32-wide K step a lane loads 16 bytes (8 elements) of one
//                W row per tile, and 16 bytes of A rows l/4 and l/4 + 8. W
//                comes in groups of UNROLL steps:
//                RING = 0  into registers, the next group requested before
//                          the math on this one (ptxas issues those loads
//                          after the math, so a warp has one group in flight)
//                RING > 0  by cp.async into a ring of RING groups in shared
//                          memory, each warp its own: RING - 1 groups stay in
//                          flight while the warp computes, whatever the
//                          scheduler does, and every lane reads back only the
//                          16-byte vectors it copied (no barrier needed)
//   math         mma.sync m16n8k16 on the loaded registers as they are: the
//                8 consecutive K of a lane's 16 bytes serve as the k-slots
//                {2q, 2q+1, 2q+8, 2q+9} (q = lane % 4) of two MMAs, and A and
//                W use the same assignment, so each MMA sums 16 distinct K
//                (a permutation of the k-order, legal: the sum is the same
//                set of products)
//   reduction    splits > 1: each CTA writes its fp32 partial sums to
//                `partials` [split][row][col], and the last CTA of a column
//                block to arrive (a ticket per block) adds the splits in
//                order 0, 1, ..., splits - 1 and applies the epilogue: the
//                same bits whichever CTA arrives last. It resets the ticket
//                for the next launch (tickets start zeroed).
//
// Needs K, lda and ldw multiples of 8 elements and 16-byte aligned A and W
// (the host checks); M <= 16.
#pragma once
#include "aicg_types.cuh"
#include "matrix/ampere.cuh"
#include "matrix/epilogue.cuh"
#include "matrix/tiles.cuh"

namespace aicg {
namespace matrix {

template <typename T, int WARPS, int TILES, int UNROLL, int ACT, bool BIAS, bool RESIDUAL, int RING = 0>
__device__ __forceinline__ void gemv_splitk(const T* a, int lda, const T* w, int ldw, T* c, int ldc, const T* bias,
                                            const T* residual, int ldr, int m, int n, int k, int k_split,
                                            float* partials, unsigned* tickets) {
  constexpr int COLUMNS = WARPS * TILES * 8;   // of a CTA
  static_assert(sizeof(T) == 2, "16-bit operands");
  static_assert(RING == 0 || RING >= 2, "a ring holds the group in use and at least one in flight");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q = lane % 4, r = lane / 4;
  const int col0 = blockIdx.x * COLUMNS + warp * TILES * 8;   // the warp's first column
  const int k_begin = blockIdx.y * k_split, k_end = min(k, k_begin + k_split);

  float acc[TILES][4];
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;

  const T* w_rows[TILES];
  bool w_ok[TILES];
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    const int col = col0 + t * 8 + r;
    w_ok[t] = col < n;
    w_rows[t] = w + static_cast<long long>(w_ok[t] ? col : 0) * ldw + 8 * q;
  }
  const bool a_lo = r < m, a_hi = r + 8 < m;
  const T* a_lo_row = a + static_cast<long long>(a_lo ? r : 0) * lda + 8 * q;
  const T* a_hi_row = a + static_cast<long long>(a_hi ? r + 8 : 0) * lda + 8 * q;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  constexpr int STEP = 32 * UNROLL;

  // W for the K range [k0, k0 + STEP): UNROLL steps of TILES 16-byte vectors a lane, none past
  // k_end (whole 8-element vectors: K and the splits are multiples of 8) or past N.
  auto load_w = [&](uint4 (&v)[UNROLL][TILES], int k0) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kk = k0 + 32 * u;
      const bool k_ok = kk + 8 * q < k_end;
#pragma unroll
      for (int t = 0; t < TILES; ++t) v[u][t] = (k_ok && w_ok[t]) ? load_streaming_16(w_rows[t] + kk) : zero;
    }
  };

  // The MMAs of one group of UNROLL steps, W from `wv`. A comes from L1 (every
  // warp of the CTA reads the same K range of it) just before its use.
  auto math = [&](const uint4 (&wv)[UNROLL][TILES], int k0) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kk = k0 + 32 * u;
      const bool k_ok = kk + 8 * q < k_end;
      const uint4 lo = (k_ok && a_lo) ? load_shared_input_16(a_lo_row + kk) : zero;
      const uint4 hi = (k_ok && a_hi) ? load_shared_input_16(a_hi_row + kk) : zero;
      // first MMA: the lane's K offsets 0-3 as k-slots (2q, 2q+1, 2q+8, 2q+9); second: offsets 4-7
      const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
      const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        const unsigned b0[2] = {wv[u][t].x, wv[u][t].y};
        const unsigned b1[2] = {wv[u][t].z, wv[u][t].w};
        Mma16816<T>::mma(acc[t], a0, b0);
        Mma16816<T>::mma(acc[t], a1, b1);
      }
    }
  };

  if constexpr (RING == 0) {
    // The next STEP of W is requested before the math on this one.
    uint4 next[UNROLL][TILES];
    load_w(next, k_begin);
    for (int k0 = k_begin; k0 < k_end; k0 += STEP) {
      uint4 wv[UNROLL][TILES];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int t = 0; t < TILES; ++t) wv[u][t] = next[u][t];
      load_w(next, k0 + STEP);
      math(wv, k0);
    }
  } else {
    // This warp's ring: slot s, step u, tile t, lane l at vector ((s UNROLL + u) TILES + t) 32 + l.
    extern __shared__ __align__(16) uint4 w_ring[];
    const unsigned ring = shared_address(w_ring + warp * RING * UNROLL * TILES * 32 + lane);
    auto vector = [&](int slot, int u, int t) { return ring + 16 * (((slot * UNROLL + u) * TILES + t) * 32); };
    // Group g (K from k_begin + g STEP) into slot g % RING; vectors past k_end or N are zero-filled
    // (0 bytes read from a valid address). One commit a group, empty or not, so that waiting for
    // all but RING - 2 groups means "group g has landed".
    auto request = [&](int g) {
      const int k0 = k_begin + g * STEP;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int kk = k0 + 32 * u;
        const bool k_ok = kk + 8 * q < k_end;
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          const bool ok = k_ok && w_ok[t];
          cp_async_16(vector(g % RING, u, t), ok ? w_rows[t] + kk : w, ok ? 16 : 0);
        }
      }
      cp_async_commit();
    };
    const int groups = (k_end - k_begin + STEP - 1) / STEP;
#pragma unroll
    for (int g = 0; g < RING - 1; ++g) request(g);
    for (int g = 0; g < groups; ++g) {
      cp_async_wait<RING - 2>();
      // into the slot this lane read in the previous group: its reads are done (their values
      // fed that group's MMAs, issued before this copy)
      request(g + RING - 1);
      uint4 wv[UNROLL][TILES];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int t = 0; t < TILES; ++t) wv[u][t] = load_shared_vector(vector(g % RING, u, t));
      math(wv, k_begin + g * STEP);
    }
    cp_async_wait<0>();   // nothing of this warp's is still landing when it exits
  }

  const Epilogue<T, ACT, BIAS, RESIDUAL> epilogue(c, ldc, bias, residual, ldr, m, n);
  if (gridDim.y == 1) {
#pragma unroll
    for (int t = 0; t < TILES; ++t) store_fragment(epilogue, 0, col0 + t * 8, acc[t]);
    return;
  }

  // Split-K: publish this split's partial sums, then let the last CTA of the block reduce.
  const long long plane = static_cast<long long>(m) * n;
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    const int col = col0 + t * 8 + 2 * q;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = r + 8 * (e / 2), cc = col + e % 2;
      if (row < m && cc < n) partials[blockIdx.y * plane + static_cast<long long>(row) * n + cc] = acc[t][e];
    }
  }
  __threadfence();
  __syncthreads();
  __shared__ unsigned last;
  if (threadIdx.x == 0) last = atomicAdd(tickets + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();   // the other splits' partials, published before their tickets, are read after ours
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    const int col = col0 + t * 8 + 2 * q;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < gridDim.y; ++s) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = r + 8 * (e / 2), cc = col + e % 2;
        if (row < m && cc < n) sum[e] += __ldcg(partials + s * plane + static_cast<long long>(row) * n + cc);
      }
    }
    store_fragment(epilogue, 0, col0 + t * 8, sum);
  }
  if (threadIdx.x == 0) tickets[blockIdx.x] = 0;
}

}  // namespace matrix
}  // namespace aicg
