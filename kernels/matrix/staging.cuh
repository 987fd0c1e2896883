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
      if (residual_vectors && row0 + ROWS <= m && col0 + BN <= n) {
        // the block lies inside the residual: whole chunks, none tested
        const T* from = residual + row0 * ldr + col0;
#pragma unroll
        for (int i = 0; i < CHUNKS / THREADS; ++i) {
          const int chunk = thread + i * THREADS, r = chunk / ROW_CHUNKS, j = chunk % ROW_CHUNKS;
          cp_async_16(buffer + offset(r, j), from + r * ldr + 8 * j, 16);
        }
      } else if (residual_vectors) {
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
    if constexpr (RESIDUAL || BIAS) {
      cp_async_wait_all();
      sync();   // every thread's prefetched chunks visible to all
    }
    // Where every operand came by vector the whole block takes one branch-free path, whose
    // arithmetic the compiler can interleave across elements; the general path tests each element.
    if ((!RESIDUAL || residual_vectors) && (!BIAS || bias_vectors))
      finish_block<true>(acc, row0, col0);
    else
      finish_block<false>(acc, row0, col0);
    sync();   // the block is whole in the buffer
    if (c_vectors && row0 + ROWS <= m && col0 + BN <= n)
      copy_out_whole(row0, col0);
    else
      copy_out_clipped(row0, col0);
    sync();   // the buffer is free for the next prefetch
  }

  // The buffer to C where the block lies inside it: no tests, and four chunks read out before any
  // is stored.
  __device__ __forceinline__ void copy_out_whole(int row0, int col0) const {
    constexpr int BATCH = CHUNKS / THREADS < 4 ? CHUNKS / THREADS : 4;
    static_assert((CHUNKS / THREADS) % BATCH == 0, "whole batches of chunks a thread");
    const int thread = threadIdx.x % THREADS;
#pragma unroll
    for (int i0 = 0; i0 < CHUNKS / THREADS; i0 += BATCH) {
      uint4 chunks[BATCH];
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const int chunk = thread + (i0 + i) * THREADS;
        chunks[i] = load_shared_vector(buffer + offset(chunk / ROW_CHUNKS, chunk % ROW_CHUNKS));
      }
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const int chunk = thread + (i0 + i) * THREADS;
        store_global_16(c + (row0 + chunk / ROW_CHUNKS) * ldc + col0 + 8 * (chunk % ROW_CHUNKS), chunks[i]);
      }
    }
  }

  // The buffer to C clipped to M x N, in 16-byte vectors where C allows, else an element at a time.
  __device__ __forceinline__ void copy_out_clipped(int row0, int col0) const {
    const int thread = threadIdx.x % THREADS;
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
  }

  // Bias, activation, residual and rounding of the thread's fragments, written over the residual in
  // the buffer. GROUP column chunks at a time: their shared-memory words are all read before any
  // is written back (the accesses are volatile and keep their order), so the reads go out together
  // and the elements' arithmetic has no store between them. ALL_VECTORS: the residual and the bias
  // are in the buffer (where the epilogue has them), with no test an element.
  template <bool ALL_VECTORS, int ACC>
  __device__ __forceinline__ void finish_block(const float (&acc)[M_ATOMS][ACC], int row0, int col0) const {
    constexpr int GROUP = 4;
    static_assert(ROW_CHUNKS % GROUP == 0, "whole groups of chunks a row");
    const int thread = threadIdx.x % THREADS, warp = thread / 32, lane = thread % 32;
    const int q = lane % 4;
#pragma unroll
    for (int atom = 0; atom < M_ATOMS; ++atom) {
#pragma unroll
      for (int j0 = 0; j0 < ROW_CHUNKS; j0 += GROUP) {
        unsigned bias_words[GROUP], residual_words[GROUP][2];
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
          const int j = j0 + g, col = 8 * j + 2 * q;
          if constexpr (BIAS) {
            if (ALL_VECTORS || bias_vectors) bias_words[g] = load_shared_u32(buffer + BLOCK_BYTES + 2 * col);
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = 64 * atom + 16 * warp + lane / 4 + 8 * half;
            if constexpr (RESIDUAL) {
              if (ALL_VECTORS || residual_vectors) residual_words[g][half] = load_shared_u32(buffer + offset(r, j) + 4 * q);
            }
          }
        }
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
          const int j = j0 + g, col = 8 * j + 2 * q;
          float b0 = 0.0f, b1 = 0.0f;
          if constexpr (BIAS) {
            if (ALL_VECTORS || bias_vectors) {
              b0 = half_of(bias_words[g], 0, T{});
              b1 = half_of(bias_words[g], 1, T{});
            } else {
              if (col0 + col < n) b0 = to_float(bias[col0 + col]);
              if (col0 + col + 1 < n) b1 = to_float(bias[col0 + col + 1]);
            }
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = 64 * atom + 16 * warp + lane / 4 + 8 * half;
            float y0 = activate<ACT>(acc[atom][4 * j + 2 * half] + b0);
            float y1 = activate<ACT>(acc[atom][4 * j + 2 * half + 1] + b1);
            if constexpr (RESIDUAL) {
              if (ALL_VECTORS || residual_vectors) {
                y0 += half_of(residual_words[g][half], 0, T{});
                y1 += half_of(residual_words[g][half], 1, T{});
              } else if (row0 + r < m) {
                const T* from = residual + (row0 + r) * ldr + col0 + col;
                if (col0 + col < n) y0 += to_float(from[0]);
                if (col0 + col + 1 < n) y1 += to_float(from[1]);
              }
            }
            store_shared_u32(buffer + offset(r, j) + 4 * q, round_pair(y0, y1, T{}));
          }
        }
      }
    }
  }
};

}  // namespace matrix
}  // namespace aicg
