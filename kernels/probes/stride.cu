// Coalescing: full-GPU reads of 4-byte words whose warp lanes are `stride`
// words apart. Both kernels read every word of the buffer exactly once, so
// the useful bytes of a launch are the buffer's size whatever the stride;
// only how the lanes' words fall into sectors and lines changes.
//
// `strided_read`: the buffer is cut into tiles of 32 x stride words; in pass
// p (0 .. stride-1) lane l of a warp reads word l * stride + p of its tile.
// A pass sweeps the whole buffer (far larger than L2) before the next begins,
// so a sector fetched for one word is gone before its neighbours are wanted:
// the cost of lanes a stride apart with no reuse.
//
// `row_walk`: one thread per row of `row_words` words, walking its row word
// by word, as a thread-per-row kernel does: lanes are a row apart, and the
// rest of each fetched sector is wanted on the next steps, if the caches
// keep it that long.
//
// Every thread keeps UNROLL independent loads in flight; loads fold into a
// value written only when it equals a key no input produces, so all stay live.
#define UNROLL 8
#define BLOCK 256

// Eight blocks of BLOCK threads fill an SM of 2048 threads (registers capped to fit).
#define FULL_SM __launch_bounds__(BLOCK, 8)

extern "C" __global__ void FULL_SM strided_read(const unsigned* __restrict__ a, long long tiles, int stride,
                                                unsigned key, unsigned* sink) {
    long long warps = (long long)gridDim.x * blockDim.x / 32;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    long long tile_words = 32LL * stride;
    unsigned acc = 0;
    for (int pass = 0; pass < stride; ++pass) {
        const unsigned* lane_word = a + (long long)(threadIdx.x & 31) * stride + pass;
        long long t = warp;
        for (; t + (UNROLL - 1) * warps < tiles; t += UNROLL * warps) {
            unsigned v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) v[u] = lane_word[(t + u * warps) * tile_words];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) acc ^= v[u];
        }
        for (; t < tiles; t += warps) acc ^= lane_word[t * tile_words];
    }
    if (acc == key) sink[0] = acc;
}

extern "C" __global__ void FULL_SM row_walk(const unsigned* __restrict__ a, long long rows, int row_words,
                                            unsigned key, unsigned* sink) {
    long long threads = (long long)gridDim.x * blockDim.x;
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    long long row_step = threads * row_words;   // words between a thread's UNROLL rows in flight
    for (; row + (UNROLL - 1) * threads < rows; row += UNROLL * threads) {
        const unsigned* word = a + row * row_words;
#pragma unroll 1
        for (int j = 0; j < row_words; ++j, ++word) {
            unsigned v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) v[u] = word[u * row_step];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) acc ^= v[u];
        }
    }
    for (; row < rows; row += threads)
        for (int j = 0; j < row_words; ++j) acc ^= a[row * row_words + j];
    if (acc == key) sink[0] = acc;
}
