// The Hopper GEMM: C = epilogue(A B), 16-bit operands, fp32 accumulation,
// on sm_90a's tensor-core path (TMA loads, mbarrier pipeline, wgmma).
//
// Skeleton (top to bottom below):
//   tile and pipeline constants  BM x BN tiles, K in slices of BK = 64 (one
//                                128-byte swizzle row of 16-bit elements)
//   shared-memory ring           STAGES slots of (A slice, B slice), each with
//                                a `full` barrier (the copies landed) and an
//                                `empty` barrier (the consumers are done)
//   units of work                output tiles in a grouped order (RASTER,
//                                GROUP), each cut along K into SPLIT_K units
//                                (split_k.cuh: a fixed-order reduction)
//   persistent CTAs              grid = the CTAs the GPU holds at once; each
//                                walks units u, u + grid, ...
//   producer warpgroup           warpgroup 0 gives registers back, one thread
//                                issues the TMA copies slot after slot, unit
//                                after unit
//   consumer warpgroups          warpgroups 1 and 2 take the registers and
//                                issue wgmma m64nBNk16 into their accumulators:
//                                SCHEDULE_COOPERATIVE  both work on every unit,
//                                  each on BM/2 of its rows
//                                SCHEDULE_PINGPONG  they take the CTA's units
//                                  in turn, each a whole BM x BN tile; the K
//                                  loops alternate (the `turn` barriers), so
//                                  one consumer's epilogue runs while the
//                                  other's K loop keeps the tensor cores busy
//   clusters (CLUSTER_M = 2)     two CTAs on vertically adjacent tiles share
//                                the B slice: each copies half of it to both
//                                (TMA multicast)
//   clusters (CLUSTER_N = 2, 4)  CTAs on horizontally adjacent tiles share the
//                                A slice the same way: where M is small and
//                                each CTA streams a narrow band of a wide B,
//                                A's copies would otherwise outweigh B's
//   epilogue                     bias, activation, residual, rounding, and the
//                                stores: STORE_DIRECT from the accumulator
//                                fragments (epilogue.cuh), STORE_STAGED through
//                                shared memory in 16-byte vectors, the residual
//                                fetched during the K loop (staging.cuh),
//                                STORE_HANDOFF (cooperative, unsplit): the sums
//                                rounded to T into shared memory and finished
//                                by the producer warpgroup's other three warps
//                                while the consumers go on, but for the CTA's
//                                last unit, which they finish (handoff.cuh)
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
#include "matrix/handoff.cuh"
#include "matrix/hopper.cuh"
#include "matrix/split_k.cuh"
#include "matrix/staging.cuh"
#include "matrix/tiles.cuh"
#include "matrix/wgmma_ops.cuh"

namespace aicg {
namespace matrix {

enum Schedule { SCHEDULE_COOPERATIVE = 0, SCHEDULE_PINGPONG = 1 };
enum Store { STORE_DIRECT = 0, STORE_STAGED = 1, STORE_HANDOFF = 2 };

template <typename T, int BM, int BN, int STAGES, int CLUSTER_M, int A_MAJOR, int B_MAJOR,
          int SCHEDULE = SCHEDULE_COOPERATIVE, int CLUSTER_N = 1>
struct WgmmaTile {
  static constexpr int BK = 64;
  static constexpr int CONSUMERS = 2;
  static constexpr int THREADS = 128 * (1 + CONSUMERS);
  static constexpr bool PINGPONG = SCHEDULE == SCHEDULE_PINGPONG;
  static constexpr int WG_M = PINGPONG ? BM : BM / CONSUMERS;   // rows of the tile a consumer owns
  static constexpr int M_ATOMS = WG_M / 64;            // wgmma m64 row blocks per consumer
  static constexpr int ACC = BN / 2;                   // accumulators per thread per row block
  static constexpr int TILE_THREADS = PINGPONG ? 128 : 128 * CONSUMERS;   // threads holding a tile's sums
  static constexpr unsigned A_BYTES = BM * BK * 2;
  static constexpr unsigned B_BYTES = BN * BK * 2;
  static constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr unsigned RING_BYTES = STAGES * STAGE_BYTES;
  static constexpr int CLUSTER = CLUSTER_M * CLUSTER_N;       // CTAs a cluster, along M or along N
  static constexpr unsigned B_SHARE_ROWS = BN / CLUSTER_M;   // K-major B rows each CTA of a cluster copies
  static constexpr unsigned A_SHARE_ROWS = BM / CLUSTER_N;   // K-major A rows each CTA of a cluster copies
  // Arrivals that free a slot: each consumer that reads it, in every CTA its copies fill.
  static constexpr unsigned EMPTY_ARRIVALS = (PINGPONG ? 1 : CONSUMERS) * CLUSTER;
  // 384 threads with a launch bound of one block start at 168 registers each
  // (65536 / 384, rounded down to 8): the producer gives 128 of its threads'
  // down to 40, the consumers take them up to 232 (128 x 40 + 256 x 232 = 384 x 168).
  static constexpr int PRODUCER_REGISTERS = 40;
  static constexpr int CONSUMER_REGISTERS = 232;

