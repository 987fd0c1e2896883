// The decode GEMM: C = epilogue(A W^T) for M = 1..16 rows of A (tokens) and
// a weight W of N x K (the F.linear layout, K contiguous). Memory-bound: W's
// N K elements are read once and dominate, so the kernel is built to keep
// many 16-byte loads of W in flight and to spread them over every SM.
//
// Skeleton:
//   columns      a column block of WARPS warps is WARPS x TILES x 8 output
//                columns; a warp, TILES groups of 8 (8 rows of W each)
//   spread       how the (column block, 32-wide K step) units of work go to
//                CTAs:
//                SPREAD_SPLITS  grid (blocks, splits): CTA (b, s) sums block
//                               b's K range [s k_split, (s+1) k_split)
//                SPREAD_EVEN    grid P (the CTAs one wave holds): the units,
//                               block-major, cut into P contiguous shares of
//                               equal length (+-1 step). A CTA walks its share
//                               as segments of one block each: the tail of a
//                               block, whole blocks, the head of another. So
//                               every SM streams the same bytes, where the
//                               splits leave some SMs one CTA more than others
//                               once the blocks come near the resident CTAs.
//                SPREAD_WARPS   grid (blocks): a column block of TILES x 8
//                               columns a CTA, its K cut among the CTA's warps
//                               in WARPS runs of equal steps (+-1); the runs'
//                               sums added in shared memory in K order. No
//                               workspace, no tickets: at M = 1 the weight is
//                               read by many small CTAs, each SM's warps on
//                               different rows of W.
//                SPREAD_BULK    (sm_90) grid: at most the CTAs one wave holds,
//                               each a contiguous run of column blocks of
//                               TILES x 8 columns. A producer warp streams the
//                               run's rows of W by bulk copies (cp.async.bulk,
//                               one a row piece) into a ring of RING stages of
//                               WARPS x UNROLL steps of K; the WARPS consumer
//                               warps each take UNROLL steps of every stage,
//                               and add their sums in shared memory in K order
//                               at a block's end. The bytes in flight are the
//                               ring's (RING - 1 stages), not the registers'.
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
//   reduction    a block whose K is cut into parts (splits, or the segments of
//                several CTAs; the warps spread's parts stay in its CTA): each part's fp32 sums go to `partials`, and
//                the last CTA of the block to arrive (a ticket per block) adds
//                the parts in K order and applies the epilogue: the same bits
//                whichever CTA arrives last. It resets the ticket for the next
//                launch (tickets start zeroed). A block one CTA covers whole
//                stores through the epilogue directly.
//                partials, splits: [split][row][col] (m x n planes)
//                partials, even:   [cta][slot][row][col in block] (m x block
//                                  columns): slot 0 for the CTA's first block,
//                                  1 for its last; the blocks between are whole
//
// Needs K, lda and ldw multiples of 8 elements and 16-byte aligned A and W
// (the host checks); M <= 16. The bulk spread: a CTA of WARPS + 1 warps.
#pragma once
#include "aicg_types.cuh"
#include "matrix/ampere.cuh"
#include "matrix/epilogue.cuh"
#include "matrix/mbarrier.cuh"
#include "matrix/tiles.cuh"

namespace aicg {
namespace matrix {

enum Spread { SPREAD_SPLITS = 0, SPREAD_EVEN = 1, SPREAD_WARPS = 2, SPREAD_BULK = 3 };
constexpr int GEMV_K_STEP = 32;   // K a warp covers per step (4 lanes x 8 elements): the unit of a share

// One 32-wide K step's MMAs: A's rows r and r + 8 (lo, hi) against TILES vectors of W, a lane's 8
// consecutive K as the k-slots {2q, 2q+1, 2q+8, 2q+9} of two MMAs (the skeleton's "math").
template <typename T, int TILES>
__device__ __forceinline__ void gemv_mma_step(float (&acc)[TILES][4], const uint4& lo, const uint4& hi,
                                              const uint4 (&wv)[TILES]) {
  // first MMA: the lane's K offsets 0-3 as k-slots (2q, 2q+1, 2q+8, 2q+9); second: offsets 4-7
  const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
  const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    const unsigned b0[2] = {wv[t].x, wv[t].y};
    const unsigned b1[2] = {wv[t].z, wv[t].w};
    Mma16816<T>::mma(acc[t], a0, b0);
    Mma16816<T>::mma(acc[t], a1, b1);
  }
}

// The sums of a column block's K parts, one a warp, added in warp (K) order into warp 0's `acc`:
// the same bits whichever warp finishes first. `sync` is a barrier of the WARPS warps; `runs` holds
// WARPS - 1 parts. True in warp 0, which then holds the block's sums.
template <int WARPS, int TILES, typename Sync>
__device__ __forceinline__ bool gemv_add_warp_sums(float (&acc)[TILES][4], float4 (*runs)[TILES][32], Sync sync) {
  if constexpr (WARPS == 1) return true;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp > 0) {
#pragma unroll
    for (int t = 0; t < TILES; ++t) runs[warp - 1][t][lane] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
  }
  sync();
  if (warp > 0) return false;
#pragma unroll
  for (int w = 0; w < WARPS - 1; ++w)
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      const float4 run = runs[w][t][lane];
      acc[t][0] += run.x;
      acc[t][1] += run.y;
      acc[t][2] += run.z;
      acc[t][3] += run.w;
    }
  return true;
}

