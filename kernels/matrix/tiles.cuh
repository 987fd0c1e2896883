// Tile bookkeeping shared by the matrix family's realisations: operand
// layouts, the order in which output tiles are walked, shared addresses.
#pragma once

namespace aicg {
namespace matrix {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Every thread of the `threads` (a multiple of 32) that use named barrier `id`
// waits for the others: a barrier of some warps of a block (id 0 is __syncthreads').
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(threads) : "memory");
}

enum Major { K_MAJOR = 0, MN_MAJOR = 1 };   // an operand's contiguous dimension
enum Raster { RASTER_M = 0, RASTER_N = 1 }; // the dimension a band of GROUP tiles spans

// Tile t of tiles_m x tiles_n in grouped order: bands GROUP tiles wide along
// the raster dimension, walked down that dimension first, so the CTAs working
// at one time share a few rows of A and a few columns of B in L2. The last
// band may be narrower; every t below tiles_m * tiles_n maps to one tile.
template <int RASTER, int GROUP>
__device__ __forceinline__ void tile_of(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
  if constexpr (RASTER == RASTER_M) {
    const int band = t / (GROUP * tiles_n), first = band * GROUP;
    const int width = min(GROUP, tiles_m - first), within = t - band * GROUP * tiles_n;
    tm = first + within % width;
    tn = within / width;
  } else {
    const int band = t / (GROUP * tiles_m), first = band * GROUP;
    const int width = min(GROUP, tiles_n - first), within = t - band * GROUP * tiles_m;
    tn = first + within % width;
    tm = within / width;
  }
}

// The start of a box `box` elements long along a dimension of `extent`, for
// a `start` that is a multiple of `box`: `start` itself wherever it lies
// inside the tensor (the box may reach past the edge: the copy engine fills
// zeros), or the last box-aligned start inside where it lies wholly past it.
// The box length must be the copy's own: a box of 32 rows at start 96 of 128
// rows is inside, and moving it to the last 64-aligned start (64) would load
// rows 64..95 in place of 96..127.
__device__ __forceinline__ int box_start(int start, int extent, int box) {
  return min(start, ((extent - 1) / box) * box);
}

}  // namespace matrix
}  // namespace aicg
