// The wgmma kernel's units of work: which tiles, and which K slices of them,
// each persistent CTA computes, and where the parts of a tile cut along K
// publish their sums. No device intrinsics: the host compiles this file too
// (tests/test_matrix_host.py) to check the walk against its mirror in
// aicg/matrix/templates/wgmma.py.
#pragma once
#include "matrix/tiles.cuh"

namespace aicg {
namespace matrix {

// Where a tile's parts lie in the workspace, in parts: part 0 at `zero`, part p > 0 at
// `base + p * stride`. (32-bit: the host keeps the workspace under 1 GiB, 2^26 float4s.)
struct PartPlaces {
  int zero, base, stride;

  __device__ __forceinline__ int operator()(int p) const { return p == 0 ? zero : base + p * stride; }
};

// A unit of work: a tile (this CTA's of its cluster) and a run [kb0, kb1) of
// its 64-wide K slices, part `part` of the tile's `parts` (1: the whole K).
// Where the parts of a split tile publish their sums: WgmmaWork::places.
struct WgmmaUnit {
  int tm, tn, kb0, kb1, part, parts;
  // TAIL_STREAM: 2 x the CTA (cluster) whose run holds the tile's first slice, + 1 where that run
  // starts before the tile (its last piece, not its first, holds the tile's part 0)
  int first_run = 0;
};

// The launch's units: output tiles (for clusters, runs of CLUSTER_M
// vertically or CLUSTER_N horizontally adjacent tiles) in grouped order. The
// host computes the same numbers (aicg/matrix/templates/wgmma.py: Work).
//   TAIL_WHOLE   each tile cut into `splits` consecutive K ranges of whole
//                slices (SPLIT_K; 1: uncut), the units dealt to the CTAs in
//                turn: CTA c takes units c, c + G, c + 2 G, ... (G clusters)
//   TAIL_STREAM  whole tiles dealt the same way for all but the last one or
//                two rounds; the tiles left over (between G and 2 G - 1 of
//                them, or all where there are fewer than G) are one stream of
//                K slices, tile after tile, cut into G equal runs, one a CTA:
//                no CTA idles while others finish a last round. A tile that
//                runs cut by the stream is split into the parts the runs make
//                (2 at most where the stream is a round or more).
// CTA c's units are numbered i = 0, 1, ...: `unit(i, ...)` is false past its last.
enum Tail { TAIL_WHOLE = 0, TAIL_STREAM = 1 };

template <int BM, int BN, int CLUSTER_M, int RASTER, int GROUP, int SPLIT_K, int CLUSTER_N = 1, int TAIL = TAIL_WHOLE>
struct WgmmaWork {
  static_assert(TAIL == TAIL_WHOLE || SPLIT_K == 1, "a stream cuts K itself");
  int pair_rows, pair_cols, tiles_n, k_blocks, splits, per_split, total;
  int clusters;                        // G: the CTAs (clusters) walking the units
  int whole_tiles;                     // TAIL_STREAM: tiles dealt whole; the rest are the stream
  // the CTAs the stream is cut over (fewer than G where it is shorter), and its K slices: 32-bit
  // arithmetic (a 64-bit division is a call, whose saved registers would spill the accumulators),
  // which holds while stream_ctas x stream_slices < 2^32 (the host checks: templates/wgmma.py)
  unsigned stream_ctas, stream_slices;

  __device__ __forceinline__ WgmmaWork(int m, int n, int k, int clusters_) : clusters(clusters_) {
    const int tiles_m = (m + BM - 1) / BM;
    pair_rows = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;   // a cluster takes CLUSTER_M tiles down M
    pair_cols = ((n + BN - 1) / BN + CLUSTER_N - 1) / CLUSTER_N;   // or CLUSTER_N across N
    tiles_n = pair_cols * CLUSTER_N;                     // padded to whole clusters
    k_blocks = (k + 63) / 64;
    // at most SPLIT_K parts, none empty: every split holds at least one slice
    per_split = (k_blocks + min(SPLIT_K, k_blocks) - 1) / min(SPLIT_K, k_blocks);
    splits = (k_blocks + per_split - 1) / per_split;
    total = pair_rows * pair_cols * splits;
    if constexpr (TAIL == TAIL_STREAM) {
      const int rounds = total / clusters;
      whole_tiles = total % clusters == 0 ? total : max(0, rounds - 1) * clusters;
      stream_slices = static_cast<unsigned>(total - whole_tiles) * k_blocks;
      stream_ctas = min(static_cast<unsigned>(clusters), stream_slices);
    }
  }

