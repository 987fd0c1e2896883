// mbarriers and the plain bulk copy (sm_90, no 'a' features), one PTX
// instruction each: what the wgmma GEMM's TMA ring and the decode kernel's
// bulk spread wait on.
#pragma once

namespace aicg {
namespace matrix {

// ---- mbarriers (64-bit objects in shared memory, addressed by their 32-bit shared address)

__device__ __forceinline__ void barrier_init(unsigned bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(bar), "r"(arrivals) : "memory");
}

// Initialised barriers are made visible to the copy engine and to the other
// CTAs of the cluster before anyone uses them.
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
}

// One arrival that also announces `bytes` of copies still to land in this phase.
__device__ __forceinline__ void barrier_arrive_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" : : "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void barrier_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" : : "r"(bar) : "memory");
}

// An arrival on the barrier at the same shared offset in CTA `cta` of this cluster.
// The arrival keeps the instruction's default semantics (release at CTA scope),
// as the local one does: what it announces is that this thread's wgmma reads of
// a slot are complete (wgmma.wait_group returned), and a completed read needs no
// fence to stay ahead of the peer's later copy into the slot. Spelled
// `.release.cluster`, ptxas puts MEMBAR.ALL.GPU before it: a GPU-wide fence in
// every K slice of every consumer, which stalled the clustered kernel.
__device__ __forceinline__ void barrier_arrive_cluster(unsigned bar, unsigned cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}"
      : : "r"(bar), "r"(cta) : "memory");
}

// Wait until the phase of parity `parity` has completed. A fresh barrier is
// in phase 0, so a wait for parity 1 (the phase "before" it) passes at once:
// that is how a producer passes its first round over empty slots.
__device__ __forceinline__ void barrier_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred ready;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
        "selp.u32 %0, 1, 0, ready;\n}"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

// ---- the plain bulk copy: `bytes` (a multiple of 16) contiguous bytes from global to shared
// memory, both 16-byte aligned, announced to the barrier at `bar` as they land.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               : : "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

}  // namespace matrix
}  // namespace aicg
