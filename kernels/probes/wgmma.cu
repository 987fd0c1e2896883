// Tensor-core throughput of warpgroup-level wgmma.mma_async on sm_90a:
// m64n256k16 bf16 and m64n256k32 fp8 e4m3, both operands read from shared
// memory through matrix descriptors, accumulating 64x256 f32 in the 128
// registers per thread of a warpgroup (4 warps, 128 threads, one block).
//
// Each block copies a 64x16 bf16 A tile (2 KB) and a 256x16 bf16 B tile
// (8 KB) of random operands (the same bytes as 64x32 and 256x32 fp8) into
// shared memory, without swizzling: 8x16-byte core matrices of 128 bytes,
// neighbours along K 128 bytes apart, along M/N 256 bytes apart. Layout
// fidelity does not matter for a throughput probe, only that the
// descriptors address the tiles. Each iteration fences, issues
// WGMMAS_PER_GROUP MMAs into the one accumulator, commits them as a group
// and waits until at most one group is pending, so the tensor cores always
// have a group queued. The MMAs are volatile asm and every accumulator is
// summed into a per-thread sink word, so nothing is dropped.
#define WARPGROUP 128
#define WGMMAS_PER_GROUP 4
#define A_TILE_BYTES 2048
#define B_TILE_BYTES 8192
#define OPERAND_MASK 0xFFFF   // the operand buffer holds 65536 16-byte words

// The 128 accumulator registers of a thread, as asm operands %0..%127 and their bindings.
#define ACC_REGS \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

#define ACC_OPERANDS \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// A shared-memory matrix descriptor: start address, leading (K) and stride
// (M/N) byte offsets, each >> 4, in bits 0-13, 16-29 and 32-45; swizzle
// mode (bits 62-63) 0, none.
__device__ __forceinline__ unsigned long long matrix_descriptor(unsigned address, unsigned leading_bytes,
                                                                unsigned stride_bytes) {
    return (unsigned long long)((address & 0x3FFFF) >> 4) |
           (unsigned long long)((leading_bytes & 0x3FFFF) >> 4) << 16 |
           (unsigned long long)((stride_bytes & 0x3FFFF) >> 4) << 32;
}

// scale-d is a predicate operand: true (from the constant 1) accumulates into d.
struct Bf16 {
    static __device__ __forceinline__ void mma(float* d, unsigned long long a, unsigned long long b) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " ACC_REGS
                     ", %128, %129, accumulate, 1, 1, 0, 0;\n}"
                     : ACC_OPERANDS
                     : "l"(a), "l"(b), "r"(1));
    }
};

struct Fp8E4m3 {
    static __device__ __forceinline__ void mma(float* d, unsigned long long a, unsigned long long b) {
        asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " ACC_REGS
                     ", %128, %129, accumulate, 1, 1;\n}"
                     : ACC_OPERANDS
                     : "l"(a), "l"(b), "r"(1));
    }
};

// Keeps the compiler from touching the accumulators across a wgmma wait.
__device__ __forceinline__ void fence_accumulators(float* d) {
    asm volatile("" : ACC_OPERANDS : : "memory");
}

template <typename Kind>
__device__ void wgmma_loop(const uint4* __restrict__ operands, int iterations, float* __restrict__ sink) {
    __shared__ __align__(128) uint4 tiles[(A_TILE_BYTES + B_TILE_BYTES) / 16];
    for (int i = threadIdx.x; i < (A_TILE_BYTES + B_TILE_BYTES) / 16; i += blockDim.x)
        tiles[i] = operands[(blockIdx.x * 61 + i) & OPERAND_MASK];
    __syncthreads();
    // The tiles were written through the generic proxy; wgmma reads them through the async one.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const unsigned base = (unsigned)__cvta_generic_to_shared(tiles);
    const unsigned long long a = matrix_descriptor(base, 128, 256);
    const unsigned long long b = matrix_descriptor(base + A_TILE_BYTES, 128, 256);

    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;
    fence_accumulators(d);
    for (int it = 0; it < iterations; ++it) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int m = 0; m < WGMMAS_PER_GROUP; ++m) Kind::mma(d, a, b);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    fence_accumulators(d);
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < 128; ++i) total += d[i];
    sink[blockIdx.x * blockDim.x + threadIdx.x] = total;
}

// One warpgroup per block; 128 accumulators per thread leave room for two blocks per SM.
extern "C" __global__ void __launch_bounds__(WARPGROUP, 1)
wgmma_bf16(const uint4* __restrict__ operands, int iterations, float* __restrict__ sink) {
    wgmma_loop<Bf16>(operands, iterations, sink);
}

extern "C" __global__ void __launch_bounds__(WARPGROUP, 1)
wgmma_fp8_e4m3(const uint4* __restrict__ operands, int iterations, float* __restrict__ sink) {
    wgmma_loop<Fp8E4m3>(operands, iterations, sink);
}
