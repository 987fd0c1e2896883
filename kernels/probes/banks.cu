// Shared-memory bank conflicts: lane l of every warp loads the element at
// l * stride of a shared array of 4-, 8- or 16-byte elements, ITERATIONS x
// UNROLL times, with every warp of the SM doing the same so the SM's shared
// memory pipe is the bottleneck. Each warp-wide load takes as many passes as
// the most distinct words any one bank is asked for, so the time per load
// grows with the conflict's ways.
//
// Loads are ld.volatile.shared in volatile asm: ptxas, not only the front end,
// must issue every one, though each lane reads one address over and over.
// They are summed (a xor of a value with itself would cancel, and let the
// loads go) into a value written only when it equals a key no input produces.
// Each block writes the clock64 span of its loop, between two barriers.
#define UNROLL 16
#define MAX_STRIDE 33
#define BLOCK 1024

template <int BYTES> __device__ __forceinline__ unsigned load_fold(unsigned addr);

template <> __device__ __forceinline__ unsigned load_fold<4>(unsigned addr) {
    unsigned x;
    asm volatile("ld.volatile.shared.u32 %0, [%1];" : "=r"(x) : "r"(addr) : "memory");
    return x;
}

template <> __device__ __forceinline__ unsigned load_fold<8>(unsigned addr) {
    unsigned x, y;
    asm volatile("ld.volatile.shared.v2.u32 {%0,%1}, [%2];" : "=r"(x), "=r"(y) : "r"(addr) : "memory");
    return x + y;
}

template <> __device__ __forceinline__ unsigned load_fold<16>(unsigned addr) {
    unsigned x, y, z, w;
    asm volatile("ld.volatile.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "r"(addr) : "memory");
    return x + y + z + w;
}

template <int BYTES>
__device__ void conflict_loop(unsigned* words, int stride, int iterations, unsigned key, unsigned* sink,
                              long long* cycles) {
    const int count = 32 * MAX_STRIDE * (BYTES / 4);
    for (int i = threadIdx.x; i < count; i += blockDim.x) words[i] = 0x9E3779B9u * (i + 1) ^ (i >> 3);
    __syncthreads();
    unsigned addr = (unsigned)__cvta_generic_to_shared(words) + (threadIdx.x & 31) * stride * BYTES;
    unsigned acc = 0;
    long long begin = clock64();
    for (int it = 0; it < iterations; ++it) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc += load_fold<BYTES>(addr);
    }
    __syncthreads();
    long long end = clock64();
    if (threadIdx.x == 0) cycles[blockIdx.x] = end - begin;
    if (acc == key) sink[0] = acc;
}

// Two blocks of BLOCK threads fill an SM of 2048 threads (registers capped to fit).
#define CONFLICT_ENTRY(BYTES)                                                                             \
    extern "C" __global__ void __launch_bounds__(BLOCK, 2)                                                \
    bank_conflicts_##BYTES(int stride, int iterations, unsigned key, unsigned* sink, long long* cycles) { \
        __shared__ __align__(16) unsigned words[32 * MAX_STRIDE * (BYTES / 4)];                          \
        conflict_loop<BYTES>(words, stride, iterations, key, sink, cycles);                               \
    }

CONFLICT_ENTRY(4)
CONFLICT_ENTRY(8)
CONFLICT_ENTRY(16)
