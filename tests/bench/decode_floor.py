"""Where a decode GEMV's time goes, on the GPU node: the weight's bytes against what a pure read of
them costs, timed alike (CUDA events around the launch, the L2 evicted by a read first, the median).

    python tests/bench/decode_floor.py --json floor.json [--stages-left-out]

Times, at M = 1 and 16 and K = 4096 over N = 1024 .. 28672: an empty kernel (what the events alone
measure), a read of the weight's bytes by a grid-stride kernel at three grid sizes (the floor), the
decode kernel's first settings, and cuBLAS (`F.linear`). With --stages-left-out, variants of
gemv.cuh that leave a stage out instead (their results are not valid, only their times):
`noreduce` stores each part and skips the fence, the ticket and the read back; `noA` loads no A
(a constant instead); `noA+noreduce` both. And two candidate changes, valid (validated at N =
4096): `chunked` reads the parts back four at a time, `onefence` fences once a CTA, after its
barrier, instead of once a thread before it. docs/performance.md says what they showed."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aicg import codegen as aicg_codegen, nvrtc  # noqa: E402
from aicg.matrix import build, codegen, space, timing, worker  # noqa: E402
from aicg.matrix.problem import Problem  # noqa: E402
from aicg.runtime import driver  # noqa: E402

K = 4096
REGISTERS_PER_SM = 65536
NS = (1024, 2048, 4096, 6144, 8192, 14336, 28672)
READ_SOURCE = r"""
extern "C" __global__ void read_bytes(const uint4* p, long long n, unsigned* sink) {
  unsigned f = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
    f ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride) { uint4 a = __ldg(p + i); f ^= a.x; }
  if (f == 0x9e3779b9u) *sink = f;   // never true for the bytes written: the loads stay
}
extern "C" __global__ void empty_kernel() {}
"""
SETTINGS = (dict(warps=4, tiles=2, unroll=8, ring=0, spread="splits"),
            dict(warps=4, tiles=2, unroll=8, ring=0, spread="even"),
            dict(warps=8, tiles=2, unroll=4, ring=0, spread="splits"),
            dict(warps=4, tiles=1, unroll=8, ring=4, spread="even"),
            dict(warps=4, tiles=1, unroll=8, ring=0, spread="warps"),
            dict(warps=8, tiles=1, unroll=8, ring=0, spread="warps"))
# gemv.cuh's lines a variant replaces, and with what
A_LOADS = ("const uint4 lo = (k_ok && a_lo) ? load_shared_input_16(a_lo_row + kk) : zero;",
           "const uint4 hi = (k_ok && a_hi) ? load_shared_input_16(a_hi_row + kk) : zero;")
A_CONSTANT = ("const uint4 lo = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);",
              "const uint4 hi = lo;")
REDUCE_START = "  __threadfence();\n  __syncthreads();\n  // Every thread"
# The read back, one part after the other: each part's loads wait for the previous part's adds.
READ_BACK = """    for (int p = first_part; p < first_part + parts; ++p) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = r + 8 * (e / 2), cc = col + e % 2;
        if (row < m && cc < n) sum[e] += __ldcg(part_at(p, row, cc));
      }
    }
"""
# ... in chunks of four parts, their loads issued together, then added in the same order (the same bits)
READ_BACK_CHUNKED = """    const int end = first_part + parts;
    for (int p0 = first_part; p0 < end; p0 += 4) {
      float v[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = r + 8 * (e / 2), cc = col + e % 2;
          v[j][e] = (p0 + j < end && row < m && cc < n) ? __ldcg(part_at(p0 + j, row, cc)) : 0.0f;
        }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (p0 + j < end) sum[e] += v[j][e];
    }
"""
# Every thread fences its own stores before the barrier; instead thread 0 alone, after it (the
# barrier orders the CTA's stores before thread 0's fence, which then covers them: the pattern of
# CUTLASS's split-K semaphore).
FENCE_ALL = """  __threadfence();
  __syncthreads();
  // Every thread read the previous part's verdict before the barrier above, so thread 0 may
  // overwrite it (the even spread publishes up to two parts a CTA).
  __shared__ unsigned last;
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == parts - 1;
"""
FENCE_ONE = """  __syncthreads();
  __shared__ unsigned last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(ticket, 1u) == parts - 1;
  }
