// Walking one row with `lanes` cooperating threads, V elements per access when
// every row start is aligned for it, one element per access otherwise.
#pragma once
#include "aicg_types.cuh"
#include "phases.cuh"
#include "reduce.cuh"

namespace aicg {

// Whether all rows of every given matrix can be read in packs of V: the base
// pointers aligned to the pack size, each row a whole number of packs, and
// every row starting on a pack (`strides`: the input row strides or-ed
// together; V is a power of two, so the or is a multiple of V exactly when
// each stride is).
template <int V, typename T>
__device__ __forceinline__ bool rows_vectorisable(int cols, int strides, const T* a, const T* b = nullptr,
                                                  const T* c = nullptr, const T* d = nullptr) {
  if (V == 1) return false;
  const unsigned long long mask = sizeof(T) * V - 1;
  const unsigned long long bits = (unsigned long long)a | (unsigned long long)b |
                                  (unsigned long long)c | (unsigned long long)d;
  return cols % V == 0 && strides % V == 0 && (bits & mask) == 0;
}

// Loads issued before the first of them is used: enough bytes in flight per
// thread to cover DRAM latency at the occupancies the planner picks. Each
// lane still meets its elements in increasing order, so results do not
// depend on UNROLL. (Issuing the next group's loads before consuming this
// one's was tried: softmax bfloat16 at 128 threads went from 32 to 96
// registers, and float32 softmax holding rows of 32768 at 1024 threads spilled.)
constexpr int UNROLL = 4;

// consume(group, i) for the lane's whole groups of packs (pack i + u * lanes
// in group[u]), in order; returns the first pack left to a tail loop.
template <int V, typename T, typename C>
__device__ __forceinline__ int each_group(const T* __restrict__ row, int packs, int lane, int lanes, C&& consume) {
  int i = lane;
  for (; i + (UNROLL - 1) * lanes < packs; i += UNROLL * lanes) {
    Pack<T, V> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) p[u] = load_pack<V>(row + (long long)(i + u * lanes) * V);
    consume(p, i);
  }
  return i;
}

// f(j, x_j) for every element j of the row that this lane owns.
template <int V, typename T, typename F>
__device__ __forceinline__ void for_each(const T* __restrict__ row, int cols, int lane, int lanes,
                                         bool vectorised, F&& f) {
  if (V > 1 && vectorised) {
    const int packs = cols / V;
    int i = each_group<V>(row, packs, lane, lanes, [&](const Pack<T, V> (&p)[UNROLL], int first) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int k = 0; k < V; ++k) f((first + u * lanes) * V + k, to_float(p[u].v[k]));
    });
    for (; i < packs; i += lanes) {
      const Pack<T, V> p = load_pack<V>(row + (long long)i * V);
#pragma unroll
      for (int k = 0; k < V; ++k) f(i * V + k, to_float(p.v[k]));
    }
  } else {
    int j = lane;
    for (; j + (UNROLL - 1) * lanes < cols; j += UNROLL * lanes) {
      T v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = row[j + u * lanes];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) f(j + u * lanes, to_float(v[u]));
    }
    for (; j < cols; j += lanes) f(j, to_float(row[j]));
  }
}

// A pack of a per-column vector (w, b), which every row reads again, asked to stay in the L2
// (evict_last) while the rows stream through it: on the H200, layernorm bfloat16 t512 c8 ran
// 150.7 us at 4096x32768 with plain loads, 140.6 with the hint (its w and b are 128 KiB).
// Packs are the families' vec_bytes, 4 or 16 (rulesets/families.toml).
template <int V, typename T>
__device__ __forceinline__ Pack<T, V> load_column_pack(const T* __restrict__ p) {
  constexpr int BYTES = sizeof(Pack<T, V>);
  if constexpr (BYTES == 16 || BYTES == 4) {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    unsigned u[BYTES / 4];
    if constexpr (BYTES == 16) {
      asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p), "l"(policy));
    } else {
      asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(u[0]) : "l"(p), "l"(policy));
    }
    Pack<T, V> pack;
    memcpy(&pack, u, BYTES);
    return pack;
  } else {
    return load_pack<V>(p);
  }
}

