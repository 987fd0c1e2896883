// Streaming kernels for DRAM bandwidth: read, write, copy, triad, at access
// widths of 4, 8 and 16 bytes. Each thread keeps UNROLL independent accesses
// in flight per step of a grid-stride loop, so bytes in flight per SM are
// resident threads x width x UNROLL. Reads fold into a value that is written
// only when it equals a key no real input produces, which keeps every load
// live without adding stores.
#define UNROLL 4

template <typename V> __device__ inline unsigned fold(V v);
template <> __device__ inline unsigned fold(unsigned v) { return v; }
template <> __device__ inline unsigned fold(uint2 v) { return v.x ^ v.y; }
template <> __device__ inline unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

template <typename V> __device__ inline V splat(unsigned x);
template <> __device__ inline unsigned splat(unsigned x) { return x; }
template <> __device__ inline uint2 splat(unsigned x) { return make_uint2(x, x + 1); }
template <> __device__ inline uint4 splat(unsigned x) { return make_uint4(x, x + 1, x + 2, x + 3); }

template <typename V> __device__ inline V triad_of(V b, V c, unsigned s);
template <> __device__ inline unsigned triad_of(unsigned b, unsigned c, unsigned s) { return b + s * c; }
template <> __device__ inline uint2 triad_of(uint2 b, uint2 c, unsigned s) {
    return make_uint2(b.x + s * c.x, b.y + s * c.y);
}
template <> __device__ inline uint4 triad_of(uint4 b, uint4 c, unsigned s) {
    return make_uint4(b.x + s * c.x, b.y + s * c.y, b.z + s * c.z, b.w + s * c.w);
}

// count: number of V elements; the grid-stride loop covers them UNROLL at a time.
template <typename V>
__device__ void read_stream(const V* __restrict__ a, long long count, unsigned key, unsigned* sink) {
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (UNROLL - 1) * stride < count; i += UNROLL * stride) {
        V v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = a[i + u * stride];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= fold(v[u]);
    }
    for (; i < count; i += stride) acc ^= fold(a[i]);
    if (acc == key) sink[0] = acc;
}

template <typename V>
__device__ void write_stream(V* __restrict__ a, long long count, unsigned seed) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        a[i] = splat<V>(seed ^ (unsigned)i);
}

// Streaming variants mark the data evict-first (ld/st .cs): a copy that
// passes through L2 once should not push out lines still being written.
template <typename V, bool STREAM> __device__ inline V load(const V* p) { return STREAM ? __ldcs(p) : *p; }
template <typename V, bool STREAM> __device__ inline void store(V* p, V v) {
    if (STREAM) __stcs(p, v); else *p = v;
}

template <typename V, bool STREAM = false>
__device__ void copy_stream(const V* __restrict__ a, V* __restrict__ b, long long count) {
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < count; i += UNROLL * stride) {
        V v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = load<V, STREAM>(a + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) store<V, STREAM>(b + i + u * stride, v[u]);
    }
    for (; i < count; i += stride) store<V, STREAM>(b + i, load<V, STREAM>(a + i));
}

template <typename V, bool STREAM = false>
__device__ void triad_stream(V* __restrict__ a, const V* __restrict__ b, const V* __restrict__ c,
                             long long count, unsigned s) {
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < count; i += UNROLL * stride) {
        V vb[UNROLL], vc[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            vb[u] = load<V, STREAM>(b + i + u * stride);
            vc[u] = load<V, STREAM>(c + i + u * stride);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) store<V, STREAM>(a + i + u * stride, triad_of(vb[u], vc[u], s));
    }
    for (; i < count; i += stride) store<V, STREAM>(a + i, triad_of(load<V, STREAM>(b + i), load<V, STREAM>(c + i), s));
}

#define WIDTH_ENTRIES(W, V)                                                                         \
    extern "C" __global__ void read_w##W(const V* a, long long n, unsigned key, unsigned* sink) {   \
        read_stream<V>(a, n, key, sink);                                                            \
    }                                                                                               \
    extern "C" __global__ void write_w##W(V* a, long long n, unsigned seed) { write_stream<V>(a, n, seed); } \
    extern "C" __global__ void copy_w##W(const V* a, V* b, long long n) { copy_stream<V>(a, b, n); }   \
    extern "C" __global__ void triad_w##W(V* a, const V* b, const V* c, long long n, unsigned s) {    \
        triad_stream<V>(a, b, c, n, s);                                                             \
    }

WIDTH_ENTRIES(4, unsigned)
WIDTH_ENTRIES(8, uint2)
WIDTH_ENTRIES(16, uint4)

extern "C" __global__ void copy_cs_w16(const uint4* a, uint4* b, long long n) { copy_stream<uint4, true>(a, b, n); }
extern "C" __global__ void triad_cs_w16(uint4* a, const uint4* b, const uint4* c, long long n, unsigned s) {
    triad_stream<uint4, true>(a, b, c, n, s);
}

// Blocked copy: no grid-stride loop; each block copies its own tile of
// blockDim x DEPTH 16-byte words, DEPTH loads in flight per thread, and the
// grid covers the array once (many waves, as an elementwise framework kernel).
template <int DEPTH>
__device__ void copy_tile(const uint4* __restrict__ a, uint4* __restrict__ b, long long n) {
    long long base = (long long)blockIdx.x * blockDim.x * DEPTH + threadIdx.x;
    uint4 v[DEPTH];
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
        long long i = base + (long long)u * blockDim.x;
        if (i < n) v[u] = a[i];
    }
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
        long long i = base + (long long)u * blockDim.x;
        if (i < n) b[i] = v[u];
    }
}
extern "C" __global__ void copy_tile4_w16(const uint4* a, uint4* b, long long n) { copy_tile<4>(a, b, n); }
extern "C" __global__ void copy_tile8_w16(const uint4* a, uint4* b, long long n) { copy_tile<8>(a, b, n); }