// The warp's sums over K range [k_begin, k_end) (whole 8-element vectors) of the columns from
// col0, into `acc` (zeroed here): the loads-in-flight loop both spreads run for a part of a block.
template <typename T, int WARPS, int TILES, int UNROLL, int RING>
__device__ __forceinline__ void gemv_accumulate(float (&acc)[TILES][4], const T* a, int lda, const T* w, int ldw,
                                                int m, int n, int col0, int k_begin, int k_end) {
  static_assert(sizeof(T) == 2, "16-bit operands");
  static_assert(RING == 0 || RING >= 2, "a ring holds the group in use and at least one in flight");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q = lane % 4, r = lane / 4;

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
  constexpr int STEP = GEMV_K_STEP * UNROLL;

  // W for the K range [k0, k0 + STEP): UNROLL steps of TILES 16-byte vectors a lane, none past
  // k_end (whole 8-element vectors: K and the parts' bounds are multiples of 8) or past N.
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
      gemv_mma_step<T, TILES>(acc, lo, hi, wv[u]);
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
    // nothing of this warp's is still landing when it exits, or when its next part reuses the ring
    cp_async_wait<0>();
  }
}

// Part `part` of the `parts` parts (first_part, first_part + 1, ...) a column block's K is cut
// into: publish the warp's sums at part_at(part, row, col), take the block's ticket, and in the
// last CTA to arrive add the parts in order and apply the epilogue. Called by every thread of
// the CTA (it synchronises the CTA).
template <int TILES, typename E, typename PartAt>
__device__ __forceinline__ void gemv_publish_and_reduce(const float (&acc)[TILES][4], const E& epilogue, int m,
                                                        int n, int col0, PartAt part_at, int part, int first_part,
                                                        int parts, unsigned* ticket) {
  const int lane = threadIdx.x % 32, q = lane % 4, r = lane / 4;
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    const int col = col0 + t * 8 + 2 * q;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = r + 8 * (e / 2), cc = col + e % 2;
      if (row < m && cc < n) *part_at(part, row, cc) = acc[t][e];
    }
  }
  __threadfence();
  __syncthreads();
  // Every thread read the previous part's verdict before the barrier above, so thread 0 may
  // overwrite it (the even spread publishes up to two parts a CTA).
  __shared__ unsigned last;
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == parts - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();   // the other parts, published before their tickets, are read after ours
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    const int col = col0 + t * 8 + 2 * q;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int p = first_part; p < first_part + parts; ++p) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = r + 8 * (e / 2), cc = col + e % 2;
        if (row < m && cc < n) sum[e] += __ldcg(part_at(p, row, cc));
      }
    }
    store_fragment(epilogue, 0, col0 + t * 8, sum);
  }
  if (threadIdx.x == 0) *ticket = 0;
}

