// The staged epilogue: a consumer warpgroup's block of results goes out
// through shared memory, so that global memory sees whole 16-byte vectors of
// consecutive columns instead of the accumulator fragments' 4-byte pairs.
//
//   prefetch   at the start of a tile, before its K loop: the residual rows
//              (and the bias) the block will need are requested with
//              cp.async into the staging buffer; they land while the tensor
//              cores work
//   finish     after the K loop: each thread takes its accumulator fragments,
//              adds the bias, applies the activation, adds the residual it
//              finds in the buffer at the same place, rounds once and writes
//              the result over it; then the warpgroup copies the buffer out,
//              a row's 16-byte chunks to consecutive lanes (coalesced stores)
//
// The arithmetic is epilogue.cuh's, in the same order: float throughout, one
// rounding to T. Rows past M and columns past N are never stored; residual
// chunks reaching past N are zero-filled by the copy and never stored.
//
// Buffer layout: ROWS rows of BN elements, no padding; the 16-byte chunk j of
// row r sits at chunk j ^ (r % 8) of its row. The fragments' 4-byte accesses
// (8 rows x 4 lanes a warp, one chunk column) then fall in 32 different banks,
// and 8 lanes reading 8 consecutive chunks of a row read one 128-byte line.
//
// Vectors are used where the addresses allow (16-byte aligned base, leading
// dimension a multiple of 8 elements); otherwise the same steps move one
// element at a time, so any strides and alignments are served.
#pragma once
#include "aicg_types.cuh"
#include "matrix/ampere.cuh"
#include "matrix/epilogue.cuh"
#include "matrix/tiles.cuh"

namespace aicg {
namespace matrix {

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" : : : "memory"); }

__device__ __forceinline__ unsigned load_shared_u32(unsigned address) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(address) : "memory");
  return v;
}

__device__ __forceinline__ void store_shared_u32(unsigned address, unsigned v) {
  asm volatile("st.shared.u32 [%0], %1;" : : "r"(address), "r"(v) : "memory");
}

__device__ __forceinline__ void store_global_16(void* p, const uint4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
               : : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

__device__ __forceinline__ bool aligned_16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}

// One consumer warpgroup's ROWS x BN block. The accumulators are those of
// wgmma m64nBNk16 for M_ATOMS = ROWS / 64 row blocks (wgmma_ops.cuh): for
// lane l of warp w, fragment j of row block a holds rows 64 a + 16 w + l / 4
// (+ 8) and columns 8 j + 2 (l % 4) (+ 1).
template <typename T, int ROWS, int BN, int ACT, bool BIAS, bool RESIDUAL>
struct StagedEpilogue {
  static constexpr int THREADS = 128;
  static constexpr int M_ATOMS = ROWS / 64;
  static constexpr int ROW_CHUNKS = BN / 8;            // 16-byte chunks a row
  static constexpr int CHUNKS = ROWS * ROW_CHUNKS;
  static constexpr unsigned BLOCK_BYTES = ROWS * BN * 2;
  static constexpr unsigned BYTES = BLOCK_BYTES + (BIAS ? BN * 2 : 0);   // the block, then the bias
  static_assert(sizeof(T) == 2, "16-bit outputs");
  static_assert(ROWS % 64 == 0 && ROW_CHUNKS % 8 == 0, "whole m64 row blocks, rows of whole 8-chunk lines");
  static_assert(CHUNKS % THREADS == 0, "every thread moves the same number of chunks");

  T* c;
  long long ldc;
  const T* bias;
  const T* residual;
  long long ldr;
  int m, n;
  unsigned buffer;        // shared address of this warpgroup's buffer
  unsigned barrier;       // named barrier of this warpgroup
  bool c_vectors, residual_vectors, bias_vectors;

  __device__ __forceinline__ StagedEpilogue(T* c_, int ldc_, const T* bias_, const T* residual_, int ldr_, int m_,
                                            int n_, unsigned buffer_, unsigned barrier_)
      : c(c_), ldc(ldc_), bias(bias_), residual(residual_), ldr(ldr_), m(m_), n(n_), buffer(buffer_),
        barrier(barrier_) {
    c_vectors = aligned_16(c_) && ldc_ % 8 == 0;
    residual_vectors = RESIDUAL && aligned_16(residual_) && ldr_ % 8 == 0;
    bias_vectors = BIAS && aligned_16(bias_);
  }

  static __device__ __forceinline__ unsigned offset(int row, int chunk) {
    return row * (BN * 2) + 16 * (chunk ^ (row & 7));
  }

