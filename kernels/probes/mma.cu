// Tensor-core throughput of warp-level mma.sync: bf16 and fp16 (m16n8k16),
// tf32 (m16n8k8) and, from sm_89, fp8 e4m3 (m16n8k32), all accumulating in
// f32. Each thread loads its A and B fragments once from a buffer of random
// words, then its warp issues CHAINS independent MMAs per iteration (one per
// accumulator set), enough in flight to hide the instruction's latency. The
// MMAs are volatile asm, so none is merged or dropped though their operands
// never change, and every accumulator is summed into a per-thread sink word.
#define CHAINS 8
#define MMA_BLOCK 256
#define OPERAND_MASK 0xFFFF   // the operand buffer holds 65536 words

#define MMA_ASM(SHAPE_AND_TYPES)                                                                      \
    asm volatile("mma.sync.aligned." SHAPE_AND_TYPES                                                  \
                 " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                             \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

struct Bf16 {
    static __device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b) {
        MMA_ASM("m16n8k16.row.col.f32.bf16.bf16.f32");
    }
};

struct Fp16 {
    static __device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b) {
        MMA_ASM("m16n8k16.row.col.f32.f16.f16.f32");
    }
};

struct Tf32 {
    static __device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b) {
        MMA_ASM("m16n8k8.row.col.f32.tf32.tf32.f32");
    }
};

#if __CUDA_ARCH__ >= 890
struct Fp8E4m3 {
    static __device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b) {
        MMA_ASM("m16n8k32.row.col.f32.e4m3.e4m3.f32");
    }
};
#endif

template <typename Kind>
__device__ void mma_loop(const unsigned* __restrict__ operands, int iterations, float* __restrict__ sink) {
    const unsigned thread = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned a[4], b[2];
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = operands[(thread * 6 + j) & OPERAND_MASK];
#pragma unroll
    for (int j = 0; j < 2; ++j) b[j] = operands[(thread * 6 + 4 + j) & OPERAND_MASK];
    // Distinct starting values, so no two chains compute the same thing.
    float d[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j) d[c][j] = 0.25f * (c * 4 + j);
    for (int it = 0; it < iterations; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) Kind::mma(d[c], a, b);
    }
    float total = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j) total += d[c][j];
    sink[thread] = total;
}

// Up to four blocks of MMA_BLOCK threads per SM (32 warps): run() varies blocks per
// SM from one to four, and the bound keeps registers low enough for four.
#define MMA_ENTRY(NAME, KIND)                                                                          \
    extern "C" __global__ void __launch_bounds__(MMA_BLOCK, 4)                                         \
    NAME(const unsigned* __restrict__ operands, int iterations, float* __restrict__ sink) {            \
        mma_loop<KIND>(operands, iterations, sink);                                                    \
    }

MMA_ENTRY(mma_bf16, Bf16)
MMA_ENTRY(mma_fp16, Fp16)
MMA_ENTRY(mma_tf32, Tf32)
#if __CUDA_ARCH__ >= 890
MMA_ENTRY(mma_fp8_e4m3, Fp8E4m3)
#endif