// A per-column vector (w, b) is given to store() as a pointer, never null, or as the literal
// nullptr where the family has none, so that whether it is read is known when the kernel is
// compiled (HAS_W, HAS_B below): a null test at run time made ptxas branch around each vector's
// load and wait for it before the next one (layernorm bfloat16 t512 c4: w, then b, each a full
// memory latency after the row's reductions).
template <typename P> struct is_vector { enum { value = 1 }; };
template <> struct is_vector<decltype(nullptr)> { enum { value = 0 }; };
template <typename T> __device__ __forceinline__ const T* vector_pointer(const T* p) { return p; }
template <typename T> __device__ __forceinline__ const T* vector_pointer(decltype(nullptr)) { return nullptr; }

// y_j = g(j, x_j, w_j, b_j) for the V elements from `at`, x_j given as floats; g sees 1 for w_j
// and 0 for b_j where the family has no such vector (HAS_W, HAS_B false: the pointer is not read).
template <int V, bool HAS_W, bool HAS_B, typename T, typename G>
__device__ __forceinline__ Pack<T, V> map_floats(const float (&x)[V], const T* __restrict__ w,
                                                 const T* __restrict__ b, long long at, G& g) {
  Pack<T, V> pw, pb;
  if constexpr (HAS_W) pw = load_column_pack<V>(w + at);
  if constexpr (HAS_B) pb = load_column_pack<V>(b + at);
  float y[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    y[k] = g((int)at + k, x[k], HAS_W ? to_float(pw.v[k]) : 1.0f, HAS_B ? to_float(pb.v[k]) : 0.0f);
  }
  return pack_floats<T, V>(y);
}

template <int V, bool HAS_W, bool HAS_B, typename T, typename G>
__device__ __forceinline__ Pack<T, V> map_pack(const Pack<T, V>& px, const T* __restrict__ w,
                                               const T* __restrict__ b, long long at, G& g) {
  float x[V];
#pragma unroll
  for (int k = 0; k < V; ++k) x[k] = to_float(px.v[k]);
  return map_floats<V, HAS_W, HAS_B>(x, w, b, at, g);
}

template <int V, bool HAS_W, bool HAS_B, typename T, typename G>
__device__ __forceinline__ void map_row_columns(const T* __restrict__ x, const T* __restrict__ w,
                                                const T* __restrict__ b, T* __restrict__ y, int cols,
                                                int lane, int lanes, bool vectorised, G&& g) {
  if (V > 1 && vectorised) {
    const int packs = cols / V;
    int i = each_group<V>(x, packs, lane, lanes, [&](const Pack<T, V> (&px)[UNROLL], int first) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const long long at = (long long)(first + u * lanes) * V;
        store_pack<V>(y + at, map_pack<V, HAS_W, HAS_B>(px[u], w, b, at, g));
      }
    });
    for (; i < packs; i += lanes) {
      const long long at = (long long)i * V;
      store_pack<V>(y + at, map_pack<V, HAS_W, HAS_B>(load_pack<V>(x + at), w, b, at, g));
    }
  } else {
    int j = lane;
    for (; j + (UNROLL - 1) * lanes < cols; j += UNROLL * lanes) {
      T v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = x[j + u * lanes];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int at = j + u * lanes;
        y[at] = from_float<T>(g(at, to_float(v[u]), HAS_W ? to_float(w[at]) : 1.0f, HAS_B ? to_float(b[at]) : 0.0f));
      }
    }
    for (; j < cols; j += lanes) {
      y[j] = from_float<T>(g(j, to_float(x[j]), HAS_W ? to_float(w[j]) : 1.0f, HAS_B ? to_float(b[j]) : 0.0f));
    }
  }
}

