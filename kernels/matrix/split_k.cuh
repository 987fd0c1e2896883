// Split-K with a fixed-order reduction, for kernels whose tile's accumulators
// are spread over a group of threads (a warpgroup or two).
//
// A tile's K range is cut into `splits` consecutive parts, each computed as a
// unit of its own (possibly by different CTAs, in any order). A unit
// publishes its fp32 partial sums in the workspace, then takes a ticket of
// its tile; the unit that draws the last ticket adds the partials in split
// order 0, 1, ..., splits - 1 (its own from registers, the others from the
// workspace: the same numbers either way) and goes on to the epilogue. The
// sum's order does not depend on which unit finished last, so every launch
// gives the same bits; it does depend on `splits`, which the realisation
// fixes. The reducer clears the ticket for the next launch (tickets start
// zeroed); no unit ever waits for another, so any schedule of units is safe.
//
// Workspace layout: [tile][split][group of 4 accumulators][thread] float4s,
// so a warp's 32 lanes write and read 512 consecutive bytes.
#pragma once
#include "matrix/tiles.cuh"

namespace aicg {
namespace matrix {

template <int COUNT, int THREADS>
struct SplitReduction {
  static_assert(COUNT % 4 == 0, "accumulators in groups of 4");
  static constexpr int GROUPS = COUNT / 4;

  // Publishes `acc` as split `split` of tile `tile`; returns whether this unit
  // completes the tile, in which case `acc` now holds the whole sum. `thread`
  // is this thread's index among the THREADS holding the tile, `barrier` their
  // named barrier, `flag` a shared word of theirs.
  static __device__ __forceinline__ bool reduce(float* acc, float* workspace, unsigned* tickets, long long tile,
                                                int split, int splits, int thread, unsigned barrier,
                                                volatile unsigned* flag) {
    float4* parts = reinterpret_cast<float4*>(workspace) + tile * splits * GROUPS * THREADS;
    float4* mine = parts + static_cast<long long>(split) * GROUPS * THREADS;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g)
      __stcg(mine + g * THREADS + thread, make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]));
    __threadfence();
    named_barrier_sync(barrier, THREADS);
    if (thread == 0) *flag = atomicAdd(tickets + tile, 1u) == static_cast<unsigned>(splits - 1);
    named_barrier_sync(barrier, THREADS);
    if (!*flag) return false;
    __threadfence();   // the other units' partials, published before their tickets, are read after ours
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
      const float4 own = make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]);
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int s = 0; s < splits; ++s) {
        const float4 v = s == split ? own : __ldcg(parts + (static_cast<long long>(s) * GROUPS + g) * THREADS + thread);
        if (s == 0) {
          sum = v;
        } else {
          sum.x += v.x;
          sum.y += v.y;
          sum.z += v.z;
          sum.w += v.w;
        }
      }
      acc[4 * g] = sum.x;
      acc[4 * g + 1] = sum.y;
      acc[4 * g + 2] = sum.z;
      acc[4 * g + 3] = sum.w;
    }
    if (thread == 0) tickets[tile] = 0;
    return true;
  }
};

}  // namespace matrix
}  // namespace aicg
