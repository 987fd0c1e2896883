// sm_80+ building blocks of the mma.sync GEMM and the decode kernel, one PTX
// instruction each: asynchronous 16-byte copies into shared memory, ldmatrix,
// the m16n8k16 tensor-core MMA, and global loads with cache hints.
#pragma once
#include "aicg_types.cuh"

namespace aicg {
namespace matrix {

// 16 bytes from global to shared memory, of which the first `bytes` (0..16)
// are read and the rest zero-filled; `src` must be a valid address even when
// `bytes` is 0. .cg: through L2 only, the operands are staged in shared memory.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" : : "r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" : : : "memory"); }

template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" : : "n"(PENDING) : "memory");
}

__device__ __forceinline__ void store_shared_u16(unsigned dst, unsigned short v) {
  asm volatile("st.shared.u16 [%0], %1;" : : "r"(dst), "h"(v) : "memory");
}

// Four 8x8 matrices of 16-bit elements; lane i supplies the address of row
// i % 8 of matrix i / 8. Without .trans lane l receives, of each matrix, row
// l / 4, columns 2 (l % 4) and 2 (l % 4) + 1; with .trans, column l / 4, rows
// 2 (l % 4) and 2 (l % 4) + 1.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}

// d += a b for one m16n8k16 tile. Fragments (lane l, q = l % 4, r = l / 4):
// a[0] = A(r, 2q..2q+1), a[1] = A(r+8, 2q..), a[2] = A(r, 2q+8..), a[3] = A(r+8, 2q+8..);
// b[0] = B(2q..2q+1, r), b[1] = B(2q+8.., r); d as in epilogue.cuh's store_fragment.
template <typename T> struct Mma16816;
template <> struct Mma16816<bf16> {
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};
template <> struct Mma16816<f16> {
  static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// 16 bytes of shared memory at a shared address.
__device__ __forceinline__ uint4 load_shared_vector(unsigned address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(address) : "memory");
  return v;
}

// 16 bytes read once by the whole grid (a weight): not kept in L1.
__device__ __forceinline__ uint4 load_streaming_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// 16 bytes read by many warps (an activation row): kept in L1.
__device__ __forceinline__ uint4 load_shared_input_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

}  // namespace matrix
}  // namespace aicg