// y_j = g(j, x_j, w_j, b_j) for the lane's elements of the row; w and b are pointers, read, or the
// literal nullptr (is_vector above).
template <int V, typename T, typename W, typename B, typename G>
__device__ __forceinline__ void map_row(const T* x, W w, B b, T* y, int cols, int lane, int lanes,
                                        bool vectorised, G&& g) {
  map_row_columns<V, is_vector<W>::value, is_vector<B>::value>(x, vector_pointer<T>(w), vector_pointer<T>(b), y,
                                                               cols, lane, lanes, vectorised, g);
}

// A row as its sweeps see it: each(f) visits the lane's elements in order,
// store(w, b, y, g) writes y = g(j, x_j, w_j, b_j) (w and b as above). RowStream reads the row
// from memory on every sweep; RowCache reads it once into registers. Both
// visit a lane's elements in the same order, so they give the same bits.
template <int V, typename T>
struct RowStream {
  static constexpr bool in_registers = false;
  const T* row;
  int cols, lane, lanes;
  bool vectorised;
  template <typename F>
  __device__ __forceinline__ void each(F&& f) const {
    for_each<V>(row, cols, lane, lanes, vectorised, f);
    phase_mark(PHASE_SWEEP);
  }
  template <typename W, typename B, typename G>
  __device__ __forceinline__ void store(W w, B b, T* y, G&& g) const {
    map_row<V>(row, w, b, y, cols, lane, lanes, vectorised, g);
    phase_mark(PHASE_WRITE);
  }
};

// Slots hold whole packs (single elements when V == 1); V is a template
// parameter so that every slot index is a compile-time constant and the row
// stays in registers.
// A lane's slots fill in order: it holds its first `held` packs. FULL: every
// lane of the row group holds all CACHE packs (a row of exactly
// lanes * V * CACHE elements), so no slot is tested at all; otherwise each
// loop tests one pack count, not every element's index.
// FLOATS: slots hold floats, so that update() can keep values of no stored
// type (softmax's exp); otherwise they hold the packs as loaded, converted
// at each use: half the slot registers for 16-bit types, and no conversion
// between one load and the next (converting after each load, ptxas reused
// one register set and made each tiny row's load wait for the row before).
template <bool B, typename A, typename C> struct pick { using type = A; };
template <typename A, typename C> struct pick<false, A, C> { using type = C; };

template <int V, int CACHE, typename T, bool FULL, bool FLOATS = false>
struct RowCache {
  static constexpr bool in_registers = true;
  static constexpr int pack = V, packs = CACHE;
  static constexpr bool full = FULL;
  using Element = T;
  using Slot = typename pick<FLOATS, float, T>::type;
  // 16-bit elements held two to a 32-bit word, as loaded: held as separate elements, ptxas gave
  // each its own register (rmsnorm bfloat16 holding 64 elements a lane: 97 registers, 64 as words).
  static constexpr bool PAIRED = sizeof(Slot) == 2 && V % 2 == 0;
  using Held = typename pick<PAIRED, Pack<unsigned, (PAIRED ? V / 2 : V)>, Pack<Slot, V>>::type;
  Held slot[CACHE];
  int cols, lane, lanes, held;

  // Element k of slot u as a float.
  __device__ __forceinline__ float value(int u, int k) const {
    if constexpr (PAIRED) return half_of(slot[u].v[k / 2], k % 2, T{});
    else return to_float(slot[u].v[k]);
  }

  // The first element of slot u (a pack, or one element when V == 1).
  __device__ __forceinline__ int start(int u) const { return (lane + u * lanes) * V; }
  __device__ __forceinline__ bool holds(int u) const { return FULL || u < held; }

