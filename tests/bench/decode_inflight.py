"""Why a decode GEMV reads its weight slower than a plain read does, on the GPU node: reads of a
weight's bytes that differ in one thing at a time, timed alike (CUDA events around the launch, the
L2 evicted by a read first, the median).

    python tests/bench/decode_inflight.py --json inflight.json

- `grid`: a grid-stride read, fully coalesced, at several bytes in flight an SM (CTAs an SM x
  threads x 16-byte loads a thread issues before using any);
- `rows`: the decode kernel's pattern without its math (a CTA's warps on 8 rows of W, each warp a
  K range, a lane 16 bytes of one row a step: a warp's load touches 8 rows, 64 bytes each), two
  groups of loads a warp in flight as gemv.cuh keeps them;
- `bulk`: one CTA (or two) an SM, persistent, a producer thread streaming contiguous chunks of
  the weight by bulk copies (cp.async.bulk, sm_90) into a ring of shared-memory stages that the
  other warps read: the bytes in flight set by the ring, not by registers;
- `bulk_gemv`: the last as a GEMV at M = 1 (a warp a row of a chunk, fp32 sums, the warp's lanes
  added by shuffles), validated against float64 before it is timed;
- `realisation`: gemv.cuh's realisations at M = 1 and 16 (the warps and split-K spreads the matmul
  profile builds, and the bulk spread's tried settings), each validated against float64 by the
  matrix validator in an isolated worker before it is timed; also written as matmul_bench's grid
  cases (`cases`, with `device` and `arch`), so tests/bench/matmul_profile.py takes them.

Sizes: K = 4096 and N = 1024, 4096, 6144, 28672 (8.4 to 235 MB of bf16 weight)."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))   # decode_floor, beside it, when loaded as a module

from aicg import nvrtc  # noqa: E402
from aicg.dtypes import DTYPES  # noqa: E402
from aicg.matrix import build, space, timing, worker  # noqa: E402
from aicg.matrix.problem import Problem  # noqa: E402
from aicg.runtime import driver  # noqa: E402
from decode_floor import median_us  # noqa: E402

BF16 = DTYPES["bfloat16"]

K = 4096
NS = (1024, 4096, 6144, 28672)
SOURCE = r"""#include "matrix/mbarrier.cuh"
#include "matrix/tiles.cuh"
__device__ __forceinline__ uint4 ld16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int LOADS>
__device__ void read_grid(const uint4* p, long long n, unsigned* sink) {
  unsigned f = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (LOADS - 1) * stride < n; i += LOADS * stride) {
    uint4 v[LOADS];
#pragma unroll
    for (int j = 0; j < LOADS; ++j) v[j] = ld16(p + i + j * stride);
#pragma unroll
    for (int j = 0; j < LOADS; ++j) f ^= v[j].x ^ v[j].w;
  }
  for (; i < n; i += stride) f ^= ld16(p + i).x;
  if (f == 0x9e3779b9u) *sink = f;
}
extern "C" __global__ void read_grid_2(const uint4* p, long long n, unsigned* s) { read_grid<2>(p, n, s); }
extern "C" __global__ void read_grid_4(const uint4* p, long long n, unsigned* s) { read_grid<4>(p, n, s); }
extern "C" __global__ void read_grid_8(const uint4* p, long long n, unsigned* s) { read_grid<8>(p, n, s); }

// gemv.cuh's warps spread at TILES = 1 without the math: 8 rows a CTA, K cut among the warps
template <int WARPS, int UNROLL>
__device__ void read_rows(const unsigned short* w, int k, unsigned* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = lane % 4, r = lane / 4;
  const int steps = k / 32;
  const int k_begin = warp * steps / WARPS * 32, k_end = (warp + 1) * steps / WARPS * 32;
  const unsigned short* row = w + (long long)(blockIdx.x * 8 + r) * k + 8 * q;
  unsigned f = 0;
  uint4 next[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) next[u] = k_begin + 32 * u < k_end ? ld16(row + k_begin + 32 * u) : make_uint4(0, 0, 0, 0);
  for (int k0 = k_begin; k0 < k_end; k0 += 32 * UNROLL) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = next[u];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int kk = k0 + 32 * UNROLL + 32 * u;
      next[u] = kk < k_end ? ld16(row + kk) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) f ^= v[u].x ^ v[u].w;
  }
  if (f == 0x9e3779b9u) *sink = f;
}
extern "C" __global__ void read_rows_4_8(const unsigned short* w, int k, unsigned* s) { read_rows<4, 8>(w, k, s); }
extern "C" __global__ void read_rows_4_16(const unsigned short* w, int k, unsigned* s) { read_rows<4, 16>(w, k, s); }
extern "C" __global__ void read_rows_8_8(const unsigned short* w, int k, unsigned* s) { read_rows<8, 8>(w, k, s); }

