// The handed-off epilogue: the consumers round their block of sums to T and
// leave it in shared memory, and three warps of the producer warpgroup (idle
// but for the one thread that issues the copies) finish it there while the
// consumers go on with the next tile's K loop: they wait for the epilogue
// only where the drainers fall a whole tile behind (their buffer is not yet
// free). A CTA's last unit has no K loop after it to hide behind: there each
// consumer finishes its own block, 128 threads at it instead of 96 for two
// blocks, and the drainers stop a unit early.
//
//   park    a consumer, after its K loop: waits until its buffer has been
//           drained of the previous block, writes its fragments rounded to T
//           (2 results a 4-byte word), and arrives on the buffer's `filled`
//           barrier (every thread: the arrival releases its writes)
//   finish_last  a consumer, after the CTA's last K loop: parks as above, then
//           (its warpgroup's named barrier instead of `filled`) drains its
//           own block as the drainers would, with the same arithmetic
//   drain   the epilogue warps, for each unit of the CTA and each consumer in
//           turn: request the bias and the first residual words, wait on
//           `filled`, then per 16-byte chunk of 8 results: the parked sums,
//           epilogue.cuh's pair_word (float throughout, one rounding), a
//           16-byte store, the next batch's residual requested ahead; then
//           arrive on the buffer's `drained` barrier
//
// What this changes in the arithmetic: the sum is rounded to T before the
// bias, activation and residual are applied in float (as an unfused chain
// stores the product), one rounding more than the staged store; the planner
// admits it only where the profile's rules allow that (rulesets/matrix.toml:
// rounded_handoff).
//
// Buffer layout: staging.cuh's (ROWS rows of BN elements; chunk j of row r at
// chunk j ^ (r % 8)): the fragments' 4-byte writes fall in 32 banks and a
// chunk is read whole.
//
// Blocks that lie inside C with every operand aligned for vectors take the
// 16-byte path; the others go an element at a time, clipped to M x N.
#pragma once
#include "aicg_types.cuh"
#include "matrix/ampere.cuh"
#include "matrix/epilogue.cuh"
#include "matrix/hopper.cuh"
#include "matrix/staging.cuh"

namespace aicg {
namespace matrix {

template <typename T, int ROWS, int BN, int ACT, bool BIAS, bool RESIDUAL>
struct HandoffEpilogue {
  static constexpr int M_ATOMS = ROWS / 64;
  static constexpr int ROW_CHUNKS = BN / 8;
  static constexpr int CHUNKS = ROWS * ROW_CHUNKS;
  static constexpr unsigned BLOCK_BYTES = ROWS * BN * 2;
  static constexpr int DRAINERS = 96;           // warps 1..3 of the producer warpgroup
  // a consumer finishing its own block: the most of its 128 threads that keep one column chunk each
  static constexpr int SELF_DRAINERS = 128 / ROW_CHUNKS * ROW_CHUNKS;
  static constexpr int BATCH = 4;               // chunks a drainer computes together
  static_assert(sizeof(T) == 2, "16-bit outputs");
  static_assert(ROWS % 64 == 0 && ROW_CHUNKS % 8 == 0, "whole m64 row blocks, rows of whole 8-chunk lines");

  using Direct = Epilogue<T, ACT, BIAS, RESIDUAL>;
  Direct direct;          // the arithmetic, and the element-at-a-time path
  unsigned buffer;        // shared address of this consumer's buffer
  unsigned filled, drained;
  bool vectors;           // c, residual and bias all 16-byte aligned with leading dimensions of whole chunks

  __device__ __forceinline__ HandoffEpilogue(T* c, int ldc, const T* bias, const T* residual, int ldr, int m, int n,
                                             unsigned buffer_, unsigned filled_, unsigned drained_)
      : direct(c, ldc, bias, residual, ldr, m, n), buffer(buffer_), filled(filled_), drained(drained_) {
    vectors = aligned_16(c) && ldc % 8 == 0 && (!BIAS || aligned_16(bias)) &&
              (!RESIDUAL || (aligned_16(residual) && ldr % 8 == 0));
  }

  // The handoff area (after the ring): each consumer's buffer, then each one's `filled` and
  // `drained` barriers.
  static constexpr int CONSUMERS = 2;
  static constexpr unsigned AREA_BYTES = CONSUMERS * (BLOCK_BYTES + 16);

  static __device__ __forceinline__ void init_barriers(unsigned area) {
#pragma unroll
    for (int c = 0; c < CONSUMERS; ++c) {
      barrier_init(area + CONSUMERS * BLOCK_BYTES + 16 * c, 128);           // filled: every thread of the consumer
      barrier_init(area + CONSUMERS * BLOCK_BYTES + 16 * c + 8, DRAINERS);  // drained: every drainer
    }
  }