  RowCache() = default;
  __device__ __forceinline__ RowCache(const T* row, int cols_, int lane_, int lanes_) { load(row, cols_, lane_, lanes_); }
  // Hold `packed`'s row, its slots converted to floats.
  template <typename Packed>
  __device__ __forceinline__ void convert(const Packed& packed) {
    cols = packed.cols, lane = packed.lane, lanes = packed.lanes, held = packed.held;
#pragma unroll
    for (int u = 0; u < CACHE; ++u)
#pragma unroll
      for (int k = 0; k < V; ++k) slot[u].v[k] = packed.value(u, k);
  }

  // The lane's place in its row group, and how many of its slots the row fills.
  __device__ __forceinline__ void place(int cols_, int lane_, int lanes_) {
    cols = cols_, lane = lane_, lanes = lanes_, held = (cols_ / V - lane_ + lanes_ - 1) / lanes_;
  }

  __device__ __forceinline__ void load(const T* row, int cols_, int lane_, int lanes_) {
    place(cols_, lane_, lanes_);
#pragma unroll
    for (int u = 0; u < CACHE; ++u) {
      if (!holds(u)) continue;
      // as loaded: a held row of floats comes from convert()
      if constexpr (PAIRED) slot[u] = load_pack<V / 2>(reinterpret_cast<const unsigned*>(row + start(u)));
      else slot[u] = load_pack<V>(row + start(u));
    }
  }

  // Hold h = x + r, a residual added to the row, as floats (the bits of adding them at each
  // use).
  __device__ __forceinline__ void load_sum(const T* x, const T* r, int cols_, int lane_, int lanes_) {
    static_assert(FLOATS, "a sum of two rows is held as floats");
    place(cols_, lane_, lanes_);
#pragma unroll
    for (int u = 0; u < CACHE; ++u) {
      if (!holds(u)) continue;
      const Pack<T, V> px = load_pack<V>(x + start(u)), pr = load_pack<V>(r + start(u));
#pragma unroll
      for (int k = 0; k < V; ++k) slot[u].v[k] = to_float(px.v[k]) + to_float(pr.v[k]);
    }
  }

  template <typename F>
  __device__ __forceinline__ void each(F&& f) const {
#pragma unroll
    for (int u = 0; u < CACHE; ++u) {
      if (!holds(u)) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) f(start(u) + k, value(u, k));
    }
    phase_mark(PHASE_SWEEP);
  }

  // Replace every held x_j by f(j, x_j), visiting elements in the order of each().
  template <typename F>
  __device__ __forceinline__ void update(F&& f) {
    static_assert(sizeof(Slot) == sizeof(float), "update() keeps floats: hold a 16-bit row with FLOATS");
#pragma unroll
    for (int u = 0; u < CACHE; ++u) {
      if (!holds(u)) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) slot[u].v[k] = f(start(u) + k, slot[u].v[k]);
    }
    phase_mark(PHASE_SWEEP);
  }

  // update(), each result rounded to the slot's type: a 16-bit row held as loaded keeps values its
  // floats would not have registers for (softmax's exps: rule rounded_intermediates), one more
  // rounding each. Pairs are rounded together, each half on its own, as pack_floats() does.
  template <typename F>
  __device__ __forceinline__ void update_rounded(F&& f) {
#pragma unroll
    for (int u = 0; u < CACHE; ++u) {
      if (!holds(u)) continue;
      if constexpr (PAIRED) {
#pragma unroll
        for (int k = 0; k < V; k += 2) {
          const float lo = f(start(u) + k, value(u, k));   // in element order, as each() visits them
          const float hi = f(start(u) + k + 1, value(u, k + 1));
          slot[u].v[k / 2] = round_pair(lo, hi, T{});
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) slot[u].v[k] = from_float<Slot>(f(start(u) + k, value(u, k)));
      }
    }
    phase_mark(PHASE_SWEEP);
  }

  template <typename W, typename B, typename G>
  __device__ __forceinline__ void store(W w, B b, T* y, G&& g) const {
#pragma unroll
    for (int u = 0; u < CACHE; ++u) {
      if (!holds(u)) continue;
      const int at = start(u);
      float x[V];
#pragma unroll
      for (int k = 0; k < V; ++k) x[k] = value(u, k);
      store_pack<V>(y + at, map_floats<V, is_vector<W>::value, is_vector<B>::value>(x, vector_pointer<T>(w),
                                                                                    vector_pointer<T>(b), at, g));
    }
    phase_mark(PHASE_WRITE);
  }
};