// ---- the bulk-copy ring (mbarrier.cuh's barriers and bulk copy, as gemv.cuh's bulk spread uses them)
using namespace aicg::matrix;

// The CTA's share of `chunks` chunks: [cta chunks / ctas, (cta + 1) chunks / ctas). The producer
// (the last warp's lane 0) keeps STAGES chunks in flight; the WARPS consumer warps each take a
// slice of every chunk (CONSUME: xor its words; or a GEMV's rows), then free the stage.
template <int WARPS, int STAGES, int CHUNK, typename Prologue, typename Consume>
__device__ __forceinline__ void bulk_ring(const char* src, long long chunks, Prologue prologue, Consume consume) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long first = blockIdx.x * chunks / gridDim.x, last = (blockIdx.x + 1) * chunks / gridDim.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) { barrier_init(shared_address(&full[s]), 1); barrier_init(shared_address(&empty[s]), WARPS); }
    barrier_init_fence();
  }
  __syncthreads();
  if (warp == WARPS) {
    if (lane == 0) {
      for (long long c = first; c < last; ++c) {
        const int i = (int)(c - first), s = i % STAGES;
        barrier_wait(shared_address(&empty[s]), ((i / STAGES) & 1) ^ 1);
        barrier_arrive_expect(shared_address(&full[s]), CHUNK);
        bulk_copy(shared_address(ring + s * CHUNK), src + c * CHUNK, CHUNK, shared_address(&full[s]));
      }
    }
    return;
  }
  // the consumers' own set-up (x into shared memory) while the first chunks are in flight
  prologue();
  named_barrier_sync(1, 32 * WARPS);
  for (long long c = first; c < last; ++c) {
    const int i = (int)(c - first), s = i % STAGES;
    barrier_wait(shared_address(&full[s]), (i / STAGES) & 1);
    consume(ring + s * CHUNK, c);
    __syncwarp();
    if (lane == 0) barrier_arrive(shared_address(&empty[s]));
  }
}

template <int WARPS, int STAGES, int CHUNK>
__device__ void read_bulk(const char* src, long long chunks, unsigned* sink) {
  unsigned f = 0;
  const int t = threadIdx.x;
  bulk_ring<WARPS, STAGES, CHUNK>(src, chunks, [] {}, [&](const unsigned char* stage, long long) {
    for (int o = 16 * t; o < CHUNK; o += 16 * 32 * WARPS) {
      const uint4 v = *reinterpret_cast<const uint4*>(stage + o);
      f ^= v.x ^ v.w;
    }
  });
  if (f == 0x9e3779b9u) *sink = f;
}

// y[row] = sum_k x[k] w[row][k] for M = 1, a chunk = CHUNK / (2 k) whole rows of W (K contiguous,
// ldw = k), a warp a row at a time; x in shared memory.
template <int WARPS, int STAGES, int CHUNK>
__device__ void bulk_gemv(const unsigned short* x, const unsigned short* w, float* y, int k, long long chunks) {
  __shared__ __align__(16) unsigned short xs[8192];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows_per_chunk = CHUNK / (2 * k);
  auto load_x = [&] {
    for (int i = threadIdx.x * 8; i < k; i += 32 * WARPS * 8)
      *reinterpret_cast<uint4*>(xs + i) = *reinterpret_cast<const uint4*>(x + i);
  };
  bulk_ring<WARPS, STAGES, CHUNK>(reinterpret_cast<const char*>(w), chunks, load_x,
                                  [&](const unsigned char* stage, long long c) {
    for (int rr = warp; rr < rows_per_chunk; rr += WARPS) {
      const unsigned short* row = reinterpret_cast<const unsigned short*>(stage) + (long long)rr * k;
      float sum = 0.0f;
      for (int kk = lane * 8; kk < k; kk += 256) {
        const uint4 wv = *reinterpret_cast<const uint4*>(row + kk);
        const uint4 xv = *reinterpret_cast<const uint4*>(xs + kk);
        const unsigned wu[4] = {wv.x, wv.y, wv.z, wv.w}, xu[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {   // a bf16 pair's halves, widened by their bits
          sum = fmaf(__uint_as_float(wu[j] << 16), __uint_as_float(xu[j] << 16), sum);
          sum = fmaf(__uint_as_float(wu[j] & 0xffff0000u), __uint_as_float(xu[j] & 0xffff0000u), sum);
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) y[c * rows_per_chunk + rr] = sum;
    }
  });
}

#define READ_BULK(W, S, C) \
  extern "C" __global__ void __launch_bounds__(32 * (W + 1)) read_bulk_##W##_##S##_##C(const char* p, long long n, unsigned* s) { \
    read_bulk<W, S, C * 1024>(p, n, s); }
READ_BULK(4, 4, 16)
READ_BULK(4, 8, 16)
READ_BULK(4, 4, 32)
READ_BULK(4, 6, 32)
READ_BULK(8, 12, 16)
READ_BULK(4, 16, 8)
#define BULK_GEMV(W, S, C) \
  extern "C" __global__ void __launch_bounds__(32 * (W + 1)) bulk_gemv_##W##_##S##_##C( \
      const unsigned short* x, const unsigned short* w, float* y, int k, long long chunks) { \
    bulk_gemv<W, S, C * 1024>(x, w, y, k, chunks); }
