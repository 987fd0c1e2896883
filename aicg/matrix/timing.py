"""Timing a launch on the device: CUDA events around the launch alone, after
warm-up, the L2 evicted before each repetition, the median of the repetitions.

The L2 is evicted by reading a buffer twice its size (`L2Flush("read")`, the
default): it then holds clean lines, as a model's step leaves it (the weights
the layer before read). A memset of that buffer (`L2Flush("write")`) leaves it
full of dirty lines instead, which the timed launch writes back as its own
reads evict them: a read-only kernel such as a decode GEMV, whose weight is
not much larger than the L2, is then charged up to as many bytes written as it
reads."""
from __future__ import annotations

import numpy as np

from ..runtime import driver

WARMUP = 3
FLUSHES = ("read", "write")
READ_ENTRY = "aicg_l2_flush_read"
# Each thread folds the 16-byte vectors it reads into one word, stored only where it equals a value
# a zeroed buffer cannot give: the loads stay, nothing is written.
READ_SOURCE = r"""
extern "C" __global__ void aicg_l2_flush_read(const uint4* buffer, long long vectors, unsigned* sink) {
  unsigned folded = 0;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    const uint4 v = __ldcg(buffer + i);
    folded ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (folded == 0x9e3779b9u) *sink = folded;
}
"""
READ_THREADS = 512


class L2Flush:
    """Evicts the L2 of the current context's GPU before a timed launch, by a read or a memset of a
    buffer twice its size (see the module's docstring)."""

    def __init__(self, mode: str = "read"):
        if mode not in FLUSHES:
            raise ValueError(f"flush = {mode!r}: expected one of {', '.join(FLUSHES)}")
        info = driver.probe_device()
        if info is None:
            raise RuntimeError("no CUDA GPU on this machine")
        driver.use_primary_context()
        self.mode, self.blocks = mode, 4 * info.sm_count
        self.buffer = driver.Buffer(2 * info.l2_bytes)
        self.buffer.fill_byte(0)
        self.kernel = self.sink = None
        if mode == "read":
            from .. import nvrtc
            major, minor = info.compute_capability
            cubin, _, _ = nvrtc.compile_cubin(READ_SOURCE, "l2_flush.cu", {}, f"sm_{major}{minor}")
            self.kernel = driver.Kernel(cubin, READ_ENTRY)
            self.sink = driver.Buffer(4)

    def run(self, stream: int = 0) -> None:
        if self.kernel is None:
            self.buffer.fill_byte(0, stream)
        else:
            self.kernel.launch(self.blocks, READ_THREADS, [(self.buffer.ptr, "ptr"), (self.buffer.nbytes // 16, "i64"),
                                                           (self.sink.ptr, "ptr")], stream)


def median_seconds(launch, flush: L2Flush, repetitions: int, stream: int = 0, warmup: int = WARMUP) -> dict:
    """{median_seconds, min_seconds, repetitions, method} of `launch()` (which launches on `stream`)."""
    if repetitions < 1:
        raise ValueError(f"repetitions = {repetitions}: time at least one launch")
    for _ in range(warmup):
        launch()
    timer = driver.EventTimer()
    samples = []
    for _ in range(repetitions):
        flush.run(stream)
        samples.append(timer.time(launch, stream) * 1e-3)
    return {"median_seconds": float(np.median(samples)), "min_seconds": float(min(samples)),
            "repetitions": repetitions, "l2_flush": flush.mode,
            "method": f"CUDA events around the launch, L2 evicted by a {flush.mode}, median after warm-up"}