// Rows of at most TINY_ROW elements are held element by element when a thread
// serves several rows (THREAD_PER_8_ROWS), so that all its rows' loads are in
// flight before the first is used (aicg/plan.py models the same bound).
constexpr int TINY_ROW = 4;

// Whether a row object (as a body sees it, by reference) holds its row in registers.
template <typename R> struct held_in_registers { static constexpr bool value = R::in_registers; };
template <typename R> struct held_in_registers<R&> : held_in_registers<R> {};

// body(r) for a row held as `packed` holds it, or, for a body that updates a
// 16-bit row (FLOATS), as floats converted after every load was issued.
template <bool FLOATS, typename Packed, typename Body>
__device__ __forceinline__ void as_held(Packed packed, Body&& body) {
  if constexpr (FLOATS && sizeof(typename Packed::Slot) != sizeof(float)) {
    RowCache<Packed::pack, Packed::packs, typename Packed::Element, Packed::full, true> floats;
    floats.convert(packed);
    body(floats);
  } else {
    body(packed);
  }
}

// A thread's R tiny rows of exactly COLS elements: every row's loads first,
// then body(row, r) for each. COLS is a compile-time constant, so no element
// is tested and a row of one element costs one element's work (held in
// TINY_ROW tested slots, a one-element row took about 115 instructions).
template <int COLS, int R, typename G, bool FLOATS, typename T, typename Body>
__device__ __forceinline__ void each_tiny_row(const T* x, int rows, int x_stride, Body& body) {
  RowCache<1, COLS, T, true> held[R];
#pragma unroll
  for (int u = 0; u < R; ++u)
    if (G::row(u) < rows) held[u].load(x + G::row(u) * x_stride, COLS, 0, 1);
#pragma unroll
  for (int u = 0; u < R; ++u)
    if (G::row(u) < rows) as_held<FLOATS>(held[u], [&](auto& r) { body(G::row(u), r); });
}

// Run body(row) with the row held in registers when CACHE slots per lane
// hold it, streamed from memory otherwise. The choice depends only on cols,
// the row stride and the lane count, so every thread of a row group takes
// the same branch. A kernel of packs (V > 1) streams a row that does not
// allow packs: holding it element by element (CACHE * V strided slots) made
// ptxas spill, or take 90 registers where the packed path takes 56, in
// kernels that never see such a row on their workload.
// A row that fills every slot has a path of its own (FULL, no slot tested), except in a build
// whose launch bound asks for more resident blocks (AICG_MIN_BLOCKS, aicg/occupancy.py): with
// both paths, ptxas took layernorm bfloat16 t512 c8 to 127 registers, the tested path alone to
// 76, and asked for two blocks, to 64 without a spill (both paths: 296 bytes of spill there).
// Elsewhere the path pays: on the H200, log-softmax bfloat16 t256 v4 c8 32768x4096 ran 132.5 us
// with it, 161.7 without; layernorm float32 t1024 c8 4096x32768 308 and 365 us.
#ifndef AICG_MIN_BLOCKS
#define AICG_MIN_BLOCKS 0
#endif
// body(r) for the row held in registers, read from `row` (global or shared memory); then() runs
// once every slot's load is issued and before the body, for a caller that reuses the memory the
// row was read from. UNTESTED_FULL_ROWS: a row of exactly lanes * V * CACHE elements is held with
// no slot tested (RowCache FULL), unless the build asked for two blocks to an SM.
template <int V, int CACHE, bool FLOATS, bool UNTESTED_FULL_ROWS = true, typename T, typename Then, typename Body>
__device__ __forceinline__ void hold_row(const T* row, int cols, int lane, int lanes, Then&& then, Body&& body) {
  if (UNTESTED_FULL_ROWS && AICG_MIN_BLOCKS == 0 && cols == lanes * V * CACHE) {
    const RowCache<V, CACHE, T, true> held(row, cols, lane, lanes);
    then();
    phase_mark(PHASE_SET_UP);
    as_held<FLOATS>(held, body);
  } else {
    const RowCache<V, CACHE, T, false> held(row, cols, lane, lanes);
    then();
    phase_mark(PHASE_SET_UP);
    as_held<FLOATS>(held, body);
  }
}

