// Hopper (sm_90a) building blocks of the wgmma GEMM, one PTX instruction
// each: the tensor-map stand-in, the bulk tensor copy (TMA), thread-block
// cluster helpers, register reallocation and the wgmma bookkeeping (fence,
// commit, wait) and shared-memory matrix descriptors. The mbarriers the TMA
// ring waits on are in matrix/mbarrier.cuh.
#pragma once
#include "matrix/mbarrier.cuh"
#include "matrix/tiles.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kernels/matrix/hopper.cuh needs the sm_90a target (wgmma and setmaxnreg are not in plain sm_90)"
#endif

namespace aicg {
namespace matrix {

// NVRTC cannot include <cuda.h>; this is CUtensorMap's size (128 bytes) and
// alignment (64). The host encodes it with cuTensorMapEncodeTiled and passes
// it by value as a `const __grid_constant__` parameter, so that its address is
// the parameter's own (the copy engine reads it from there).
struct alignas(64) TmaDescriptor {
  unsigned long long opaque[16];
};
static_assert(sizeof(TmaDescriptor) == 128, "CUtensorMap is 128 bytes");

// ---- the bulk tensor copy (TMA): a 2-D box of the tensor a descriptor describes

// Coordinates are elements, innermost (contiguous) dimension first; boxes
// reaching past the tensor's edge are filled with zeros and still count their
// full bytes on the barrier. The destination is written in the 128-byte
// swizzled layout the descriptor asks for.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDescriptor* map, int inner, int outer,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      : : "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(inner), "r"(outer), "r"(bar) : "memory");
}

// The same box written to the same shared offset of every CTA in `cta_mask`,
// each CTA's barrier at offset `bar` told of the bytes it receives.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const TmaDescriptor* map, int inner, int outer,
                                                      unsigned bar, unsigned short cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;"
      : : "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(inner), "r"(outer), "r"(bar), "h"(cta_mask)
      : "memory");
}

__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor* map) {
  asm volatile("prefetch.tensormap [%0];" : : "l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// ---- clusters

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

// Every thread of every CTA of the cluster arrives, then waits for all.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" : : : "memory");
}

// ---- registers: a warpgroup gives registers back to the CTA's pool or takes them

template <int REGISTERS>
__device__ __forceinline__ void registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" : : "n"(REGISTERS));
}

template <int REGISTERS>
__device__ __forceinline__ void registers_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" : : "n"(REGISTERS));
}

// ---- wgmma bookkeeping

// Orders this thread's earlier register accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" : : : "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" : : : "memory"); }

// Wait until at most PENDING committed groups of this warpgroup are unfinished.
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" : : "n"(PENDING) : "memory");
}

// ---- shared-memory matrix descriptors (PTX ISA, "Matrix Descriptor Format")
//
// bits  0-13  start address >> 4
// bits 16-29  leading-dimension byte offset >> 4
// bits 32-45  stride-dimension byte offset >> 4
// bits 49-51  base offset: 0, because every swizzle pattern here starts on a
//             1024-byte boundary (the stage buffers are 1024-aligned and every
//             tile piece is a multiple of 1024 bytes)
// bits 62-63  swizzle mode: 1 = 128-byte swizzle
//
// With 128-byte swizzling an operand is made of atoms of 8 rows of 128 bytes
// (1024 bytes): for 16-bit types, 8 rows of 64 elements, and the copy engine
// writes exactly this layout when its box's inner dimension is 64 elements.
//
// K-major operand (A as M x K, B as N x K, K contiguous), one 64-wide K slice:
//   rows of 128 bytes, one per M (or N) index, 8-row groups 1024 bytes apart.
//   SBO = 1024 (from one group of 8 rows to the next); LBO is not used for
//   swizzled K-major layouts (the ISA says "assumed 1"), so it is set to 1.
//   The k16 step j of the slice starts 32 * j bytes into the row: the
//   hardware applies the swizzle to the address it forms, so moving the start
//   inside the 128-byte row is how every implementation steps along K.
//
// MN-major operand (A as K x M, B as K x N, M or N contiguous): the copy
//   engine loads boxes of 64 (M or N) x 64 (K): 64 rows of 128 bytes, one row
//   per K index, 8192 bytes a box, boxes for successive 64-wide M/N chunks
//   8192 bytes apart. In the ISA's canonical MN-major 128B layout
//   ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), LBO is the step between 64-element
//   M/N chunks (8192) and SBO between groups of 8 K rows (1024). The k16 step
//   j starts 16 * 128 = 2048 * j bytes in: a whole number of atoms.
constexpr unsigned long long DESCRIPTOR_SWIZZLE_128B = 1ull << 62;

__device__ __forceinline__ unsigned long long matrix_descriptor(unsigned address, unsigned leading_bytes,
                                                                unsigned stride_bytes) {
  return DESCRIPTOR_SWIZZLE_128B | (static_cast<unsigned long long>((stride_bytes & 0x3FFFF) >> 4) << 32) |
         (static_cast<unsigned long long>((leading_bytes & 0x3FFFF) >> 4) << 16) |
         static_cast<unsigned long long>((address & 0x3FFFF) >> 4);
}

constexpr unsigned SWIZZLE_ROW_BYTES = 128;       // one row of a 128-byte swizzle atom
constexpr unsigned SWIZZLE_ATOM_BYTES = 1024;     // 8 such rows
constexpr unsigned MN_BOX_BYTES = 64 * 128;       // a 64 (M/N) x 64 (K) box of 16-bit elements

}  // namespace matrix
}  // namespace aicg
