// Global-to-shared copy bandwidth against bytes in flight, and the latency
// of one copy, for three ways of moving data into an SM:
//   cp_async_stream<S>  16-byte cp.async.cg per thread, S stages deep
//                       (commit_group / wait_group S-1: S tiles in flight);
//   load_stream<D>      plain 16-byte loads into registers, D per thread
//                       issued before the first is used (the reference);
//   bulk_stream         (sm_90) one thread issues cp.async.bulk copies of a
//                       whole tile, completed on an mbarrier per stage.
// A tile is what one block moves per step; block b takes tiles b, b + grid,
// b + 2 grid, ... of the source. Each thread xors a word of every tile it
// waited for into a value written to the sink, so every copy is consumed.
// The latency kernels run in one thread and time, with clock64, the issue
// of one copy to the completion of its wait.

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// Tiles this block takes out of `tiles`, striding by the grid.
__device__ __forceinline__ long long tiles_of_block(long long tiles) {
    return tiles > blockIdx.x ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
}

__device__ __forceinline__ long long tile_index(long long k) {
    return blockIdx.x + k * gridDim.x;
}

__device__ __forceinline__ void cp_async_16(unsigned destination, const void* source) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(destination), "l"(source) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" : : : "memory");
}

template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" : : "n"(PENDING) : "memory");
}

// A tile is blockDim.x 16-byte words, one per thread; stage s of the
// dynamic shared memory holds one tile.
template <int STAGES>
__device__ void cp_async_stream(const uint4* __restrict__ source, long long tiles, unsigned* __restrict__ sink) {
    extern __shared__ __align__(16) uint4 stages[];
    const long long mine = tiles_of_block(tiles);
    const unsigned slot0 = shared_address(stages + threadIdx.x);
    // Every step commits a group, empty past the last tile, so wait_group's count stays exact.
    auto issue = [&](long long k) {
        if (k < mine)
            cp_async_16(slot0 + (unsigned)(k % STAGES) * blockDim.x * 16,
                        source + tile_index(k) * blockDim.x + threadIdx.x);
        cp_async_commit();
    };
#pragma unroll
    for (int k = 0; k < STAGES - 1; ++k) issue(k);
    unsigned acc = 0;
    for (long long k = 0; k < mine; ++k) {
        issue(k + STAGES - 1);
        cp_async_wait<STAGES - 1>();   // the group of tile k has landed
        acc ^= stages[(k % STAGES) * blockDim.x + threadIdx.x].x;
    }
    cp_async_wait<0>();
    sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// All four words are folded: a load of .x alone would be narrowed to 4 bytes.
template <int DEPTH>
__device__ void load_stream(const uint4* __restrict__ source, long long tiles, unsigned* __restrict__ sink) {
    const long long mine = tiles_of_block(tiles);
    unsigned acc = 0;
    long long k = 0;
    for (; k + DEPTH <= mine; k += DEPTH) {
        uint4 v[DEPTH];
#pragma unroll
        for (int u = 0; u < DEPTH; ++u) v[u] = source[tile_index(k + u) * blockDim.x + threadIdx.x];
#pragma unroll
        for (int u = 0; u < DEPTH; ++u) acc ^= fold(v[u]);
    }
    for (; k < mine; ++k) acc ^= fold(source[tile_index(k) * blockDim.x + threadIdx.x]);
    sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

#define STREAM_ENTRIES(N)                                                                              \
    extern "C" __global__ void cp_async_stream_##N(const uint4* __restrict__ source, long long tiles,  \
                                                   unsigned* __restrict__ sink) {                      \
        cp_async_stream<N>(source, tiles, sink);                                                       \
    }                                                                                                  \
    extern "C" __global__ void load_stream_##N(const uint4* __restrict__ source, long long tiles,      \
                                               unsigned* __restrict__ sink) {                          \
        load_stream<N>(source, tiles, sink);                                                           \
    }

STREAM_ENTRIES(1)
STREAM_ENTRIES(2)
STREAM_ENTRIES(4)
STREAM_ENTRIES(8)