template <int V, int CACHE, bool FLOATS, typename T, typename Body>
__device__ __forceinline__ void with_row(const T* row, int cols, int lane, int lanes, bool vectorised, Body&& body) {
  if constexpr (CACHE > 0) {
    if ((V == 1 || vectorised) && cols <= lanes * V * CACHE) {
      hold_row<V, CACHE, FLOATS>(row, cols, lane, lanes, [] {}, body);
      return;
    }
  }
  RowStream<V, T> streamed{row, cols, lane, lanes, vectorised};
  phase_mark(PHASE_SET_UP);
  body(streamed);
}

// Staging (STAGED_BLOCK_PER_ROW): the block copies its row into dynamic
// shared memory with asynchronous copies, every pack of the row in flight at
// once and no register holding it, then runs the sweeps on the copy. A row
// costs shared memory instead of registers, so more rows are resident per SM
// and one row's arithmetic overlaps another's loads. Each lane copies exactly
// the packs it later reads (pack lane + k * lanes), so waiting for its own
// copies is enough: no barrier.
extern __shared__ __align__(16) unsigned char staging_buffer[];

// The dynamic shared memory of this launch: the runtime gives a staged kernel
// the row's bytes when the device allows that much, none otherwise.
__device__ __forceinline__ unsigned staging_bytes() {
  unsigned n;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
  return n;
}

// Start copying the lane's packs of `row` into `staged` (pack i to the same place); the copies
// land in the background until wait_for_copies().
template <int V, typename T>
__device__ __forceinline__ void copy_row_async(T* staged, const T* __restrict__ row, int cols, int lane, int lanes) {
  constexpr int BYTES = V * sizeof(T);
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
  for (int i = lane; i < cols / V; i += lanes) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(staged + (long long)i * V);
    const T* from = row + (long long)i * V;
    if constexpr (BYTES == 16) {   // .cg: through L2 only, as the row is read once from memory
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(from) : "memory");
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(to), "l"(from), "n"(BYTES) : "memory");
    }
  }
}

__device__ __forceinline__ void wait_for_copies() { asm volatile("cp.async.wait_all;" ::: "memory"); }

template <int V, typename T>
__device__ __forceinline__ void stage_row(T* staged, const T* __restrict__ row, int cols, int lane, int lanes) {
  copy_row_async<V>(staged, row, cols, lane, lanes);
  wait_for_copies();
}