  // Consumer `consumer`'s buffer and barriers in the area at `area`.
  static __device__ __forceinline__ HandoffEpilogue of(int consumer, unsigned area, T* c, int ldc, const T* bias,
                                                       const T* residual, int ldr, int m, int n) {
    const unsigned barriers = area + CONSUMERS * BLOCK_BYTES + 16 * consumer;
    return HandoffEpilogue(c, ldc, bias, residual, ldr, m, n, area + consumer * BLOCK_BYTES, barriers, barriers + 8);
  }

  static __device__ __forceinline__ unsigned offset(int row, int chunk) {
    return row * (BN * 2) + 16 * (chunk ^ (row & 7));
  }

  // Consumer side: the block of the `item`-th unit (0, 1, ...) left to the drainers.
  template <int ACC>
  __device__ __forceinline__ void park(const float (&acc)[M_ATOMS][ACC], int item) const {
    write(acc, item);
    barrier_arrive(filled);
  }

  // Consumer side, the CTA's last unit: parked, then drained by the consumer's own threads
  // (`barrier`: its warpgroup's named barrier). No drainer waits for this block.
  template <int ACC>
  __device__ __forceinline__ void finish_last(const float (&acc)[M_ATOMS][ACC], int item, int row0, int col0,
                                              unsigned barrier) const {
    write(acc, item);
    named_barrier_sync(barrier, 128);
    const int thread = threadIdx.x % 128;
    if (thread >= SELF_DRAINERS) return;
    if (whole(row0, col0))
      drain_whole<SELF_DRAINERS, false>(thread, item, row0, col0);
    else
      drain_clipped<SELF_DRAINERS>(thread, row0, col0);
  }

  // The block into the buffer, rounded to T, once the drainers are done with its previous one. The
  // fragments are wgmma m64nBNk16's (staging.cuh): lane l of warp w holds rows 64 a + 16 w + l / 4
  // (+ 8) and columns 8 j + 2 (l % 4) (+ 1) of row block a.
  template <int ACC>
  __device__ __forceinline__ void write(const float (&acc)[M_ATOMS][ACC], int item) const {
    static_assert(ACC == BN / 2, "BN / 2 accumulators a row block");
    const int thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32, q = lane % 4;
    if (item > 0) barrier_wait(drained, (item - 1) & 1);
#pragma unroll
    for (int atom = 0; atom < M_ATOMS; ++atom) {
#pragma unroll
      for (int j = 0; j < ROW_CHUNKS; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = 64 * atom + 16 * warp + lane / 4 + 8 * half;
          store_shared_u32(buffer + offset(r, j) + 4 * q,
                           round_pair(acc[atom][4 * j + 2 * half], acc[atom][4 * j + 2 * half + 1], T{}));
        }
      }
    }
  }

  // The block at (row0, col0) lies inside C and every operand goes in 16-byte vectors.
  __device__ __forceinline__ bool whole(int row0, int col0) const {
    return vectors && row0 + ROWS <= direct.m && col0 + BN <= direct.n;
  }

  // Drainer side (`drainer` in 0..DRAINERS): the `item`-th unit's block, whose first element is
  // (row0, col0) of C, finished and stored. A block inside C with every operand in vectors goes
  // 16 bytes at a time; its bias and first residual words are requested before the wait, while the
  // consumers' K loop still runs.
  __device__ __forceinline__ void drain(int drainer, int item, int row0, int col0) const {
    if (whole(row0, col0)) {
      drain_whole<DRAINERS, true>(drainer, item, row0, col0);
    } else {
      barrier_wait(filled, item & 1);
      drain_clipped<DRAINERS>(drainer, row0, col0);
    }
    barrier_arrive(drained);
  }

  // THREADS (the drainers, or a consumer's SELF_DRAINERS) is a multiple of ROW_CHUNKS, so thread
  // d's chunks d, d + THREADS, ... are all column chunk d % ROW_CHUNKS: rows d / ROW_CHUNKS +
  // (THREADS / ROW_CHUNKS) t of it. One bias chunk serves them all.
  template <int THREADS>
  struct Rows {
    static_assert(THREADS % ROW_CHUNKS == 0, "a drainer keeps one column chunk");
    static constexpr int STEP = THREADS / ROW_CHUNKS;
    static constexpr int A_DRAINER = (ROWS + STEP - 1) / STEP;   // (the last may lie past ROWS)
    static constexpr int BATCHES = (A_DRAINER + BATCH - 1) / BATCH;
  };

