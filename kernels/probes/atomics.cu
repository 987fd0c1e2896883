// Atomic add throughput by how many threads share an address. Every thread
// of the grid adds 1 `iterations` times; at iteration i the thread in lane l
// of global warp w adds to word
//     (l * lane_scale + w * warp_scale + i * iteration_scale) & mask
// of the target, so one kernel covers every pattern: all threads on one word
// (all scales 0), a word per warp (lane_scale 0), a word per thread (lane 1,
// warp 32), or a word per thread and iteration sweeping a buffer larger than
// the L2 (iteration_scale = threads in the grid). The scales are kernel
// arguments, so the compiler cannot see which addresses coincide and
// aggregate them itself: what is measured is the memory system's.
//
// The add_ entries issue red.global.add (fire and forget: no old value comes
// back), written as asm so the PTX says so rather than leaving it to ptxas;
// fetch_add_u32 uses atomicAdd's old value (atom.global.add), folding it
// into a per-thread sink word. Either way the adds are side effects the
// compiler must keep; the host checks every word's count.
#define ATOMIC_UNROLL 4

__device__ __forceinline__ unsigned bits(unsigned x) { return x; }
__device__ __forceinline__ unsigned bits(float x) { return __float_as_uint(x); }

__device__ __forceinline__ void red_add_one(unsigned* p) {
    asm volatile("red.global.add.u32 [%0], 1;" : : "l"(p) : "memory");
}
__device__ __forceinline__ void red_add_one(float* p) {
    asm volatile("red.global.add.f32 [%0], 0f3F800000;" : : "l"(p) : "memory");   // 1.0f
}

template <typename T, bool FETCH>
__device__ void add_loop(T* __restrict__ target, unsigned long long lane_scale, unsigned long long warp_scale,
                         unsigned long long iteration_scale, unsigned long long mask, int iterations,
                         unsigned* __restrict__ sink) {
    const unsigned thread = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long index = (threadIdx.x & 31) * lane_scale + (thread >> 5) * warp_scale;
    unsigned acc = 0;
    int i = 0;
    for (; i + ATOMIC_UNROLL <= iterations; i += ATOMIC_UNROLL) {
#pragma unroll
        for (int u = 0; u < ATOMIC_UNROLL; ++u, index += iteration_scale) {
            if (FETCH) acc ^= bits(atomicAdd(target + (index & mask), (T)1));
            else red_add_one(target + (index & mask));
        }
    }
    for (; i < iterations; ++i, index += iteration_scale) {
        if (FETCH) acc ^= bits(atomicAdd(target + (index & mask), (T)1));
        else red_add_one(target + (index & mask));
    }
    if (FETCH) sink[thread] = acc;
}

// Eight blocks of ATOMIC_BLOCK threads fill an SM of 2048 threads (registers capped to fit).
#define ATOMIC_BLOCK 256
#define ADD_ENTRY(NAME, T, FETCH)                                                                        \
    extern "C" __global__ void __launch_bounds__(ATOMIC_BLOCK, 8)                                         \
    NAME(T* __restrict__ target, unsigned long long lane_scale, unsigned long long warp_scale,            \
         unsigned long long iteration_scale, unsigned long long mask, int iterations,                     \
         unsigned* __restrict__ sink) {                                                                   \
        add_loop<T, FETCH>(target, lane_scale, warp_scale, iteration_scale, mask, iterations, sink);     \
    }

ADD_ENTRY(add_u32, unsigned, false)
ADD_ENTRY(add_f32, float, false)
ADD_ENTRY(fetch_add_u32, unsigned, true)