// Prefetching (PREFETCH_BLOCK_PER_ROW): the grid is as many blocks as the GPU holds at once, and
// block b serves rows b, b + gridDim.x, ... Each row is held in registers, read from its copy in
// shared memory; once a lane's slots are loaded it starts copying its packs of the block's next
// row into the same places, so that row's loads are in flight while this one is reduced and
// written: with one block of 1024 threads to an SM, nothing else overlaps a row's reductions. A
// lane overwrites only packs it has itself just read (its loads come first in its program order,
// and the copy's "memory" clobber keeps them there), so no barrier is needed. The bits are those of
// BLOCK_PER_ROW holding the row: the same lanes meet the same elements in the same order. A row
// that the slots or the shared memory cannot hold is served as BLOCK_PER_ROW serves it.
template <int THREADS, int V, int CACHE, bool FLOATS, typename T, typename Body>
__device__ __forceinline__ void each_row_prefetched(const T* x, int rows, int cols, int x_stride, bool vectorised,
                                                    Body& body) {
  static_assert(V > 1 && CACHE > 0, "a prefetched row is held in registers, in packs");
  const int lane = threadIdx.x;
  long long row = blockIdx.x;
  if (!(vectorised && cols <= THREADS * V * CACHE && (unsigned)cols * sizeof(T) <= staging_bytes())) {
    for (; row < rows; row += gridDim.x) {
      RowStream<V, T> streamed{x + row * x_stride, cols, lane, THREADS, vectorised};
      body(row, streamed);
    }
    return;
  }
  T* staged = reinterpret_cast<T*>(staging_buffer);
  copy_row_async<V>(staged, x + row * x_stride, cols, lane, THREADS);
  for (; row < rows; row += gridDim.x) {
    wait_for_copies();
    const long long next = row + gridDim.x;
    // Through the tested path only: with the untested one as well, ptxas (NVRTC 13.0.88) took
    // rmsnorm float32 t256 c8 from 64 registers to 127 and spilled 388 bytes in layernorm float32 t1024 c8.
    hold_row<V, CACHE, FLOATS, false>(staged, cols, lane, THREADS, [&] {
      if (next < rows) copy_row_async<V>(staged, x + next * x_stride, cols, lane, THREADS);
    }, [&](auto& r) { body(row, r); });
  }
}

// body(row, r) for each row this thread serves, r as with_row gives it
// (FLOATS: as with_row). A thread serving several rows loads all of them
// first when they are tiny; each row still meets its elements in order, so
// the bits are those of one row per thread.
template <int THREADS, int TOPOLOGY, int V, int CACHE, bool FLOATS = false, typename T, typename Body>
__device__ __forceinline__ void each_row(const T* x, int rows, int cols, int x_stride, bool vectorised, Body&& body) {
  using G = RowGroup<THREADS, TOPOLOGY>;
  constexpr int R = G::rows_per_thread;
  phase_mark(PHASE_START);
  if constexpr (R == 1) {
    const long long row = G::row();
    if (row >= rows) return;  // whole row groups leave together: no barrier is skipped
    if constexpr (TOPOLOGY == PREFETCH_BLOCK_PER_ROW) {
      return each_row_prefetched<THREADS, V, CACHE, FLOATS>(x, rows, cols, x_stride, vectorised, body);
    }
    if constexpr (TOPOLOGY == STAGED_BLOCK_PER_ROW && V > 1) {
      if (vectorised && (unsigned)cols * sizeof(T) <= staging_bytes()) {
        T* staged = reinterpret_cast<T*>(staging_buffer);
        stage_row<V>(staged, x + row * x_stride, cols, G::lane(), G::lanes);
        with_row<V, CACHE, FLOATS>(staged, cols, G::lane(), G::lanes, true, [&](auto& r) { body(row, r); });
        return;
      }
    }
    with_row<V, CACHE, FLOATS>(x + row * x_stride, cols, G::lane(), G::lanes, vectorised,
                               [&](auto& r) { body(row, r); });
  } else {
    static_assert(G::lanes == 1, "several rows per thread: one lane per row");
    static_assert(TINY_ROW == 4, "one case per tiny row length");
    switch (cols) {
      case 1: return each_tiny_row<1, R, G, FLOATS>(x, rows, x_stride, body);
      case 2: return each_tiny_row<2, R, G, FLOATS>(x, rows, x_stride, body);
      case 3: return each_tiny_row<3, R, G, FLOATS>(x, rows, x_stride, body);
      case 4: return each_tiny_row<4, R, G, FLOATS>(x, rows, x_stride, body);
    }
    for (int u = 0; u < R; ++u) {
      const long long row = G::row(u);
      if (row < rows) with_row<V, CACHE, FLOATS>(x + row * x_stride, cols, 0, 1, vectorised,
                                                 [&](auto& r) { body(row, r); });
    }
  }
}

}  // namespace aicg