  static_assert(sizeof(T) == 2, "wgmma with fp32 accumulation is built for 16-bit operands");
  static_assert(SCHEDULE == SCHEDULE_COOPERATIVE || SCHEDULE == SCHEDULE_PINGPONG, "a known schedule");
  static_assert(PINGPONG ? (BM == 64 || BM == 128 || BM == 256) : (BM == 128 || BM == 256),
                "consumers of whole m64 row blocks (cooperative: BM/2 rows each, pingpong: BM rows)");
  static_assert(BN == 32 || BN == 48 || BN == 64 || BN == 96 || BN == 128 || BN == 192 || BN == 256,
                "wgmma widths instantiated in wgmma_ops.cuh");
  static_assert(B_MAJOR == K_MAJOR || BN % 64 == 0, "an MN-major B slice is whole boxes of 64 columns");
  static_assert(M_ATOMS * ACC <= 128, "accumulators beyond 128 a thread leave no registers to work with");
  static_assert(STAGES >= 2, "a ring of one slot cannot overlap copies with math");
  static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(CLUSTER_N == 1 || CLUSTER_N == 2 || CLUSTER_N == 4, "clusters of 1, 2 or 4 CTAs along N");
  static_assert(CLUSTER_M == 1 || CLUSTER_N == 1, "a cluster lies along M or along N");
  static_assert(CLUSTER_N == 1 || A_MAJOR == MN_MAJOR || A_SHARE_ROWS % 8 == 0,
                "each CTA's share of a K-major A slice is whole 8-row swizzle groups");
  static_assert(CLUSTER_N == 1 || A_MAJOR == K_MAJOR || (BM / 64) % CLUSTER_N == 0,
                "each CTA copies the same number of 64-wide A boxes");
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

  // The copies of one stage (producer thread): A's BM x 64 slice and B's
  // BN x 64 slice of its own tile, where a cluster shares one of them this
  // CTA's share of it, to every CTA of the cluster. `a_row` and `b_col` are
  // the tile's first row and column.
  static __device__ __forceinline__ void load_stage(const TmaDescriptor* a_map, const TmaDescriptor* b_map, unsigned a,
                                                    unsigned full, int a_row, int b_col, int k0, int m, int n,
                                                    unsigned rank) {
    load_operand<A_MAJOR, BM, CLUSTER_N>(a, a_map, a_row, m, k0, full, rank);
    load_operand<B_MAJOR, BN, CLUSTER_M>(a + A_BYTES, b_map, b_col, n, k0, full, rank);
  }