// One thread, one 16-byte copy at a time, `step` 16-byte words apart:
// cycles[i] is the clock64 span from issuing copy i to its wait returning.
extern "C" __global__ void cp_async_latency(const uint4* __restrict__ source, long long step, int count,
                                            long long* __restrict__ cycles, unsigned* __restrict__ sink) {
    __shared__ __align__(16) uint4 slot;
    const unsigned destination = shared_address(&slot);
    unsigned acc = 0;
    for (int i = 0; i < count; ++i) {
        long long begin = clock64();
        cp_async_16(destination, source + i * step);
        cp_async_commit();
        cp_async_wait<0>();
        long long end = clock64();
        cycles[i] = end - begin;
        acc ^= *(volatile unsigned*)&slot.x;
    }
    sink[0] = acc;
}

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbarrier_init(unsigned barrier) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" : : "r"(barrier) : "memory");
}

// Make the initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
}

// Arm `barrier` for `bytes` of transfer and copy them from global memory into shared.
__device__ __forceinline__ void bulk_copy(unsigned destination, const void* source, unsigned bytes, unsigned barrier) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" : : "r"(barrier), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 : : "r"(destination), "l"(source), "r"(bytes), "r"(barrier) : "memory");
}

__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred ready;\nmbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, ready;\n}"
                     : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
    } while (!done);
}

// Dynamic shared memory: `stages` mbarriers in the first 128 bytes, then
// `stages` tiles of `tile_bytes` (a multiple of 16). One thread issues; all wait.
// The source holds `span` distinct tiles, read again past the last: a span
// within the L2 streams from it, a span of all the tiles from DRAM.
#define BULK_BARRIER_BYTES 128
extern "C" __global__ void bulk_stream(const unsigned char* __restrict__ source, long long tiles, long long span,
                                       unsigned tile_bytes, int stages, unsigned* __restrict__ sink) {
    extern __shared__ __align__(128) unsigned char shared[];
    const unsigned barriers = shared_address(shared);
    const unsigned data = barriers + BULK_BARRIER_BYTES;
    const long long mine = tiles_of_block(tiles);
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) mbarrier_init(barriers + 8 * s);
        mbarrier_init_fence();
        for (int s = 0; s < stages && s < mine; ++s)
            bulk_copy(data + s * tile_bytes, source + tile_index(s) % span * tile_bytes, tile_bytes,
                      barriers + 8 * s);
    }
    __syncthreads();
    const unsigned word = threadIdx.x % (tile_bytes / 4);
    unsigned acc = 0, parity = 0;
    int s = 0;
    for (long long k = 0; k < mine; ++k) {
        mbarrier_wait(barriers + 8 * s, parity);
        acc ^= ((const volatile unsigned*)(shared + BULK_BARRIER_BYTES + (size_t)s * tile_bytes))[word];
        __syncthreads();   // every thread has read stage s before it is refilled
        if (threadIdx.x == 0 && k + stages < mine)
            bulk_copy(data + s * tile_bytes, source + tile_index(k + stages) % span * tile_bytes, tile_bytes,
                      barriers + 8 * s);
        if (++s == stages) s = 0, parity ^= 1;
    }
    sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// One thread, one bulk copy of `bytes` (at most BULK_LATENCY_BYTES) at a time, `step` bytes apart.
#define BULK_LATENCY_BYTES 16384
extern "C" __global__ void bulk_latency(const unsigned char* __restrict__ source, long long step, unsigned bytes,
                                        int count, long long* __restrict__ cycles, unsigned* __restrict__ sink) {
    __shared__ __align__(128) unsigned char tile[BULK_LATENCY_BYTES];
    __shared__ __align__(8) unsigned long long barrier_word;
    const unsigned barrier = shared_address(&barrier_word);
    mbarrier_init(barrier);
    mbarrier_init_fence();
    unsigned acc = 0;
    for (int i = 0; i < count; ++i) {
        long long begin = clock64();
        bulk_copy(shared_address(tile), source + i * step, bytes, barrier);
        mbarrier_wait(barrier, i & 1);
        long long end = clock64();
        cycles[i] = end - begin;
        acc ^= ((const volatile unsigned*)tile)[i % (bytes / 4)];
    }
    sink[0] = acc;
}
#endif