  // The residual words of batch b (rows t = BATCH b .. BATCH b + BATCH - 1 of the drainer's).
  template <int THREADS>
  __device__ __forceinline__ void load_residual(uint4 (&words)[BATCH], int b, int first_row, int j, int row0,
                                                int col0) const {
    if constexpr (RESIDUAL) {
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const int r = first_row + Rows<THREADS>::STEP * (BATCH * b + i);
        if (r < ROWS)
          words[i] = *reinterpret_cast<const uint4*>(direct.residual + (row0 + r) * direct.ldr + col0 + 8 * j);
      }
    }
  }

  // Batch b of the drainer's chunks finished and stored, their residual words in `words`.
  template <int THREADS>
  __device__ __forceinline__ void finish_batch(const uint4 (&words)[BATCH], int b, int first_row, int j, int row0,
                                               int col0, const unsigned (&bias)[4]) const {
    uint4 parked[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int r = first_row + Rows<THREADS>::STEP * (BATCH * b + i);
      if (r < ROWS) parked[i] = load_shared_vector(buffer + offset(r, j));
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int r = first_row + Rows<THREADS>::STEP * (BATCH * b + i);
      if (r >= ROWS) continue;
      const unsigned p[4] = {parked[i].x, parked[i].y, parked[i].z, parked[i].w};
      const unsigned s[4] = {RESIDUAL ? words[i].x : 0u, RESIDUAL ? words[i].y : 0u, RESIDUAL ? words[i].z : 0u,
                             RESIDUAL ? words[i].w : 0u};
      unsigned out[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) out[w] = direct.pair_word(half_of(p[w], 0, T{}), half_of(p[w], 1, T{}), bias[w], s[w]);
      store_global_16(direct.c + (row0 + r) * direct.ldc + col0 + 8 * j, make_uint4(out[0], out[1], out[2], out[3]));
    }
  }

  // A software pipeline of batches in two register sets: batch b + 1's residual loads are in flight
  // while batch b is computed (in place, c == residual, a drainer reads only chunks it has not yet
  // written). WAIT: the block's `filled` barrier first (the drainers; a consumer finishing its own
  // block has synchronised its warpgroup instead).
  template <int THREADS, bool WAIT>
  __device__ __forceinline__ void drain_whole(int drainer, int item, int row0, int col0) const {
    constexpr int BATCHES = Rows<THREADS>::BATCHES;
    const int j = drainer % ROW_CHUNKS, first_row = drainer / ROW_CHUNKS;
    uint4 bias_words = make_uint4(0u, 0u, 0u, 0u), even[BATCH], odd[BATCH];
    if constexpr (BIAS) bias_words = *reinterpret_cast<const uint4*>(direct.bias + col0 + 8 * j);
    load_residual<THREADS>(even, 0, first_row, j, row0, col0);
    if constexpr (WAIT) barrier_wait(filled, item & 1);
    const unsigned bias[4] = {bias_words.x, bias_words.y, bias_words.z, bias_words.w};
#pragma unroll 1
    for (int b = 0; b < BATCHES; b += 2) {
      if (b + 1 < BATCHES) load_residual<THREADS>(odd, b + 1, first_row, j, row0, col0);
      finish_batch<THREADS>(even, b, first_row, j, row0, col0, bias);
      if (b + 1 < BATCHES) {
        if (b + 2 < BATCHES) load_residual<THREADS>(even, b + 2, first_row, j, row0, col0);
        finish_batch<THREADS>(odd, b + 1, first_row, j, row0, col0, bias);
      }
    }
  }

  // The general case: each element inside M x N, one at a time.
  template <int THREADS>
  __device__ __forceinline__ void drain_clipped(int drainer, int row0, int col0) const {
    for (int chunk = drainer; chunk < CHUNKS; chunk += THREADS) {
      const int r = chunk / ROW_CHUNKS, j = chunk % ROW_CHUNKS, row = row0 + r, col = col0 + 8 * j;
      if (row >= direct.m || col >= direct.n) continue;
      const uint4 parked = load_shared_vector(buffer + offset(r, j));
      const unsigned p[4] = {parked.x, parked.y, parked.z, parked.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (col + e >= direct.n) break;
        const float b = BIAS ? to_float(direct.bias[col + e]) : 0.0f;
        direct.c[static_cast<long long>(row) * direct.ldc + col + e] =
            from_float<T>(direct.finish(row, col + e, half_of(p[e / 2], e % 2, T{}), b));
      }
    }
  }
};

}  // namespace matrix
}  // namespace aicg