  __device__ __forceinline__ void sync() const { named_barrier_sync(barrier, THREADS); }

  // Requests the residual rows [row0, row0 + ROWS) x columns [col0, col0 + BN)
  // and the bias columns, where vectors can carry them. Call before the K
  // loop, after the previous finish() (which leaves the buffer free).
  __device__ __forceinline__ void prefetch(int row0, int col0) const {
    const int thread = threadIdx.x % THREADS;
    if constexpr (RESIDUAL) {
      if (residual_vectors) {
#pragma unroll
        for (int i = 0; i < CHUNKS / THREADS; ++i) {
          const int chunk = thread + i * THREADS, r = chunk / ROW_CHUNKS, j = chunk % ROW_CHUNKS;
          const int row = row0 + r, col = col0 + 8 * j;
          const int valid = row < m ? max(0, min(8, n - col)) : 0;
          const T* from = valid > 0 ? residual + row * ldr + col : residual;
          cp_async_16(buffer + offset(r, j), from, 2 * valid);
        }
      }
    }
    if constexpr (BIAS) {
      if (bias_vectors && thread < ROW_CHUNKS) {
        const int col = col0 + 8 * thread;
        const int valid = max(0, min(8, n - col));
        cp_async_16(buffer + BLOCK_BYTES + 16 * thread, valid > 0 ? bias + col : bias, 2 * valid);
      }
    }
    cp_async_commit();
  }

  // The block's results from `acc` (this thread's fragments), stored to rows
  // [row0, row0 + ROWS) x columns [col0, col0 + BN) of C, clipped to M x N.
  template <int ACC>
  __device__ __forceinline__ void finish(const float (&acc)[M_ATOMS][ACC], int row0, int col0) const {
    static_assert(ACC == BN / 2, "BN / 2 accumulators a row block");
    const int thread = threadIdx.x % THREADS, warp = thread / 32, lane = thread % 32;
    const int q = lane % 4;
    if constexpr (RESIDUAL || BIAS) {
      cp_async_wait_all();
      sync();   // every thread's prefetched chunks visible to all
    }
#pragma unroll
    for (int atom = 0; atom < M_ATOMS; ++atom) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = 8 * j + 2 * q;
        float b0 = 0.0f, b1 = 0.0f;
        if constexpr (BIAS) {
          if (bias_vectors) {
            const unsigned word = load_shared_u32(buffer + BLOCK_BYTES + 2 * col);
            b0 = half_of(word, 0, T{});
            b1 = half_of(word, 1, T{});
          } else {
            if (col0 + col < n) b0 = to_float(bias[col0 + col]);
            if (col0 + col + 1 < n) b1 = to_float(bias[col0 + col + 1]);
          }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = 64 * atom + 16 * warp + lane / 4 + 8 * half;
          const unsigned at = buffer + offset(r, j) + 4 * q;
          float y0 = activate<ACT>(acc[atom][4 * j + 2 * half] + b0);
          float y1 = activate<ACT>(acc[atom][4 * j + 2 * half + 1] + b1);
          if constexpr (RESIDUAL) {
            if (residual_vectors) {
              const unsigned word = load_shared_u32(at);
              y0 += half_of(word, 0, T{});
              y1 += half_of(word, 1, T{});
            } else if (row0 + r < m) {
              const T* from = residual + (row0 + r) * ldr + col0 + col;
              if (col0 + col < n) y0 += to_float(from[0]);
              if (col0 + col + 1 < n) y1 += to_float(from[1]);
            }
          }
          store_shared_u32(at, round_pair(y0, y1, T{}));
        }
      }
    }
    sync();   // the block is whole in the buffer
#pragma unroll
    for (int i = 0; i < CHUNKS / THREADS; ++i) {
      const int chunk = thread + i * THREADS, r = chunk / ROW_CHUNKS, j = chunk % ROW_CHUNKS;
      const int row = row0 + r, col = col0 + 8 * j;
      if (row >= m || col >= n) continue;
      const uint4 v = load_shared_vector(buffer + offset(r, j));
      T* to = c + row * ldc + col;
      if (c_vectors && col + 8 <= n) {
        store_global_16(to, v);
      } else {   // one element at a time (an unaligned C, or the columns past the last whole vector)
        const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (col + e < n) to[e].bits = static_cast<unsigned short>(words[e / 2] >> (16 * (e % 2)));
      }
    }
    sync();   // the buffer is free for the next prefetch
  }
};

}  // namespace matrix
}  // namespace aicg
