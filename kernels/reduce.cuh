// Fixed-order reductions over the threads that own one row: a warp-shuffle
// butterfly, then (block topology) one partial per warp through shared memory,
// then (cluster topologies) one partial per block of the cluster through
// distributed shared memory. The order depends only on THREADS, TOPOLOGY and
// cols, so results are bitwise reproducible from run to run.
#pragma once
#include "aicg_types.cuh"
#include "phases.cuh"

namespace aicg {

// WARP_PER_ROW, BLOCK_PER_ROW and LANES_n_PER_ROW (n consecutive lanes of a
// warp: short rows) reduce a row in a tree over their lanes; THREAD_PER_ROW
// walks it in one thread, in order: the reference order. CLUSTER_n_PER_ROW
// splits a row over the n blocks of a thread-block cluster (sm_90), so that a
// long row is several blocks' work: more rows' phases overlap on each SM, and
// a launch of few rows reaches more SMs. THREAD_PER_8_ROWS is THREAD_PER_ROW
// with each thread serving eight rows at once (tiny rows: a thread per row of
// one element has one load in flight; eight rows' loads go out together).
// STAGED_BLOCK_PER_ROW is BLOCK_PER_ROW with the row first copied into shared
// memory (row_access.cuh): the same lanes meet the same elements, so the same bits.
// PREFETCH_BLOCK_PER_ROW is BLOCK_PER_ROW holding its row, with a grid of resident blocks each
// serving every gridDim.x-th row and copying its next row into shared memory meanwhile
// (row_access.cuh): the same bits again. Its first row is row(); the rest, row() + k * gridDim.x.
// FLAT is for maps alone (fused.cuh): no rows at all, the matrix one range of elements over
// the whole grid, so that a single row or rows of one element still use every SM.
enum Topology {
  WARP_PER_ROW = 0, BLOCK_PER_ROW = 1, THREAD_PER_ROW = 2, STAGED_BLOCK_PER_ROW = 3,
  PREFETCH_BLOCK_PER_ROW = 5, LANES_4_PER_ROW = 4, LANES_8_PER_ROW = 8, LANES_16_PER_ROW = 16,
  CLUSTER_2_PER_ROW = 102, CLUSTER_4_PER_ROW = 104, CLUSTER_8_PER_ROW = 108,
  THREAD_PER_8_ROWS = 208,
  FLAT = 300
};

struct Sum {
  __device__ float identity() const { return 0.0f; }
  __device__ float operator()(float a, float b) const { return a + b; }
};

struct Max {
  __device__ float identity() const { return -__int_as_float(0x7f800000); }
  // fmaxf drops NaN; a NaN anywhere in the row must reach the output (as the canonical NaN,
  // whatever its payload). Of two zeros +0 wins, whichever side it is on. So every order gives
  // the same bits. One instruction (sm_80+), checked against that rule on the device
  // (tests/test_gpu_arithmetic.py); the comparisons it replaces, short-circuited, ran row max
  // bfloat16 at 75.5 us (4096x32768) and 82.5 us (32768x4096) on the H200, this at 72.9 and 71.4.
  __device__ float operator()(float a, float b) const {
    float m;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
    return m;
  }
};

// `members`: the lanes of this thread's row group; a group of a warp whose
// row lies past the end has left, so shuffles name only their own group.
// A maximum used only to shift exponents: one instruction, and neither of
// Max's rules changes a softmax. A NaN it drops still reaches every output
// through its own exp and the sum; +0 and -0 shift every exp alike.
struct ShiftMax {
  __device__ float identity() const { return -__int_as_float(0x7f800000); }
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__device__ __forceinline__ float shfl_xor(float v, int offset, unsigned members) {
  return __shfl_xor_sync(members, v, offset);
}

// Row-group geometry for a launch: which row this thread serves and its lane.
// A cluster's blocks are consecutive in a one-dimensional grid, so block
// blockIdx.x serves row blockIdx.x / blocks as the cluster's rank
// blockIdx.x % blocks.
template <int THREADS, int TOPOLOGY>
struct RowGroup {
  static_assert(TOPOLOGY != FLAT, "flat is a map's walk (fused.cuh): it has no rows to split");
  static constexpr int blocks = TOPOLOGY == CLUSTER_2_PER_ROW   ? 2
                                : TOPOLOGY == CLUSTER_4_PER_ROW ? 4
                                : TOPOLOGY == CLUSTER_8_PER_ROW ? 8
                                                                : 1;
  static constexpr int lanes = TOPOLOGY == WARP_PER_ROW      ? 32
                               : TOPOLOGY == BLOCK_PER_ROW     ? THREADS
                               : TOPOLOGY == STAGED_BLOCK_PER_ROW ? THREADS
                               : TOPOLOGY == PREFETCH_BLOCK_PER_ROW ? THREADS
                               : TOPOLOGY == THREAD_PER_ROW    ? 1
                               : TOPOLOGY == THREAD_PER_8_ROWS ? 1
                               : blocks > 1                    ? THREADS * blocks
                                                               : TOPOLOGY;
  static constexpr int rows_per_thread = TOPOLOGY == THREAD_PER_8_ROWS ? 8 : 1;
  static constexpr int rows_per_block = blocks > 1 ? 1 : THREADS / lanes * rows_per_thread;
  // The thread's row `u` of its rows_per_thread: a block's rows u are adjacent, so a warp's
  // accesses to them meet in whole sectors when the rows are short.
  __device__ static long long row(int u = 0) {
    if constexpr (blocks > 1) return blockIdx.x / blocks;
    return (long long)blockIdx.x * rows_per_block + u * (THREADS / lanes) + threadIdx.x / lanes;
  }
  __device__ static int lane() {
    if constexpr (blocks > 1) return (blockIdx.x % blocks) * THREADS + threadIdx.x;
    return threadIdx.x % lanes;
  }
};

// Combine each block's `mine` over the cluster, in rank order. The barrier's
// arrive releases and its wait acquires, so every block sees every block's
// partial; the second barrier keeps each block's partial (and the block
// itself: its shared memory ends with it) until every block has read it.
template <int BLOCKS, typename State, typename Op>
__device__ __forceinline__ State cluster_reduce(State mine, Op op) {
  __shared__ State partial;
  if (threadIdx.x == 0) partial = mine;
  __cluster_barrier_arrive();
  __cluster_barrier_wait();
  State total = *(const State*)__cluster_map_shared_rank(&partial, 0);
#pragma unroll
  for (int rank = 1; rank < BLOCKS; ++rank) total = op(total, *(const State*)__cluster_map_shared_rank(&partial, rank));
  __cluster_barrier_arrive();
  __cluster_barrier_wait();
  return total;
}

// Combine `v` over the row group; every thread of the group gets the result.
// State needs shfl_xor(State, int offset, unsigned members) and the Op
// needs operator()(State, State).
template <int THREADS, int TOPOLOGY, typename State, typename Op>
__device__ __forceinline__ State row_reduce(State v, Op op) {
  constexpr int lanes = RowGroup<THREADS, TOPOLOGY>::lanes;
  if constexpr (lanes == 1) return v;
  constexpr int width = lanes < 32 ? lanes : 32;
  const unsigned members = width == 32 ? 0xffffffffu
                                       : ((1u << width) - 1) << ((threadIdx.x % 32) & ~(width - 1));
#pragma unroll
  for (int offset = width / 2; offset > 0; offset >>= 1) v = op(v, shfl_xor(v, offset, members));
  if (lanes <= 32) {
    phase_mark(PHASE_REDUCTION);
    return v;
  }

  constexpr int warps = THREADS / 32;
  __shared__ State partial[warps];
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  // Every thread folds the warp partials in the same order, so all agree.
  State total = partial[0];
#pragma unroll
  for (int i = 1; i < warps; ++i) total = op(total, partial[i]);
  __syncthreads();  // partial[] is reused by the row's next reduction
  if constexpr (RowGroup<THREADS, TOPOLOGY>::blocks > 1) total = cluster_reduce<RowGroup<THREADS, TOPOLOGY>::blocks>(total, op);
  phase_mark(PHASE_REDUCTION);
  return total;
}

}  // namespace aicg