// The even spread's cut of `units` units (blocks x steps, block-major) into `ctas` shares: share p
// is [p units / ctas, (p + 1) units / ctas), in 32-bit arithmetic (a 64-bit division is a call
// that costs registers): units = per_cta ctas + extra, so p units / ctas = p per_cta + p extra / ctas
// with p extra < ctas^2 (the host checks units and ctas^2 fit an int). The host's mirror is
// aicg/matrix/templates/gemv.py EvenShares.
struct EvenShares {
  int units, ctas, steps, per_cta, extra;
  float ctas_per_unit;   // for owner's estimate only (a fast division: the walk makes it exact)
  __device__ __forceinline__ EvenShares(int blocks, int steps_, int ctas_)
      : units(blocks * steps_), ctas(ctas_), steps(steps_), per_cta(units / ctas_), extra(units % ctas_),
        ctas_per_unit(__fdividef(static_cast<float>(ctas_), static_cast<float>(units))) {}
  __device__ __forceinline__ int begin(int cta) const { return cta * per_cta + cta * extra / ctas; }
  // the CTA whose share holds unit u, the largest p with begin(p) <= u: a float estimate (off by
  // at most one or two for any size a launch takes), then walked to the exact CTA
  __device__ __forceinline__ int owner(int u) const {
    int p = min(ctas - 1, static_cast<int>((u + 0.5f) * ctas_per_unit));
    while (p > 0 && begin(p) > u) --p;
    while (p + 1 < ctas && begin(p + 1) <= u) ++p;
    return p;
  }
};

// The bulk spread's stage: a column block's TILES x 8 rows of W, COLUMNS of K each (WARPS warps x
// UNROLL steps), a row every PITCH elements: 32 more than a row holds, so that rows r and r + 1
// start in opposite halves of the banks and a warp's read of 8 rows x 64 bytes takes 4 wavefronts.
template <int WARPS, int TILES, int UNROLL>
struct BulkStage {
  static constexpr int COLUMNS = WARPS * UNROLL * GEMV_K_STEP;
  static constexpr int PITCH = COLUMNS + 32;
  static constexpr int ROWS = TILES * 8;
  static constexpr int BYTES = ROWS * PITCH * 2;
};

// The bulk spread (the skeleton's SPREAD_BULK): CTA c takes column blocks [c B / P, (c + 1) B / P)
// of the B blocks for P CTAs, each block's K in chunks of one stage. Warp WARPS produces, warps
// 0..WARPS-1 consume.
template <typename T, int WARPS, int TILES, int UNROLL, int RING, typename E>
__device__ __forceinline__ void gemv_bulk(const E& epilogue, const T* a, int lda, const T* w, int ldw, int m, int n,
                                          int k) {
  static_assert(RING >= 2, "a ring of at least two stages: one read while the next lands");
  using Stage = BulkStage<WARPS, TILES, UNROLL>;
  extern __shared__ __align__(128) unsigned char bulk_stages[];
  __shared__ __align__(8) unsigned long long full[RING], empty[RING];
  __shared__ float4 runs[WARPS > 1 ? WARPS - 1 : 1][TILES][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int blocks = (n + Stage::ROWS - 1) / Stage::ROWS;
  const int chunks_per_block = (k + Stage::COLUMNS - 1) / Stage::COLUMNS;
  // (blocks x CTAs fits an int: the host checks)
  const int first_block = blockIdx.x * blocks / gridDim.x;
  const int chunks = ((blockIdx.x + 1) * blocks / gridDim.x - first_block) * chunks_per_block;
  const unsigned stages = shared_address(bulk_stages), full0 = shared_address(full), empty0 = shared_address(empty);
  if (threadIdx.x == 0) {
    for (int s = 0; s < RING; ++s) {
      barrier_init(full0 + 8 * s, 1);
      barrier_init(empty0 + 8 * s, WARPS);
    }
    barrier_init_fence();
  }
  __syncthreads();

  if (warp == WARPS) {
    // lane i copies rows i, i + 32, ... of each chunk, once lane 0 has announced the chunk's bytes
    for (int i = 0; i < chunks; ++i) {
      const int s = i % RING, row0 = (first_block + i / chunks_per_block) * Stage::ROWS;
      const int k0 = i % chunks_per_block * Stage::COLUMNS;
      const int rows = min(Stage::ROWS, n - row0), columns = min(Stage::COLUMNS, k - k0);
      barrier_wait(empty0 + 8 * s, ((i / RING) & 1) ^ 1);
      if (lane == 0) barrier_arrive_expect(full0 + 8 * s, rows * columns * 2);
      __syncwarp();
      for (int r = lane; r < rows; r += 32)
        bulk_copy(stages + s * Stage::BYTES + r * Stage::PITCH * 2, w + static_cast<long long>(row0 + r) * ldw + k0,
                  columns * 2, full0 + 8 * s);
    }
    return;
  }

  const int q = lane % 4, r = lane / 4;
  const bool a_lo = r < m, a_hi = r + 8 < m;
  const T* a_lo_row = a + static_cast<long long>(a_lo ? r : 0) * lda + 8 * q;
  const T* a_hi_row = a + static_cast<long long>(a_hi ? r + 8 : 0) * lda + 8 * q;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // this lane's vector of tile 0, step 0 of this warp's part of stage 0
  const unsigned mine = stages + 2 * (r * Stage::PITCH + warp * UNROLL * GEMV_K_STEP + 8 * q);
  float acc[TILES][4];
  for (int i = 0; i < chunks; ++i) {
    const int s = i % RING, chunk = i % chunks_per_block;
    const int k_warp = chunk * Stage::COLUMNS + warp * UNROLL * GEMV_K_STEP;
    if (chunk == 0) {
#pragma unroll
      for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][e] = 0.0f;
    }
    // A's vectors (from L1: every warp of the CTA reads them) requested before the wait for W;
    // past K both operands are zero (a stage's columns past K hold stale bytes, NaN's maybe)
    uint4 lo[UNROLL], hi[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kk = k_warp + GEMV_K_STEP * u;
      const bool k_ok = kk + 8 * q < k;
      lo[u] = (k_ok && a_lo) ? load_shared_input_16(a_lo_row + kk) : zero;
      hi[u] = (k_ok && a_hi) ? load_shared_input_16(a_hi_row + kk) : zero;
    }
    barrier_wait(full0 + 8 * s, (i / RING) & 1);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const bool k_ok = k_warp + GEMV_K_STEP * u + 8 * q < k;
      uint4 wv[TILES];
#pragma unroll
      for (int t = 0; t < TILES; ++t)
        wv[t] = k_ok ? load_shared_vector(mine + s * Stage::BYTES + 2 * (t * 8 * Stage::PITCH + GEMV_K_STEP * u)) : zero;
      gemv_mma_step<T, TILES>(acc, lo[u], hi[u], wv);
    }
    // the warp's reads of the stage are done (their values are in registers): free it
    __syncwarp();
    if (lane == 0) barrier_arrive(empty0 + 8 * s);
    if (chunk == chunks_per_block - 1) {
      const int col0 = (first_block + i / chunks_per_block) * Stage::ROWS;
      // twice: the runs are written only after warp 0 has read the previous block's
      named_barrier_sync(1, 32 * WARPS);
      if (gemv_add_warp_sums<WARPS, TILES>(acc, runs, [] { named_barrier_sync(1, 32 * WARPS); })) {
#pragma unroll
        for (int t = 0; t < TILES; ++t) store_fragment(epilogue, 0, col0 + t * 8, acc[t]);
      }
    }
  }
}

