// The deferred epilogue: a cooperative consumer's results of one tile are
// finished while the tensor cores work on its next tile.
//
//   park         after a tile's K loop: each thread writes its accumulators,
//                as they are (fp32), to a buffer of its own in shared memory,
//                and its registers are free for the next tile at once
//   finish_some  in the next tile's K loop, after each slice's wgmma group is
//                issued: a few of the parked pairs go out (bias, activation,
//                residual, one rounding, a 4-byte store), the bias and
//                residual of the next pair requested one step ahead so that
//                their loads land while the tensor cores work
//   finish_all   what is left: before the next park, and after the last tile,
//                the loads of eight pairs in flight at a time
//
// The arithmetic and the stores are epilogue.cuh's (Epilogue::store2, the same
// order, one rounding): the bits are those of a direct store. Where a pair
// cannot move as one 4-byte access (an edge, an odd leading dimension, an
// unaligned pointer) it goes through store2 itself.
//
// Buffer layout: pair p of thread t at 8 (128 p + t) bytes from the
// warpgroup's buffer: a warp's 8-byte accesses to one p fall on consecutive
// words, no bank conflicts; a thread reads back only what it wrote, so no
// barrier is needed.
#pragma once
#include "aicg_types.cuh"
#include "matrix/epilogue.cuh"

namespace aicg {
namespace matrix {

__device__ __forceinline__ void store_shared_pair(unsigned address, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" : : "r"(address), "f"(a), "f"(b) : "memory");
}

__device__ __forceinline__ float2 load_shared_pair(unsigned address) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(address) : "memory");
  return v;
}

// One consumer warpgroup's ROWS x BN block (M_ATOMS = ROWS / 64 row blocks of
// the wgmma accumulator layout: kernels/matrix/wgmma_ops.cuh).
template <typename T, int M_ATOMS, int BN, int ACT, bool BIAS, bool RESIDUAL>
struct DeferredEpilogue {
  static constexpr int THREADS = 128;
  static constexpr int ACC = BN / 2;                  // accumulators a row block
  static constexpr int PAIRS = M_ATOMS * ACC / 2;     // pairs of adjacent columns a thread holds
  static constexpr unsigned BYTES = PAIRS * THREADS * 8;
  static constexpr int BATCH = 8;                     // pairs whose loads finish_all has in flight at once

  Epilogue<T, ACT, BIAS, RESIDUAL> direct;
  unsigned slot;             // this thread's first pair in the buffer
  int row0 = 0, col0 = 0;    // the parked tile's first row and column
  int next = PAIRS;          // the next pair to finish (PAIRS: none parked)
  int row = 0, col = 0;      // where the next pair goes
  bool fast = false;         // the next pair moves as one 4-byte access, its words requested
  unsigned bias_word = 0, residual_word = 0;

  __device__ __forceinline__ DeferredEpilogue(const Epilogue<T, ACT, BIAS, RESIDUAL>& direct_, unsigned buffer)
      : direct(direct_), slot(buffer + 8 * (threadIdx.x % THREADS)) {}

  // Where pair p goes, and whether it moves as one 4-byte access.
  __device__ __forceinline__ void place(int p, int& at_row, int& at_col, bool& at_fast) const {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % THREADS) / 32;
    const int atom = p / (ACC / 2), q = p % (ACC / 2), j = q / 2, half = q % 2;
    at_row = row0 + 64 * atom + 16 * warp + lane / 4 + 8 * half;
    at_col = col0 + 8 * j + 2 * (lane % 4);
    at_fast = direct.pairs && at_row < direct.m && at_col + 1 < direct.n;
  }

  // The bias and residual words of a pair that moves as one access (requested: used later).
  __device__ __forceinline__ void request(int at_row, int at_col, unsigned& b, unsigned& r) const {
    if constexpr (BIAS) b = *reinterpret_cast<const unsigned*>(direct.bias + at_col);
    if constexpr (RESIDUAL)
      r = *reinterpret_cast<const unsigned*>(direct.residual + static_cast<long long>(at_row) * direct.ldr + at_col);
  }

  // Pair p finished: store2's arithmetic on the words requested, or store2 itself.
  __device__ __forceinline__ void store(int p, int at_row, int at_col, bool at_fast, unsigned b, unsigned r) const {
    const float2 v = load_shared_pair(slot + p * THREADS * 8);
    if (!at_fast) {
      direct.store2(at_row, at_col, v.x, v.y);   // clips to M x N, one element at a time where it must
      return;
    }
    float b0 = 0.0f, b1 = 0.0f;
    if constexpr (BIAS) {
      b0 = half_of(b, 0, T{});
      b1 = half_of(b, 1, T{});
    }
    float y0 = activate<ACT>(v.x + b0), y1 = activate<ACT>(v.y + b1);
    if constexpr (RESIDUAL) {
      y0 += half_of(r, 0, T{});
      y1 += half_of(r, 1, T{});
    }
    *reinterpret_cast<unsigned*>(direct.c + static_cast<long long>(at_row) * direct.ldc + at_col) = round_pair(y0, y1, T{});
  }

  // The next pair located and its words requested, for the next finish_some.
  __device__ __forceinline__ void locate() {
    if (next >= PAIRS) return;
    place(next, row, col, fast);
    if (fast) request(row, col, bias_word, residual_word);
  }

  template <int ACCUMULATORS>
  __device__ __forceinline__ void park(const float (&acc)[M_ATOMS][ACCUMULATORS], int tile_row0, int tile_col0) {
    static_assert(ACCUMULATORS == ACC, "BN / 2 accumulators a row block");
#pragma unroll
    for (int atom = 0; atom < M_ATOMS; ++atom) {
#pragma unroll
      for (int q = 0; q < ACC / 2; ++q)
        store_shared_pair(slot + (atom * (ACC / 2) + q) * THREADS * 8, acc[atom][2 * q], acc[atom][2 * q + 1]);
    }
    row0 = tile_row0;
    col0 = tile_col0;
    next = 0;
    locate();
  }

  // Beside a wgmma group: `count` pairs, each with its words requested a pair ahead.
  __device__ __forceinline__ void finish_some(int count) {
    for (int i = 0; i < count && next < PAIRS; ++i) {
      store(next, row, col, fast, bias_word, residual_word);
      ++next;
      locate();
    }
  }

  // Everything left, with nothing to hide behind: the words of BATCH pairs requested together.
  __device__ __forceinline__ void finish_all() {
    if (next >= PAIRS) return;
    store(next, row, col, fast, bias_word, residual_word);   // its words were requested already
    for (int first = next + 1; first < PAIRS; first += BATCH) {
      int rows[BATCH], cols[BATCH];
      bool fasts[BATCH];
      unsigned b[BATCH] = {}, r[BATCH] = {};
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        if (first + i < PAIRS) {
          place(first + i, rows[i], cols[i], fasts[i]);
          if (fasts[i]) request(rows[i], cols[i], b[i], r[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < BATCH; ++i)
        if (first + i < PAIRS) store(first + i, rows[i], cols[i], fasts[i], b[i], r[i]);
    }
    next = PAIRS;
  }
};

}  // namespace matrix
}  // namespace aicg
