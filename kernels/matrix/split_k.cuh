// Split-K with a fixed-order reduction, for kernels whose tile's accumulators
// are spread over a group of threads (a warpgroup or two).
//
// A tile's K range is cut into `parts` consecutive parts, each computed as a
// unit of its own (possibly by different CTAs, in any order). A unit
// publishes its fp32 partial sums in the workspace, then takes a ticket of
// its tile; the unit that draws the last ticket adds the partials in part
// order 0, 1, ..., parts - 1 (its own from registers, the others from the
// workspace: the same numbers either way) and goes on to the epilogue. Of two
// parts, a unit that finds the other's ticket already drawn before it
// publishes is the last without publishing. The sum's order does not depend on which unit
// finished last, so every launch gives the same bits; it does depend on where
// K is cut, which the realisation (and, for a stream, the grid) fixes. The
// reducer clears the ticket for the next launch (tickets start zeroed); no
// unit ever waits for another, so any schedule of units is safe.
//
// Where the parts lie is the caller's (work.cuh: PartPlaces): each part is THREADS x
// GROUPS float4s, laid out [group of 4 accumulators][thread], so a warp's 32
// lanes write and read 512 consecutive bytes.
#pragma once
#include "matrix/tiles.cuh"
#include "matrix/work.cuh"

namespace aicg {
namespace matrix {

template <int COUNT, int THREADS>
struct SplitReduction {
  static_assert(COUNT % 4 == 0, "accumulators in groups of 4");
  static constexpr int GROUPS = COUNT / 4;
  static constexpr int PART_VECTORS = GROUPS * THREADS;   // float4s a part

  // Adds `acc`, part `part` of a tile's `parts`, to the tile's sum; returns whether this unit
  // completes the tile, in which case `acc` now holds the whole sum. `ticket` is the tile's,
  // `thread` this thread's index among the THREADS holding the tile, `barrier` their named barrier,
  // `flag` a shared word of theirs.
  //
  // The sum is ((part 0 + part 1) + part 2) + ...: of two parts the finisher adds the other's to
  // its own in registers (a + b and b + a are the same bits); of more, it reads every part back,
  // its own too, so that the order is the parts' whoever finishes (and the accumulators need no
  // second set of registers beside them).
  static __device__ __forceinline__ bool reduce(float* acc, float* workspace, const PartPlaces& places,
                                                unsigned* ticket, int part, int parts, int thread, unsigned barrier,
                                                volatile unsigned* flag) {
    float4* const parts_at = reinterpret_cast<float4*>(workspace) + thread;
    bool last = false;
    if (parts == 2) {   // a unit that finds the other part's ticket drawn needs not publish its own
      named_barrier_sync(barrier, THREADS);   // every thread has read the flag's last value
      if (thread == 0) *flag = *static_cast<volatile unsigned*>(ticket) == 1u;
      named_barrier_sync(barrier, THREADS);
      last = *flag;
    }
    if (!last) {
      float4* mine = parts_at + places(part) * PART_VECTORS;
#pragma unroll
      for (int g = 0; g < GROUPS; ++g)
        __stcg(mine + g * THREADS, make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]));
      __threadfence();
      named_barrier_sync(barrier, THREADS);
      if (thread == 0) *flag = atomicAdd(ticket, 1u) == static_cast<unsigned>(parts - 1);
      named_barrier_sync(barrier, THREADS);
      if (!*flag) return false;
    }
    __threadfence();   // the other units' partials, published before their tickets, are read after ours
    if (parts == 2) {
      add(acc, parts_at + places(1 - part) * PART_VECTORS);
    } else {
      const float4* first = parts_at + places(0) * PART_VECTORS;
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) {
        const float4 v = __ldcg(first + g * THREADS);
        acc[4 * g] = v.x;
        acc[4 * g + 1] = v.y;
        acc[4 * g + 2] = v.z;
        acc[4 * g + 3] = v.w;
      }
      for (int p = 1; p < parts; ++p) add(acc, parts_at + places(p) * PART_VECTORS);
    }
    if (thread == 0) *ticket = 0;
    return true;
  }

  // acc += the part at `part` (this thread's float4s of it)
  static __device__ __forceinline__ void add(float* acc, const float4* part) {
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
      const float4 v = __ldcg(part + g * THREADS);
      acc[4 * g] += v.x;
      acc[4 * g + 1] += v.y;
      acc[4 * g + 2] += v.z;
      acc[4 * g + 3] += v.w;
    }
  }
};

}  // namespace matrix
}  // namespace aicg