  // One operand's ROWS x 64 slice (rows along M for A, along N for B) into `slot`: the
  // whole of it, or where SHARERS CTAs of the cluster share it, this CTA's share of it to
  // every CTA of the cluster. `first` is the tile's first row, `extent` the operand's rows.
  template <int MAJOR, int ROWS, int SHARERS>
  static __device__ __forceinline__ void load_operand(unsigned slot, const TmaDescriptor* map, int first, int extent,
                                                      int k0, unsigned full, unsigned rank) {
    constexpr unsigned everyone = (1u << CLUSTER) - 1;
    constexpr int SHARE = ROWS / SHARERS;
    if constexpr (MAJOR == K_MAJOR) {
      if constexpr (SHARERS == 1)
        tma_load_2d(slot, map, k0, box_start(first, extent, ROWS), full);
      else
        tma_load_2d_multicast(slot + rank * SHARE * SWIZZLE_ROW_BYTES, map, k0,
                              box_start(first + rank * SHARE, extent, SHARE), full, everyone);
    } else {
#pragma unroll
      for (int j = 0; j < ROWS / 64; ++j) {
        const int row = box_start(first + 64 * j, extent, 64);
        if constexpr (SHARERS == 1)
          tma_load_2d(slot + j * MN_BOX_BYTES, map, row, k0, full);
        else if (j % SHARERS == rank)
          tma_load_2d_multicast(slot + j * MN_BOX_BYTES, map, row, k0, full, everyone);
      }
    }
  }

  // A consumer is done reading slot `empty`: one arrival on that slot's
  // barrier in every CTA that the slot's copies fill.
  static __device__ __forceinline__ void release(unsigned empty) {
    const unsigned thread = threadIdx.x % 128;
    if constexpr (CLUSTER == 1) {
      if (thread == 0) barrier_arrive(empty);
    } else {
      if (thread < CLUSTER) barrier_arrive_cluster(empty, thread);
    }
  }
};

// Where a thread is in the ring: the slot of the next K slice and the parity
// of that slot's current phase. Slices are numbered in the order the
// producer fills them; slice s lives in slot s % STAGES, phase s / STAGES.
template <int STAGES>
struct RingPosition {
  int slot = 0;
  unsigned phase = 0;

  __device__ __forceinline__ void advance() {
    if (++slot == STAGES) {
      slot = 0;
      phase ^= 1;
    }
  }

  __device__ __forceinline__ void skip(int slices) {
    slot += slices;
    phase ^= (slot / STAGES) & 1;
    slot %= STAGES;
  }
};

// The launch's units: output tiles (for clusters, runs of CLUSTER_M
// vertically or CLUSTER_N horizontally adjacent tiles) in grouped order, each
// cut into `splits` consecutive K ranges of whole 64-wide slices. The host
// computes the same numbers (aicg/matrix/templates/wgmma.py: Work).
template <int BM, int BN, int CLUSTER_M, int RASTER, int GROUP, int SPLIT_K, int CLUSTER_N = 1>
struct WgmmaWork {
  int pair_rows, pair_cols, tiles_n, k_blocks, splits, per_split, total;

  __device__ __forceinline__ WgmmaWork(int m, int n, int k) {
    const int tiles_m = (m + BM - 1) / BM;
    pair_rows = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;   // a cluster takes CLUSTER_M tiles down M
    pair_cols = ((n + BN - 1) / BN + CLUSTER_N - 1) / CLUSTER_N;   // or CLUSTER_N across N
    tiles_n = pair_cols * CLUSTER_N;                     // padded to whole clusters
    k_blocks = (k + 63) / 64;
    // at most SPLIT_K parts, none empty: every split holds at least one slice
    per_split = (k_blocks + min(SPLIT_K, k_blocks) - 1) / min(SPLIT_K, k_blocks);
    splits = (k_blocks + per_split - 1) / per_split;
    total = pair_rows * pair_cols * splits;
  }

