// The sm_80+ GEMM: C = epilogue(A B), 16-bit operands, fp32 accumulation,
// with warp-level mma.sync m16n8k16 fed from a multi-stage shared-memory
// pipeline (cp.async). For GPUs without wgmma (A100, L4) and as the fallback
// where the copy engine cannot describe the operands.
//
// Skeleton:
//   tile constants     BM x BN output tile per CTA, K in slices of BK;
//                      WARPS_M x WARPS_N warps, each a (BM/WARPS_M) x
//                      (BN/WARPS_N) block of m16n8 fragments
//   shared memory      STAGES slots of (A slice, B slice), rows padded by 16
//                      bytes so the 8 rows an ldmatrix reads fall in 8
//                      different 16-byte bank groups
//   pipeline           STAGES - 1 slices in flight: at each step one
//                      barrier, the copy of slice kt + STAGES - 1 into the
//                      slot read at step kt - 1, then the math on slice kt
//   math               ldmatrix (.trans for an MN-major operand) into
//                      fragments, mma.sync over the warp's block
//   epilogue           bias, activation, residual, rounding, clipped stores
//
// ALIGNED: every leading dimension a multiple of 8 elements and 16-byte
// aligned bases, so a row's 16-byte chunks are aligned; copies are cp.async
// with the bytes past the matrix zero-filled. Without it (any strides, any
// alignment) each element is loaded on its own and stored to shared memory:
// slower, for shapes nothing else takes.
#pragma once
#include "aicg_types.cuh"
#include "matrix/ampere.cuh"
#include "matrix/epilogue.cuh"
#include "matrix/tiles.cuh"

namespace aicg {
namespace matrix {

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int A_MAJOR, int B_MAJOR>
struct MmaTile {
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;   // a warp's block
  static constexpr int FM = WM / 16, FN = WN / 8;               // its m16n8 fragments
  static constexpr int PAD = 8;                                 // elements (16 bytes) after each row
  // A slot holds A as rows of K (K-major: BM rows of BK) or rows of M
  // (MN-major: BK rows of BM), likewise B; `pitch` is a row's length.
  static constexpr int A_ROWS = A_MAJOR == K_MAJOR ? BM : BK, A_COLS = A_MAJOR == K_MAJOR ? BK : BM;
  static constexpr int B_ROWS = B_MAJOR == K_MAJOR ? BN : BK, B_COLS = B_MAJOR == K_MAJOR ? BK : BN;
  static constexpr int A_PITCH = A_COLS + PAD, B_PITCH = B_COLS + PAD;
  static constexpr int A_ELEMENTS = A_ROWS * A_PITCH, B_ELEMENTS = B_ROWS * B_PITCH;
  static constexpr int STAGE_BYTES = 2 * (A_ELEMENTS + B_ELEMENTS);