BULK_GEMV(4, 4, 32)
BULK_GEMV(4, 6, 32)
BULK_GEMV(8, 3, 64)
BULK_GEMV(4, 3, 64)
"""
READ_GRID = ((4, 128, 4), (4, 256, 4), (4, 512, 4), (8, 256, 4), (4, 512, 8), (16, 256, 2), (8, 256, 8))
READ_ROWS = (("read_rows_4_8", 4), ("read_rows_4_16", 4), ("read_rows_8_8", 8))
READ_BULK = (("read_bulk_4_4_16", 4, 4, 16), ("read_bulk_4_8_16", 4, 8, 16), ("read_bulk_4_4_32", 4, 4, 32),
             ("read_bulk_4_6_32", 4, 6, 32), ("read_bulk_8_12_16", 8, 12, 16), ("read_bulk_4_16_8", 4, 16, 8))
BULK_GEMV = (("bulk_gemv_4_4_32", 4, 4, 32), ("bulk_gemv_4_6_32", 4, 6, 32), ("bulk_gemv_8_3_64", 8, 3, 64),
             ("bulk_gemv_4_3_64", 4, 3, 64))


REALISATIONS = (dict(warps=4, tiles=1, unroll=8, ring=0, spread="warps"),
                dict(warps=4, tiles=2, unroll=8, ring=0, spread="splits"),
                *(dict(t, spread="bulk") for t in (dict(warps=4, tiles=1, unroll=8, ring=8),
                                                   dict(warps=8, tiles=1, unroll=4, ring=8),
                                                   dict(warps=4, tiles=2, unroll=4, ring=8),
                                                   dict(warps=4, tiles=4, unroll=2, ring=8))))


def realisations(out: dict, compute_capability: tuple[int, int]) -> None:
    runner = worker.Runner()
    for knobs in REALISATIONS:
        real = space.realisation("gemv", "bfloat16", "k", "k", **knobs)
        built = build.compile_realisation(real, build.arch_for(real, compute_capability))
        for n in NS:
            for m in (1, 16):
                r = runner.run(real, built.cubin, Problem(m, n, K, "bfloat16", "k", "k"), validate=True,
                               repetitions=30)
                rec = {"kind": "realisation", "kernel": real.name, "m": m, "n": n, "bytes": n * K * 2,
                       "registers": built.report.get("registers"), "grid": r.get("geometry", {}).get("grid"),
                       "validation": r.get("validation", {}).get("status"),
                       "fault": r.get("fault") or r.get("error"),
                       "us": r.get("timing", {}).get("median_seconds", 0) * 1e6}
                out["runs"].append(rec)
                print(rec, flush=True)
                # as matmul_bench writes a grid case, so that matmul_profile.py takes the times into the profile
                out["cases"].append({"stage": "grid", "realisation": real.name, "problem": r.get("problem"),
                                     "validation": {"status": rec["validation"]}, **({"timing": r["timing"]} if "timing" in r else {})})


def compile_source(compute_capability: tuple[int, int]) -> bytes:
    major, minor = compute_capability
    headers = {**nvrtc.include_closure("matrix/mbarrier.cuh", ROOT / "kernels"),
               **nvrtc.include_closure("matrix/tiles.cuh", ROOT / "kernels")}
    cubin, _, _ = nvrtc.compile_cubin(SOURCE, "decode_inflight.cu", headers, f"sm_{major}{minor}")
    return cubin


def run(out: dict, cubin: bytes, sms: int, flush) -> None:
    sink = driver.Buffer(4)
    rng = np.random.default_rng(7)
    x_bits = BF16.encode(rng.standard_normal(K))
    x = driver.Buffer(K * 2)
    x.upload(x_bits)
    for n in NS:
        nbytes = n * K * 2
        w_bits = BF16.encode(rng.standard_normal((n, K)) * 0.05)
        w = driver.Buffer(nbytes)
        w.upload(w_bits)

        def record(kind, name, us, **more):
            out["runs"].append({"kind": kind, "kernel": name, "n": n, "bytes": nbytes, "us": us, **more})
            print(out["runs"][-1], flush=True)

        for per_sm, threads, loads in READ_GRID:
            kernel = driver.Kernel(cubin, f"read_grid_{loads}")
            args = [(w.ptr, "ptr"), (nbytes // 16, "i64"), (sink.ptr, "ptr")]
            record("grid", f"read_grid_{loads}", median_us(lambda: kernel.launch(sms * per_sm, threads, args), flush),
                   ctas=sms * per_sm, threads=threads, in_flight_per_sm=per_sm * threads * loads * 16)
        for name, warps in READ_ROWS:
            kernel = driver.Kernel(cubin, name)
            args = [(w.ptr, "ptr"), (K, "int"), (sink.ptr, "ptr")]
            record("rows", name, median_us(lambda: kernel.launch(n // 8, 32 * warps, args), flush), ctas=n // 8)
        def ring_launches(name, warps, stages, chunk_kib):
            """(kernel, dynamic shared bytes, chunks of the weight, CTAs) of a bulk-ring kernel: one CTA
            an SM, and as many as the SM holds where that is more."""
            kernel = driver.Kernel(cubin, name)
            shared = stages * chunk_kib * 1024
            kernel.allow_shared_bytes(shared)
            per_sm = max(1, kernel.resident_blocks(32 * (warps + 1), shared) // sms)
            return [(kernel, shared, nbytes // (chunk_kib * 1024), ctas) for ctas in sorted({sms, sms * per_sm})]

        for name, warps, stages, chunk_kib in READ_BULK:
            for kernel, shared, chunks, ctas in ring_launches(name, warps, stages, chunk_kib):
                args = [(w.ptr, "ptr"), (chunks, "i64"), (sink.ptr, "ptr")]
                record("bulk", name, median_us(lambda: kernel.launch(ctas, 32 * (warps + 1), args, 0, shared), flush),
                       ctas=ctas, in_flight_per_sm=shared * ctas // sms)
        reference = BF16.decode(w_bits).astype(np.float64) @ BF16.decode(x_bits).astype(np.float64)
        y = driver.Buffer(n * 4)
        for name, warps, stages, chunk_kib in BULK_GEMV:
            for kernel, shared, chunks, ctas in ring_launches(name, warps, stages, chunk_kib):
                args = [(x.ptr, "ptr"), (w.ptr, "ptr"), (y.ptr, "ptr"), (K, "int"), (chunks, "i64")]
                y.fill_byte(0xFF)   # NaN: a row the kernel skips shows
                kernel.launch(ctas, 32 * (warps + 1), args, 0, shared)
                driver.synchronize()
                got = y.download(np.float32, n).astype(np.float64)
                error = float(np.max(np.abs(got - reference) / (np.abs(reference) + 1e-2)))
                valid = bool(np.all(np.isfinite(got))) and error < 1e-3
                us = median_us(lambda: kernel.launch(ctas, 32 * (warps + 1), args, 0, shared), flush)
                record("bulk_gemv", name, us, ctas=ctas, valid=valid, max_relative_error=error)
        y.free()
        w.free()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where the figures go")
    args = p.parse_args(argv)
    driver.use_primary_context()
    info = driver.probe_device()
    gemv = space.realisation("gemv", "bfloat16", "k", "k", **REALISATIONS[0])
    out = {"device": {"name": info.name, "compute_capability": list(info.compute_capability), "sm_count": info.sm_count},
           "arch": build.arch_for(gemv, info.compute_capability), "k": K,
           "method": "CUDA events around the launch, the L2 evicted by a read, median", "runs": [], "cases": []}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        cubin = compile_source(info.compute_capability)
        flush = timing.L2Flush("read")
        empty = driver.Kernel(cubin, "read_grid_2")
        out["empty_us"] = median_us(lambda: empty.launch(1, 32, [(0, "ptr"), (0, "i64"), (0, "ptr")]), flush, 50)
        realisations(out, info.compute_capability)
        run(out, cubin, info.sm_count, flush)
    finally:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
