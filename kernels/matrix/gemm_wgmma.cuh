// The Hopper GEMM: C = epilogue(A B), 16-bit operands, fp32 accumulation,
// on sm_90a's tensor-core path (TMA loads, mbarrier pipeline, wgmma).
//
// Skeleton (top to bottom below):
//   tile and pipeline constants  BM x BN tiles, K in slices of BK = 64 (one
//                                128-byte swizzle row of 16-bit elements)
//   shared-memory ring           STAGES slots of (A slice, B slice), each with
//                                a `full` barrier (the copies landed) and an
//                                `empty` barrier (the consumers are done)
//   producer warpgroup           warpgroup 0 gives registers back, one thread
//                                issues the TMA copies slot after slot
//   consumer warpgroups          warpgroups 1 and 2 take the registers, each
//                                owns BM/2 rows of the tile and issues
//                                wgmma m64nBNk16 into its accumulators
//   persistent tiles             grid = the CTAs the GPU holds at once; each
//                                walks tiles t, t + grid, ... in a grouped
//                                order (RASTER, GROUP)
//   clusters (CLUSTER_M = 2)     two CTAs on vertically adjacent tiles share
//                                the B slice: each copies half of it to both
//                                (TMA multicast)
//   epilogue                     bias, activation, residual, rounding, clipped
//                                stores straight from the accumulators
//
// Layouts: A is M x K with K contiguous (A_MAJOR = K_MAJOR, row-major A) or
// M contiguous (MN_MAJOR: column-major A, stored as K x M rows); B is N x K
// with K contiguous (K_MAJOR: the F.linear weight) or K x N with N contiguous
// (MN_MAJOR: torch.matmul's b). C, bias and residual are row-major.
//
// Ragged edges: M, N, K need not be multiples of the tile. Copies reaching
// past the tensor are zero-filled by the copy engine (the K tail multiplies
// zeros by zeros), a box that would lie wholly outside is moved to the last
// box inside (its results land in rows or columns that are never stored), and
// the epilogue clips its stores to M x N. The copy engine needs every leading
// dimension to be a multiple of 16 bytes (8 elements) and 16-byte aligned
// bases: the host checks.
#pragma once
#include "aicg_types.cuh"
#include "matrix/epilogue.cuh"
#include "matrix/hopper.cuh"
#include "matrix/tiles.cuh"
#include "matrix/wgmma_ops.cuh"

namespace aicg {
namespace matrix {

template <typename T, int BM, int BN, int STAGES, int CLUSTER_M, int A_MAJOR, int B_MAJOR>
struct WgmmaTile {
  static constexpr int BK = 64;
  static constexpr int CONSUMERS = 2;
  static constexpr int THREADS = 128 * (1 + CONSUMERS);
  static constexpr int WG_M = BM / CONSUMERS;          // rows of the tile a consumer owns
  static constexpr int M_ATOMS = WG_M / 64;            // wgmma m64 row blocks per consumer
  static constexpr int ACC = BN / 2;                   // accumulators per thread per row block
  static constexpr unsigned A_BYTES = BM * BK * 2;
  static constexpr unsigned B_BYTES = BN * BK * 2;
  static constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr unsigned B_SHARE_ROWS = BN / CLUSTER_M;   // K-major B rows each CTA of a cluster copies
  // 384 threads with a launch bound of one block start at 168 registers each
  // (65536 / 384, rounded down to 8): the producer gives 128 of its threads'
  // down to 40, the consumers take them up to 232 (128 x 40 + 256 x 232 = 384 x 168).
  static constexpr int PRODUCER_REGISTERS = 40;
  static constexpr int CONSUMER_REGISTERS = 232;

  static_assert(sizeof(T) == 2, "wgmma with fp32 accumulation is built for 16-bit operands");
  static_assert(BM == 128 || BM == 256, "two consumers of 64 or 128 rows");
  static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256, "wgmma widths instantiated in wgmma_ops.cuh");
  static_assert(M_ATOMS * ACC <= 128, "accumulators beyond 128 a thread leave no registers to work with");
  static_assert(STAGES >= 2, "a ring of one slot cannot overlap copies with math");
  static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(CLUSTER_M == 1 || B_MAJOR == MN_MAJOR || B_SHARE_ROWS % 8 == 0,
                "each CTA's share of a K-major B slice is whole 8-row swizzle groups");
  static_assert(CLUSTER_M == 1 || B_MAJOR == K_MAJOR || (BN / 64) % CLUSTER_M == 0,
                "each CTA copies the same number of 64-wide B boxes");