  static_assert(BM % (16 * WARPS_M) == 0 && BN % (16 * WARPS_N) == 0, "warp blocks of whole m16 and n16 pieces");
  static_assert(BK % 16 == 0 && BK >= 16, "K slices of whole k16 steps");
  static_assert(STAGES >= 2, "at least one slice in flight beside the one in use");
};

// Copies a ROWS x COLS block of a row-major matrix (rows `ld` elements apart,
// `rows` x `cols` of them real) starting at (row0, col0) into shared memory
// at `dst`, rows PITCH elements apart; elements outside the matrix become 0.
template <typename T, int ROWS, int COLS, int PITCH, int THREADS, bool ALIGNED>
__device__ __forceinline__ void copy_block(unsigned dst, const T* src, long long ld, int row0, int col0, int rows,
                                           int cols) {
  if constexpr (ALIGNED) {
    constexpr int CHUNKS = ROWS * COLS / 8;   // 16 bytes each
#pragma unroll
    for (int j = 0; j < (CHUNKS + THREADS - 1) / THREADS; ++j) {
      const int i = threadIdx.x + j * THREADS;
      if (CHUNKS % THREADS == 0 || i < CHUNKS) {
        const int r = i / (COLS / 8), cc = (i % (COLS / 8)) * 8;
        const int gr = row0 + r, gc = col0 + cc;
        const int valid = gr < rows ? max(0, min(8, cols - gc)) : 0;
        const T* from = valid > 0 ? src + gr * ld + gc : src;
        cp_async_16(dst + 2 * (r * PITCH + cc), from, 2 * valid);
      }
    }
  } else {
    constexpr int ELEMENTS = ROWS * COLS;
#pragma unroll 4
    for (int i = threadIdx.x; i < ELEMENTS; i += THREADS) {
      const int r = i / COLS, cc = i % COLS;
      const int gr = row0 + r, gc = col0 + cc;
      const unsigned short v = (gr < rows && gc < cols) ? src[gr * ld + gc].bits : 0;
      store_shared_u16(dst + 2 * (r * PITCH + cc), v);
    }
  }
}

template <typename T, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int A_MAJOR, int B_MAJOR,
          bool ALIGNED, int RASTER, int GROUP, int ACT, bool BIAS, bool RESIDUAL>
__device__ __forceinline__ void gemm_mma(const T* a, int lda, const T* b, int ldb, T* c, int ldc, const T* bias,
                                         const T* residual, int ldr, int m, int n, int k) {
  using Tile = MmaTile<BM, BN, BK, WARPS_M, WARPS_N, STAGES, A_MAJOR, B_MAJOR>;
  extern __shared__ __align__(128) unsigned char matrix_shared[];
  const unsigned ring = shared_address(matrix_shared);

  const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
  int tm, tn;
  tile_of<RASTER, GROUP>(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int k_tiles = (k + BK - 1) / BK;

  // Slice kt of A and B into slot `slot`. A K-major A is m x k with rows lda
  // apart; an MN-major one k x m. B likewise with n.
  auto load = [&](int slot, int kt) {
    const unsigned sa = ring + slot * Tile::STAGE_BYTES, sb = sa + 2 * Tile::A_ELEMENTS;
    const int k0 = kt * BK;
    if constexpr (A_MAJOR == K_MAJOR)
      copy_block<T, BM, BK, Tile::A_PITCH, Tile::THREADS, ALIGNED>(sa, a, lda, m0, k0, m, k);
    else
      copy_block<T, BK, BM, Tile::A_PITCH, Tile::THREADS, ALIGNED>(sa, a, lda, k0, m0, k, m);
    if constexpr (B_MAJOR == K_MAJOR)
      copy_block<T, BN, BK, Tile::B_PITCH, Tile::THREADS, ALIGNED>(sb, b, ldb, n0, k0, n, k);
    else
      copy_block<T, BK, BN, Tile::B_PITCH, Tile::THREADS, ALIGNED>(sb, b, ldb, k0, n0, k, n);
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm0 = (warp / WARPS_N) * Tile::WM, wn0 = (warp % WARPS_N) * Tile::WN;
  float acc[Tile::FM][Tile::FN][4];
#pragma unroll
  for (int i = 0; i < Tile::FM; ++i)
#pragma unroll
    for (int j = 0; j < Tile::FN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  // Every step commits one group (empty past the last slice), so waiting for
  // all but STAGES - 2 groups always means "slice kt has landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load(s, s);
    cp_async_commit();
  }

  const int j8 = lane / 8, r8 = lane % 8;   // which 8x8 matrix of an x4 this lane addresses, and its row
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();   // slice kt visible to all; slot (kt - 1) % STAGES read by all
    if (kt + STAGES - 1 < k_tiles) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    cp_async_commit();

    const unsigned sa = ring + (kt % STAGES) * Tile::STAGE_BYTES, sb = sa + 2 * Tile::A_ELEMENTS;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned af[Tile::FM][4], bf[Tile::FN][2];
#pragma unroll
      for (int i = 0; i < Tile::FM; ++i) {
        const int mrow = wm0 + i * 16;
        if constexpr (A_MAJOR == K_MAJOR)   // matrices: rows 0-7/8-15 x k 0-7, then k 8-15
          ldmatrix_x4<false>(af[i], sa + 2 * ((mrow + lane % 16) * Tile::A_PITCH + kk + 8 * (lane / 16)));
        else   // stored k-rows: (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15)
          ldmatrix_x4<true>(af[i], sa + 2 * ((kk + r8 + 8 * (j8 / 2)) * Tile::A_PITCH + mrow + 8 * (j8 % 2)));
      }
#pragma unroll
      for (int p = 0; p < Tile::FN / 2; ++p) {
        const int ncol = wn0 + p * 16;
        unsigned r[4];
        if constexpr (B_MAJOR == K_MAJOR)   // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
          ldmatrix_x4<false>(r, sb + 2 * ((ncol + r8 + 8 * (j8 / 2)) * Tile::B_PITCH + kk + 8 * (j8 % 2)));
        else   // stored k-rows: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
          ldmatrix_x4<true>(r, sb + 2 * ((kk + r8 + 8 * (j8 % 2)) * Tile::B_PITCH + ncol + 8 * (j8 / 2)));
        bf[2 * p][0] = r[0];
        bf[2 * p][1] = r[1];
        bf[2 * p + 1][0] = r[2];
        bf[2 * p + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < Tile::FM; ++i)
#pragma unroll
        for (int j = 0; j < Tile::FN; ++j) Mma16816<T>::mma(acc[i][j], af[i], bf[j]);
    }
  }
  cp_async_wait<0>();

  const Epilogue<T, ACT, BIAS, RESIDUAL> epilogue(c, ldc, bias, residual, ldr, m, n);
  constexpr int G = Tile::FN % 4 == 0 ? 4 : Tile::FN % 2 == 0 ? 2 : 1;   // fragments read ahead together
#pragma unroll
  for (int i = 0; i < Tile::FM; ++i)
#pragma unroll
    for (int j = 0; j < Tile::FN; j += G) store_fragments<G>(epilogue, m0 + wm0 + 16 * i, n0 + wn0 + 8 * j, acc[i][j]);
}

}  // namespace matrix
}  // namespace aicg