  // Unit u: the tile (already this CTA's of its cluster), its split, and
  // that split's K slices [kb0, kb1).
  __device__ __forceinline__ void unit(int u, unsigned rank, int& tm, int& tn, int& split, int& kb0, int& kb1) const {
    const int t = u / splits;
    split = u - t * splits;
    tile_of<RASTER, GROUP>(t, pair_rows, pair_cols, tm, tn);
    tm = tm * CLUSTER_M + (CLUSTER_M > 1 ? rank : 0);
    tn = tn * CLUSTER_N + (CLUSTER_N > 1 ? rank : 0);
    kb0 = split * per_split;
    kb1 = min(k_blocks, kb0 + per_split);
  }
};

template <typename T, int BM, int BN, int STAGES, int CLUSTER_M, int A_MAJOR, int B_MAJOR, int RASTER, int GROUP,
          int ACT, bool BIAS, bool RESIDUAL, int SCHEDULE = SCHEDULE_COOPERATIVE, int STORE = STORE_DIRECT,
          int SPLIT_K = 1, int CLUSTER_N = 1>
__device__ __forceinline__ void gemm_wgmma(const TmaDescriptor* a_map, const TmaDescriptor* b_map, T* c, int ldc,
                                           const T* bias, const T* residual, int ldr, int m, int n, int k,
                                           float* workspace, unsigned* tickets) {
  using Tile = WgmmaTile<T, BM, BN, STAGES, CLUSTER_M, A_MAJOR, B_MAJOR, SCHEDULE, CLUSTER_N>;
  using Work = WgmmaWork<BM, BN, CLUSTER_M, RASTER, GROUP, SPLIT_K, CLUSTER_N>;
  constexpr int CLUSTER = Tile::CLUSTER;
  // (a direct store builds no staged epilogue, but the type must exist: any width it takes will do)
  using Staged = StagedEpilogue<T, Tile::WG_M, STORE == STORE_STAGED ? BN : 64, ACT, BIAS, RESIDUAL>;
  using Handoff = HandoffEpilogue<T, Tile::WG_M, STORE == STORE_HANDOFF ? BN : 64, ACT, BIAS, RESIDUAL>;
  static_assert(STORE == STORE_DIRECT || STORE == STORE_STAGED || STORE == STORE_HANDOFF, "a known store");
  static_assert(STORE == STORE_DIRECT || BN % 64 == 0, "a staged block's rows are whole 128-byte lines");
  static_assert(STORE != STORE_HANDOFF || (!Tile::PINGPONG && SPLIT_K == 1),
                "the handed-off epilogue follows the cooperative schedule's units, unsplit");
  // The handed-off epilogue's drainers need registers the producer's copy loop does not: the
  // producer warpgroup keeps 136 and the consumers, which no longer finish their blocks, take 184
  // (128 x 136 + 256 x 184 = 384 x 168, as before; with 120 the drainers' pipeline of a GELU spilled).
  constexpr int PRODUCER_REGISTERS = STORE == STORE_HANDOFF ? 136 : Tile::PRODUCER_REGISTERS;
  constexpr int CONSUMER_REGISTERS = STORE == STORE_HANDOFF ? 184 : Tile::CONSUMER_REGISTERS;
  static_assert(SPLIT_K >= 1, "at least one part of K a tile");
  extern __shared__ __align__(128) unsigned char matrix_shared[];
  __shared__ __align__(8) unsigned long long full_barriers[STAGES], empty_barriers[STAGES];
  __shared__ __align__(8) unsigned long long turn_barriers[Tile::CONSUMERS];   // pingpong: a K loop may start
  __shared__ unsigned last_unit[Tile::CONSUMERS];                              // split-K: the unit ends its tile

  // The ring: slot s at ring + s * STAGE_BYTES, A first, then B; after it, a
  // staging buffer for each consumer (STORE_STAGED), or a handoff buffer for
  // each and their `filled` and `drained` barriers (STORE_HANDOFF). The host
  // asks for 1024 bytes more than these so the ring's start can be rounded up
  // to a swizzle atom (the descriptors' base offset is then 0).
  const unsigned ring = (shared_address(matrix_shared) + 1023u) & ~1023u;
  const unsigned handoff_area = ring + Tile::RING_BYTES;   // STORE_HANDOFF: the buffers and their barriers
  const unsigned full0 = shared_address(full_barriers), empty0 = shared_address(empty_barriers);
  const unsigned turn0 = shared_address(turn_barriers);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      barrier_init(full0 + 8 * s, 1);   // the producer's arrive_expect; the bytes do the rest
      barrier_init(empty0 + 8 * s, Tile::EMPTY_ARRIVALS);
    }
    if constexpr (Tile::PINGPONG) {
      barrier_init(turn0, 1);
      barrier_init(turn0 + 8, 1);
    }
    if constexpr (STORE == STORE_HANDOFF) Handoff::init_barriers(handoff_area);
    barrier_init_fence();
  }
  if constexpr (CLUSTER > 1)
    cluster_sync();   // a peer's copies and arrivals may target these barriers from now on
  else
    __syncthreads();