"""
# what a variant leaves out makes its results wrong (timed only); the others stay valid (validated too)
VARIANTS = ("base", "noreduce", "noA", "noA+noreduce", "chunked", "onefence", "chunked+onefence")
VALID_VARIANTS = ("base", "chunked", "onefence", "chunked+onefence")


def median_us(launch, flush, repetitions=30) -> float:
    return timing.median_seconds(launch, flush, repetitions)["median_seconds"] * 1e6


def floor(out: dict, flush, sms: int, compute_capability: tuple[int, int]) -> None:
    major, minor = compute_capability
    cubin, _, _ = nvrtc.compile_cubin(READ_SOURCE, "decode_floor.cu", {}, f"sm_{major}{minor}")
    read, empty = driver.Kernel(cubin, "read_bytes"), driver.Kernel(cubin, "empty_kernel")
    sink = driver.Buffer(4)
    out["empty_us"] = median_us(lambda: empty.launch(1, 32, [], 0), flush, 50)
    for n in NS:
        nbytes = n * K * 2
        buffer = driver.Buffer(nbytes)
        buffer.fill_byte(1)
        for blocks, threads in ((sms * 4, 512), (sms * 8, 256), (sms * 16, 256)):
            args = [(buffer.ptr, "ptr"), (nbytes // 16, "i64"), (sink.ptr, "ptr")]
            us = median_us(lambda: read.launch(blocks, threads, args, 0), flush)
            out["read"].append({"bytes": nbytes, "blocks": blocks, "threads": threads, "us": us})
            print("read", out["read"][-1], flush=True)
        buffer.free()


def variant_header(text: str, variant: str) -> str:
    """gemv.cuh's text with the stages `variant` leaves out taken out."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    if "noA" in variant:
        for line, constant in zip(A_LOADS, A_CONSTANT):
            if line not in text:
                raise ValueError(f"gemv.cuh no longer has {line!r}: the noA variant needs updating")
            text = text.replace(line, constant)
    if "noreduce" in variant:
        if REDUCE_START not in text:
            raise ValueError("gemv.cuh's reduction no longer starts as the noreduce variant expects")
        text = text.replace(REDUCE_START, "  return;\n" + REDUCE_START)
    for name, old, new in (("chunked", READ_BACK, READ_BACK_CHUNKED), ("onefence", FENCE_ALL, FENCE_ONE)):
        if name in variant.split("+"):
            if text.count(old) != 1:
                raise ValueError(f"gemv.cuh no longer has the lines the {name} variant replaces")
            text = text.replace(old, new)
    return text


def gemv_variant(knobs: dict, variant: str, compute_capability: tuple[int, int] = (9, 0)):
    """The realisation and its build with `variant`'s header. A variant that takes more registers
    than the header as it is is held to as many (a launch bound asking for the CTAs an SM then
    holds), so that the two differ in what the variant changes and not in their occupancy."""
    real = space.realisation("gemv", "bfloat16", "k", "k", **knobs)
    arch, src = build.arch_for(real, compute_capability), codegen.source(real)
    base = build.compile_realisation(real, arch)
    if variant == "base":
        return real, base
    headers = build.headers(real)
    headers["matrix/gemv.cuh"] = variant_header(headers["matrix/gemv.cuh"].decode(), variant).encode()
    built = build.compile_source(real, src, f"{real.name}.cu", headers, arch)
    # (a report NVRTC's own cache withheld says 0 registers: nothing to hold the variant to)
    if base.report["registers"] and built.report["registers"] > base.report["registers"] \
            and real.settings["spread"] == "splits":
        threads = 32 * real.settings["warps"]
        blocks = REGISTERS_PER_SM // (threads * base.report["registers"])
        built = build.compile_source(real, aicg_codegen.with_min_blocks(src, threads, blocks), f"{real.name}.cu",
                                     headers, arch)
    return real, built


def kernels(out: dict, plan, compute_capability: tuple[int, int]) -> None:
    for knobs, variant in plan:
        real, built = gemv_variant(knobs, variant, compute_capability)
        for n in NS:
            for m in (1, 16):
                problem = Problem(m, n, K, "bfloat16", "k", "k")
                r = worker.run_case(real.as_dict(), built.cubin, problem.as_dict(),
                                    validate=variant in VALID_VARIANTS and n == 4096, repetitions=30)
                rec = {"realisation": real.name, "variant": variant, "registers": built.report.get("registers"),
                       "m": m, "n": n, "grid": r["geometry"]["grid"],
                       "validation": r.get("validation", {}).get("status"),
                       "us": r.get("timing", {}).get("median_seconds", 0) * 1e6}
                out["gemv"].append(rec)
                print(rec, flush=True)


def cublas(out: dict) -> None:
    """F.linear timed as matmul_bench times its peers (the same flush, events and median)."""
    import torch
    sys.path.insert(0, str(Path(__file__).parent))
    from matmul_bench import Peers
    peers = Peers(30, use_compile=False, flush="read")

    def us(fn):
        return peers.time(fn) * 1e6
    for n in NS:
        w = torch.randn(n, K, device="cuda", dtype=torch.bfloat16)
        for m in (1, 16):
            x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
            out["cublas"].append({"m": m, "n": n, "us": us(lambda: torch.nn.functional.linear(x, w))})
            print("cuBLAS", out["cublas"][-1], flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where the figures go")
    p.add_argument("--stages-left-out", action="store_true", help="time gemv.cuh's variants instead")
    args = p.parse_args(argv)
    driver.use_primary_context()
    info = driver.probe_device()
    out = {"device": info.name, "k": K, "method": "CUDA events around the launch, the L2 evicted by a read, median",
           "read": [], "gemv": [], "cublas": []}
    flush = timing.L2Flush("read")
    # a run stopped by its time limit (SIGTERM) still writes what it measured
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        if args.stages_left_out:
            kernels(out, [(SETTINGS[0], v) for v in VARIANTS], info.compute_capability)
        else:
            floor(out, flush, info.sm_count, info.compute_capability)
            cublas(out)
            kernels(out, [(s, "base") for s in SETTINGS], info.compute_capability)
    finally:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