  // Descriptor of the m64 x k16 piece `atom`, k-step `ks` of A in the stage at `a`.
  static __device__ __forceinline__ unsigned long long a_descriptor(unsigned a, int atom, int ks) {
    if constexpr (A_MAJOR == K_MAJOR)
      return matrix_descriptor(a + atom * 64 * SWIZZLE_ROW_BYTES + ks * 32, 16, SWIZZLE_ATOM_BYTES);
    else
      return matrix_descriptor(a + atom * MN_BOX_BYTES + ks * 16 * SWIZZLE_ROW_BYTES, MN_BOX_BYTES, SWIZZLE_ATOM_BYTES);
  }

  // Descriptor of the BN x k16 piece, k-step `ks`, of B in the stage at `b`.
  static __device__ __forceinline__ unsigned long long b_descriptor(unsigned b, int ks) {
    if constexpr (B_MAJOR == K_MAJOR)
      return matrix_descriptor(b + ks * 32, 16, SWIZZLE_ATOM_BYTES);
    else
      return matrix_descriptor(b + ks * 16 * SWIZZLE_ROW_BYTES, MN_BOX_BYTES, SWIZZLE_ATOM_BYTES);
  }

  // The copies of one stage (producer thread): A's BM x 64 slice of its own
  // tile, and B's BN x 64 slice (this CTA's share of it, to every CTA of the
  // cluster). `a_row` and `b_col` are the tile's first row and column.
  static __device__ __forceinline__ void load_stage(const TmaDescriptor* a_map, const TmaDescriptor* b_map, unsigned a,
                                                    unsigned full, int a_row, int b_col, int k0, int m, int n,
                                                    unsigned rank) {
    const unsigned b = a + A_BYTES;
    if constexpr (A_MAJOR == K_MAJOR) {
      tma_load_2d(a, a_map, k0, box_start(a_row, m), full);
    } else {
#pragma unroll
      for (int j = 0; j < BM / 64; ++j) tma_load_2d(a + j * MN_BOX_BYTES, a_map, box_start(a_row + 64 * j, m), k0, full);
    }
    if constexpr (B_MAJOR == K_MAJOR) {
      if constexpr (CLUSTER_M == 1) {
        tma_load_2d(b, b_map, k0, b_col, full);
      } else {
        tma_load_2d_multicast(b + rank * B_SHARE_ROWS * SWIZZLE_ROW_BYTES, b_map, k0,
                              box_start(b_col + rank * B_SHARE_ROWS, n), full, (1u << CLUSTER_M) - 1);
      }
    } else {
#pragma unroll
      for (int j = 0; j < BN / 64; ++j) {
        const int col = box_start(b_col + 64 * j, n);
        if constexpr (CLUSTER_M == 1)
          tma_load_2d(b + j * MN_BOX_BYTES, b_map, col, k0, full);
        else if (j % CLUSTER_M == rank)
          tma_load_2d_multicast(b + j * MN_BOX_BYTES, b_map, col, k0, full, (1u << CLUSTER_M) - 1);
      }
    }
  }