  const Work work(m, n, k);
  const int first = blockIdx.x / CLUSTER, step = gridDim.x / CLUSTER;
  const unsigned rank = CLUSTER > 1 ? cluster_rank() : 0;

  if (warpgroup == 0) {
    registers_release<PRODUCER_REGISTERS>();
    if constexpr (STORE == STORE_HANDOFF) {
      if (threadIdx.x >= 128 - Handoff::DRAINERS) {   // the drainers: every unit's blocks, consumer after consumer,
        const int drainer = threadIdx.x - (128 - Handoff::DRAINERS);   // but the last unit's (the consumers finish it)
        for (int u = first, item = 0; u + step < work.total; u += step, ++item) {
          int tm, tn, split, kb0, kb1;
          work.unit(u, rank, tm, tn, split, kb0, kb1);
#pragma unroll 1
          for (int consumer = 0; consumer < Tile::CONSUMERS; ++consumer)
            Handoff::of(consumer, handoff_area, c, ldc, bias, residual, ldr, m, n)
                .drain(drainer, item, tm * BM + consumer * Tile::WG_M, tn * BN);
        }
      }
    }
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(a_map);
      tma_prefetch_descriptor(b_map);
      RingPosition<STAGES> at;
      for (int u = first; u < work.total; u += step) {
        int tm, tn, split, kb0, kb1;
        work.unit(u, rank, tm, tn, split, kb0, kb1);
        for (int kb = kb0; kb < kb1; ++kb) {
          barrier_wait(empty0 + 8 * at.slot, at.phase ^ 1);
          barrier_arrive_expect(full0 + 8 * at.slot, Tile::STAGE_BYTES);
          Tile::load_stage(a_map, b_map, ring + at.slot * Tile::STAGE_BYTES, full0 + 8 * at.slot, tm * BM, tn * BN,
                           kb * Tile::BK, m, n, rank);
          at.advance();
        }
      }
    }
  } else {
    registers_claim<CONSUMER_REGISTERS>();
    const int consumer = warpgroup - 1, thread = threadIdx.x % 128, warp = thread / 32;
    const int atom0 = Tile::PINGPONG ? 0 : consumer * Tile::M_ATOMS;   // the consumer's first m64 block of A
    const Epilogue<T, ACT, BIAS, RESIDUAL> direct(c, ldc, bias, residual, ldr, m, n);
    const Staged staged(c, ldc, bias, residual, ldr, m, n,
                        ring + Tile::RING_BYTES + consumer * Staged::BYTES, 1 + consumer);
    float acc[Tile::M_ATOMS][Tile::ACC];
    RingPosition<STAGES> at;
    int mine = 0;   // units this consumer has taken (pingpong)
    for (int u = first, item = 0; u < work.total; u += step, ++item) {
      int tm, tn, part, kb0, kb1;
      work.unit(u, rank, tm, tn, part, kb0, kb1);
      if constexpr (Tile::PINGPONG) {
        if (item % Tile::CONSUMERS != consumer) {   // the other consumer's unit: its slices pass us by
          at.skip(kb1 - kb0);
          continue;
        }
      }
      const int row0 = tm * BM + (Tile::PINGPONG ? 0 : consumer * Tile::WG_M), col0 = tn * BN;
      // A split unit learns only after its K loop whether it finishes the tile (and needs the residual).
      const bool split = SPLIT_K > 1 && work.splits > 1;
      if constexpr (STORE == STORE_STAGED) {
        // before a pingpong consumer's turn: the copies' setup then runs while the other's K loop
        // keeps the tensor cores busy, not between the two K loops
        if (!split) staged.prefetch(row0, col0);
      }
      if constexpr (Tile::PINGPONG) {
        // Our K loop starts once the other consumer has waited for every slice
        // before ours: only then is each slot at most one phase behind the
        // slice we wait for, so a parity wait cannot be satisfied by an older
        // phase. Consumer 0 goes first.
        if (consumer == 1)
          barrier_wait(turn0 + 8, mine & 1);
        else if (mine > 0)
          barrier_wait(turn0, (mine - 1) & 1);
        ++mine;
      }

      int held = 0;   // the slot whose wgmma may still be reading it
      for (int kb = kb0; kb < kb1; ++kb) {
        barrier_wait(full0 + 8 * at.slot, at.phase);
        wgmma_fence();
        const unsigned a = ring + at.slot * Tile::STAGE_BYTES, b = a + Tile::A_BYTES;
#pragma unroll
        for (int atom = 0; atom < Tile::M_ATOMS; ++atom) {
#pragma unroll
          for (int ks = 0; ks < Tile::BK / 16; ++ks)
            Wgmma<BN, T, A_MAJOR, B_MAJOR>::mma(acc[atom], Tile::a_descriptor(a, atom0 + atom, ks),
                                                Tile::b_descriptor(b, ks), (kb > kb0 || ks > 0) ? 1 : 0);
        }
        wgmma_commit();
        if (kb > kb0) {
          wgmma_wait<1>();   // the previous slice's group is done: its slot is free
          Tile::release(empty0 + 8 * held);
        }
        held = at.slot;
        at.advance();
      }
      if constexpr (Tile::PINGPONG) {
        if (thread == 0) barrier_arrive(turn0 + 8 * (1 - consumer));   // the other consumer's turn
      }
      wgmma_wait<0>();
      Tile::release(empty0 + 8 * held);
#pragma unroll
      for (int atom = 0; atom < Tile::M_ATOMS; ++atom) touch_accumulators<Tile::ACC>(acc[atom]);

      if constexpr (SPLIT_K > 1) {
        if (split) {
          const long long tile = static_cast<long long>(tm) * work.tiles_n + tn;
          const int holder = Tile::PINGPONG ? thread : threadIdx.x - 128;
          const unsigned barrier = Tile::PINGPONG ? 1 + consumer : 3;
          if (!SplitReduction<Tile::M_ATOMS * Tile::ACC, Tile::TILE_THREADS>::reduce(
                  &acc[0][0], workspace, tickets, tile, part, work.splits, holder, barrier,
                  last_unit + (Tile::PINGPONG ? consumer : 0)))
            continue;   // another unit of this tile adds the parts
          if constexpr (STORE == STORE_STAGED) staged.prefetch(row0, col0);
        }
      }

      if constexpr (STORE == STORE_STAGED) {
        staged.finish(acc, row0, col0);
      } else if constexpr (STORE == STORE_HANDOFF) {
        const Handoff handoff = Handoff::of(consumer, handoff_area, c, ldc, bias, residual, ldr, m, n);
        if (u + step < work.total) {
          handoff.park(acc, item);
        } else {   // no K loop left to hide the epilogue behind: the consumer finishes its block itself
          handoff.finish_last(acc, item, row0, col0, 1 + consumer);
          break;   // (the loop's end, said so: the accumulators are dead while it drains)
        }
      } else {
        const int frag_row0 = row0 + warp * 16;
#pragma unroll
        for (int atom = 0; atom < Tile::M_ATOMS; ++atom) {
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
            store_fragment(direct, frag_row0 + atom * 64, col0 + 8 * j, &acc[atom][4 * j]);
        }
      }
    }
  }
  if constexpr (CLUSTER > 1) cluster_sync();   // no CTA leaves while a peer may still signal its barriers
}

}  // namespace matrix
}  // namespace aicg
