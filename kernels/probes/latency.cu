// Load-to-use latency by pointer chasing. One thread follows a cyclic chain
// whose every step is a load of the address the previous load returned, so no
// two loads overlap and clock64 around STEPS of them gives cycles per load.
//
// Global memory: one 64-bit pointer at the start of each LINE_BYTES line, the
// lines linked in a random order built on the host (`link_chain` turns the
// host's compact next-line indices into addresses). Loads are ld.global.ca, so
// a working set that fits stays in L1. Shared memory: the same, with 32-bit
// shared addresses in a block's shared array.
//
// The chase is volatile asm (never removed or merged); the cycle count and
// the last address reached are written out.
#define LINE_BYTES 128
#define WORDS_PER_LINE (LINE_BYTES / 8)
#define SHARED_CHAIN_MAX 4096

__device__ __forceinline__ unsigned long long chase_ca(unsigned long long p) {
    asm volatile("ld.global.ca.u64 %0, [%0];" : "+l"(p) : : "memory");
    return p;
}

__device__ __forceinline__ unsigned chase_shared(unsigned p) {
    asm volatile("ld.shared.u32 %0, [%0];" : "+r"(p) : : "memory");
    return p;
}

// lines[i * WORDS_PER_LINE] = address of line next[i], for i < count.
extern "C" __global__ void link_chain(unsigned long long* lines, const unsigned* next, long long count) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step)
        lines[i * WORDS_PER_LINE] = (unsigned long long)(lines + (long long)next[i] * WORDS_PER_LINE);
}

// One thread: warm_steps untimed steps (so caches hold what they can), then
// `steps` timed ones (a multiple of 8).
extern "C" __global__ void chase_global(const unsigned long long* lines, unsigned start, long long warm_steps,
                                        int steps, long long* cycles, unsigned long long* last) {
    unsigned long long p = (unsigned long long)(lines + (long long)start * WORDS_PER_LINE);
    for (long long s = 0; s < warm_steps; ++s) p = chase_ca(p);
    long long begin = clock64();
    for (int s = 0; s < steps; s += 8) {
        p = chase_ca(p); p = chase_ca(p); p = chase_ca(p); p = chase_ca(p);
        p = chase_ca(p); p = chase_ca(p); p = chase_ca(p); p = chase_ca(p);
    }
    long long end = clock64();
    cycles[0] = end - begin;
    last[0] = p;
}

// One block: its threads copy the chain of `count` (<= SHARED_CHAIN_MAX)
// next-word indices into shared memory as shared addresses; thread 0 then
// chases it for one untimed lap and `steps` timed steps (a multiple of 8).
extern "C" __global__ void chase_shared_memory(const unsigned* next, int count, unsigned start, int steps,
                                               long long* cycles, unsigned* last) {
    __shared__ unsigned chain[SHARED_CHAIN_MAX];
    unsigned base = (unsigned)__cvta_generic_to_shared(chain);
    for (int i = threadIdx.x; i < count; i += blockDim.x) chain[i] = base + next[i] * 4u;
    __syncthreads();
    if (threadIdx.x != 0) return;
    unsigned p = base + start * 4u;
    for (int s = 0; s < count; ++s) p = chase_shared(p);
    long long begin = clock64();
    for (int s = 0; s < steps; s += 8) {
        p = chase_shared(p); p = chase_shared(p); p = chase_shared(p); p = chase_shared(p);
        p = chase_shared(p); p = chase_shared(p); p = chase_shared(p); p = chase_shared(p);
    }
    long long end = clock64();
    cycles[0] = end - begin;
    last[0] = p;
}
