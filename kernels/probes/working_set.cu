// Bandwidth against working-set size. `per_sm_read`: every block re-reads the
// same [0, bytes) region, so the working set of each SM is `bytes` and the
// L1 capacity shows. `shared_read`: the whole grid sweeps [0, bytes) together
// with loads that bypass L1 (ld.global.cg), so the GPU-wide working set is
// `bytes` and the L2 capacity shows. Both fold what they read into a value
// written only when it equals an impossible key, which keeps the loads live.
__device__ inline uint4 load_ca(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.ca.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ inline uint4 load_cg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// count: uint4 elements in the region; passes: times each block reads it whole.
extern "C" __global__ void per_sm_read(const uint4* a, long long count, int passes, unsigned key, unsigned* sink) {
    unsigned acc = 0;
    for (int p = 0; p < passes; ++p)
        for (long long i = threadIdx.x; i < count; i += blockDim.x) {
            uint4 v = load_ca(a + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    if (acc == key) sink[0] = acc;
}

extern "C" __global__ void shared_read(const uint4* a, long long count, int passes, unsigned key, unsigned* sink) {
    long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (int p = 0; p < passes; ++p)
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
            uint4 v = load_cg(a + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    if (acc == key) sink[0] = acc;
}