  // The first slice of CTA c's run of the stream (c = stream_ctas: the stream's end).
  __device__ __forceinline__ unsigned run_start(unsigned c) const { return c * stream_slices / stream_ctas; }

  // The CTA whose run holds slice s of the stream.
  __device__ __forceinline__ int run_of(unsigned s) const {
    return static_cast<int>(((s + 1) * stream_ctas + stream_slices - 1) / stream_slices) - 1;
  }

  // Tile t (in grouped order) as this CTA's of its cluster.
  __device__ __forceinline__ void place(int t, unsigned rank, WgmmaUnit& w) const {
    tile_of<RASTER, GROUP>(t, pair_rows, pair_cols, w.tm, w.tn);
    w.tm = w.tm * CLUSTER_M + (CLUSTER_M > 1 ? rank : 0);
    w.tn = w.tn * CLUSTER_N + (CLUSTER_N > 1 ? rank : 0);
  }

  // CTA (cluster) c's unit i, if it has one.
  __device__ __forceinline__ bool unit(int i, int c, unsigned rank, WgmmaUnit& w) const {
    if constexpr (TAIL == TAIL_WHOLE) {
      const int u = c + i * clusters;
      if (u >= total) return false;
      const int t = u / splits;
      w.part = u - t * splits;
      w.parts = splits;
      place(t, rank, w);
      w.kb0 = w.part * per_split;
      w.kb1 = min(k_blocks, w.kb0 + per_split);
      return true;
    } else {
      const int whole = whole_tiles / clusters;   // this CTA's whole tiles (the same for every CTA)
      if (i < whole) {
        w.part = 0;
        w.parts = 1;
        place(c + i * clusters, rank, w);
        w.kb0 = 0;
        w.kb1 = k_blocks;
        return true;
      }
      if (static_cast<unsigned>(c) >= stream_ctas) return false;
      // its run's (i - whole)-th piece: the run cut where tiles end
      const unsigned begin = run_start(c), end = run_start(c + 1), kbs = k_blocks;
      const unsigned s = i == whole ? begin : (begin / kbs + (i - whole)) * kbs;
      if (s >= end) return false;
      const unsigned tile = s / kbs, t0 = tile * kbs;
      place(whole_tiles + static_cast<int>(tile), rank, w);
      w.kb0 = static_cast<int>(s - t0);
      w.kb1 = static_cast<int>(min(end, t0 + kbs) - t0);
      const int first = w.kb0 == 0 ? c : run_of(t0);
      w.first_run = 2 * first + (run_start(first) == t0 ? 0 : 1);
      w.parts = run_of(t0 + kbs - 1) - first + 1;
      w.part = c - first;
      return true;
    }
  }

  // Where the parts of the unit's tile lie in the workspace, in parts:
  // TAIL_WHOLE  [tile][split]
  // TAIL_STREAM [CTA][2]: a run publishes at most its first and its last piece (the pieces
  //             between are whole tiles); a piece is its run's first where the run starts in it,
  //             which every part but the tile's first is.
  __device__ __forceinline__ PartPlaces places(const WgmmaUnit& w, unsigned rank) const {
    if constexpr (TAIL == TAIL_WHOLE) {
      const int zero = (w.tm * tiles_n + w.tn) * splits;
      return {zero, zero, 1};
    } else {
      constexpr int CTAS = CLUSTER_M * CLUSTER_N;
      const int first_cta = (w.first_run >> 1) * CTAS + rank;
      return {first_cta * 2 + (w.first_run & 1), first_cta * 2, 2 * CTAS};
    }
  }

  // Whether CTA (cluster) c has a unit i.
  __device__ __forceinline__ bool has(int i, int c) const {
    if constexpr (TAIL == TAIL_WHOLE) {
      return c + i * clusters < total;
    } else {
      const int whole = whole_tiles / clusters;
      if (i < whole) return true;
      if (static_cast<unsigned>(c) >= stream_ctas) return false;
      const unsigned kbs = k_blocks;
      return i == whole || (run_start(c) / kbs + (i - whole)) * kbs < run_start(c + 1);
    }
  }
};

}  // namespace matrix
}  // namespace aicg