template <typename T, int WARPS, int TILES, int UNROLL, int ACT, bool BIAS, bool RESIDUAL, int RING = 0,
          int SPREAD = SPREAD_SPLITS>
__device__ __forceinline__ void gemv(const T* a, int lda, const T* w, int ldw, T* c, int ldc, const T* bias,
                                     const T* residual, int ldr, int m, int n, int k, int k_split, float* partials,
                                     unsigned* tickets) {
  constexpr int COLUMNS = WARPS * TILES * 8;   // of a column block (the warps spread's: TILES x 8)
  const int warp = threadIdx.x / 32;
  const Epilogue<T, ACT, BIAS, RESIDUAL> epilogue(c, ldc, bias, residual, ldr, m, n);
  float acc[TILES][4];

  if constexpr (SPREAD == SPREAD_BULK) {
    gemv_bulk<T, WARPS, TILES, UNROLL, RING>(epilogue, a, lda, w, ldw, m, n, k);
  } else if constexpr (SPREAD == SPREAD_WARPS) {
    const int col0 = blockIdx.x * TILES * 8;
    const int steps = (k + GEMV_K_STEP - 1) / GEMV_K_STEP;
    const int k_begin = warp * steps / WARPS * GEMV_K_STEP;
    const int k_end = min(k, (warp + 1) * steps / WARPS * GEMV_K_STEP);
    gemv_accumulate<T, WARPS, TILES, UNROLL, RING>(acc, a, lda, w, ldw, m, n, col0, k_begin, k_end);
    __shared__ float4 runs[WARPS > 1 ? WARPS - 1 : 1][TILES][32];
    if (!gemv_add_warp_sums<WARPS, TILES>(acc, runs, [] { __syncthreads(); })) return;
#pragma unroll
    for (int t = 0; t < TILES; ++t) store_fragment(epilogue, 0, col0 + t * 8, acc[t]);
  } else if constexpr (SPREAD == SPREAD_SPLITS) {
    const int col0 = blockIdx.x * COLUMNS + warp * TILES * 8;   // the warp's first column
    const int k_begin = blockIdx.y * k_split, k_end = min(k, k_begin + k_split);
    gemv_accumulate<T, WARPS, TILES, UNROLL, RING>(acc, a, lda, w, ldw, m, n, col0, k_begin, k_end);
    if (gridDim.y == 1) {
#pragma unroll
      for (int t = 0; t < TILES; ++t) store_fragment(epilogue, 0, col0 + t * 8, acc[t]);
      return;
    }
    const long long plane = static_cast<long long>(m) * n;
    auto part_at = [&](int s, int row, int col) { return partials + s * plane + static_cast<long long>(row) * n + col; };
    gemv_publish_and_reduce<TILES>(acc, epilogue, m, n, col0, part_at, blockIdx.y, 0, gridDim.y,
                                   tickets + blockIdx.x);
  } else {
    static_assert(SPREAD == SPREAD_EVEN, "a spread of the Spread enum");
    // The walk's bounds and the CTAs that share the ends of this CTA's share, kept in shared memory
    // and read again after each segment (volatile: not held in registers across the K loop and the
    // epilogue, where ptxas would otherwise spill to make room for them). Only the share's first
    // and last blocks can be shared with other CTAs; those between are whole. A part's workspace
    // slot is 0 where the block is the first of its CTA's share, 1 where it is the last; only a
    // block's first CTA can have begun in an earlier block.
    enum { BEGIN, END, FIRST_BLOCK, LAST_BLOCK, FIRST_OF_FIRST, LAST_OF_LAST, SLOT_OF_FIRST, WALK };
    __shared__ int walk_state[WALK];
    const int steps = (k + GEMV_K_STEP - 1) / GEMV_K_STEP;
    const int cta = blockIdx.x;
    if (threadIdx.x == 0) {
      const EvenShares shares((n + COLUMNS - 1) / COLUMNS, steps, gridDim.x);
      const int begin = shares.begin(cta), end = shares.begin(cta + 1);
      const int first_block = begin / steps, last_block = (end - 1) / steps;
      const int first_of_first = shares.owner(first_block * steps);
      walk_state[BEGIN] = begin;
      walk_state[END] = end;
      walk_state[FIRST_BLOCK] = first_block;
      walk_state[LAST_BLOCK] = last_block;
      walk_state[FIRST_OF_FIRST] = first_of_first;
      walk_state[LAST_OF_LAST] = shares.owner((last_block + 1) * steps - 1);
      walk_state[SLOT_OF_FIRST] = shares.begin(first_of_first) < first_block * steps ? 1 : 0;
    }
    __syncthreads();
    const volatile int* state = walk_state;
    for (int b = state[FIRST_BLOCK]; b <= state[LAST_BLOCK]; ++b) {
      const int block_begin = b * steps;
      const int k_begin = b == state[FIRST_BLOCK] ? (state[BEGIN] - block_begin) * GEMV_K_STEP : 0;
      const int k_end = b == state[LAST_BLOCK] ? min(k, (state[END] - block_begin) * GEMV_K_STEP) : k;
      const int col0 = b * COLUMNS + warp * TILES * 8;
      gemv_accumulate<T, WARPS, TILES, UNROLL, RING>(acc, a, lda, w, ldw, m, n, col0, k_begin, k_end);
      const int first = b == state[FIRST_BLOCK] ? state[FIRST_OF_FIRST] : cta;
      const int last = b == state[LAST_BLOCK] ? state[LAST_OF_LAST] : cta;
      if (first == last) {
#pragma unroll
        for (int t = 0; t < TILES; ++t) store_fragment(epilogue, 0, col0 + t * 8, acc[t]);
      } else {
        const int first_slot = b == state[FIRST_BLOCK] ? state[SLOT_OF_FIRST] : 1;
        const int block_col0 = b * COLUMNS;
        auto part_at = [&](int p, int row, int col) {
          return partials + ((2LL * p + (p == first ? first_slot : 0)) * m + row) * COLUMNS + (col - block_col0);
        };
        gemv_publish_and_reduce<TILES>(acc, epilogue, m, n, col0, part_at, cta, first, last - first + 1,
                                       tickets + b);
      }
    }
  }
}

}  // namespace matrix
}  // namespace aicg