  // A consumer is done reading slot `empty`: one arrival per consumer
  // warpgroup on that slot's barrier in every CTA that the slot's copies fill.
  static __device__ __forceinline__ void release(unsigned empty) {
    const unsigned thread = threadIdx.x % 128;
    if constexpr (CLUSTER_M == 1) {
      if (thread == 0) barrier_arrive(empty);
    } else {
      if (thread < CLUSTER_M) barrier_arrive_cluster(empty, thread);
    }
  }
};

template <typename T, int BM, int BN, int STAGES, int CLUSTER_M, int A_MAJOR, int B_MAJOR, int RASTER, int GROUP,
          int ACT, bool BIAS, bool RESIDUAL>
__device__ __forceinline__ void gemm_wgmma(const TmaDescriptor* a_map, const TmaDescriptor* b_map, T* c, int ldc,
                                           const T* bias, const T* residual, int ldr, int m, int n, int k) {
  using Tile = WgmmaTile<T, BM, BN, STAGES, CLUSTER_M, A_MAJOR, B_MAJOR>;
  extern __shared__ __align__(128) unsigned char matrix_shared[];
  __shared__ __align__(8) unsigned long long full_barriers[STAGES], empty_barriers[STAGES];

  // The ring: slot s at ring + s * STAGE_BYTES, A first, then B. The host
  // asks for 1024 bytes more than the ring so its start can be rounded up
  // to a swizzle atom (the descriptors' base offset is then 0).
  const unsigned ring = (shared_address(matrix_shared) + 1023u) & ~1023u;
  const unsigned full0 = shared_address(full_barriers), empty0 = shared_address(empty_barriers);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      barrier_init(full0 + 8 * s, 1);   // the producer's arrive_expect; the bytes do the rest
      barrier_init(empty0 + 8 * s, Tile::CONSUMERS * CLUSTER_M);
    }
    barrier_init_fence();
  }
  if constexpr (CLUSTER_M > 1)
    cluster_sync();   // a peer's copies and arrivals may target these barriers from now on
  else
    __syncthreads();

  const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
  const int k_blocks = (k + Tile::BK - 1) / Tile::BK;
  const int pair_rows = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;   // a cluster takes CLUSTER_M tiles down M
  const int total = pair_rows * tiles_n;
  const int first = blockIdx.x / CLUSTER_M, step = gridDim.x / CLUSTER_M;
  const unsigned rank = CLUSTER_M > 1 ? cluster_rank() : 0;

  if (warpgroup == 0) {
    registers_release<Tile::PRODUCER_REGISTERS>();
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(a_map);
      tma_prefetch_descriptor(b_map);
      int slot = 0;
      unsigned phase = 0;
      for (int t = first; t < total; t += step) {
        int tm, tn;
        tile_of<RASTER, GROUP>(t, pair_rows, tiles_n, tm, tn);
        tm = tm * CLUSTER_M + rank;
        for (int kb = 0; kb < k_blocks; ++kb) {
          barrier_wait(empty0 + 8 * slot, phase ^ 1);
          barrier_arrive_expect(full0 + 8 * slot, Tile::STAGE_BYTES);
          Tile::load_stage(a_map, b_map, ring + slot * Tile::STAGE_BYTES, full0 + 8 * slot, tm * BM, tn * BN,
                           kb * Tile::BK, m, n, rank);
          if (++slot == STAGES) {
            slot = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    registers_claim<Tile::CONSUMER_REGISTERS>();
    const int consumer = warpgroup - 1, warp = (threadIdx.x % 128) / 32;
    const Epilogue<T, ACT, BIAS, RESIDUAL> epilogue(c, ldc, bias, residual, ldr, m, n);
    float acc[Tile::M_ATOMS][Tile::ACC];
    int slot = 0;
    unsigned phase = 0;
    for (int t = first; t < total; t += step) {
      int tm, tn;
      tile_of<RASTER, GROUP>(t, pair_rows, tiles_n, tm, tn);
      tm = tm * CLUSTER_M + rank;
      int held = 0;   // the slot whose wgmma may still be reading it
      for (int kb = 0; kb < k_blocks; ++kb) {
        barrier_wait(full0 + 8 * slot, phase);
        wgmma_fence();
        const unsigned a = ring + slot * Tile::STAGE_BYTES, b = a + Tile::A_BYTES;
#pragma unroll
        for (int atom = 0; atom < Tile::M_ATOMS; ++atom) {
#pragma unroll
          for (int ks = 0; ks < Tile::BK / 16; ++ks)
            Wgmma<BN, T, A_MAJOR, B_MAJOR>::mma(acc[atom], Tile::a_descriptor(a, consumer * Tile::M_ATOMS + atom, ks),
                                                Tile::b_descriptor(b, ks), (kb > 0 || ks > 0) ? 1 : 0);
        }
        wgmma_commit();
        if (kb > 0) {
          wgmma_wait<1>();   // the previous slice's group is done: its slot is free
          Tile::release(empty0 + 8 * held);
        }
        held = slot;
        if (++slot == STAGES) {
          slot = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      Tile::release(empty0 + 8 * held);
#pragma unroll
      for (int atom = 0; atom < Tile::M_ATOMS; ++atom) touch_accumulators<Tile::ACC>(acc[atom]);

      const int row0 = tm * BM + consumer * Tile::WG_M + warp * 16;
#pragma unroll
      for (int atom = 0; atom < Tile::M_ATOMS; ++atom) {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) store_fragment(epilogue, row0 + atom * 64, tn * BN + 8 * j, &acc[atom][4 * j]);
      }
    }
  }
  if constexpr (CLUSTER_M > 1) cluster_sync();   // no CTA leaves while a peer may still signal its barriers
}

}  // namespace matrix
}  // namespace aicg
