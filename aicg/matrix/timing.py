"""Timing a launch on the device: CUDA events around the launch alone, after
warm-up, the L2 flushed (a memset of twice its size) before each repetition,
the median of the repetitions."""
from __future__ import annotations

import numpy as np

from ..runtime import driver

WARMUP = 3


def median_seconds(launch, flush: driver.Buffer, repetitions: int, stream: int = 0, warmup: int = WARMUP) -> dict:
    """{median_seconds, min_seconds, repetitions} of `launch()` (which launches on `stream`)."""
    if repetitions < 1:
        raise ValueError(f"repetitions = {repetitions}: time at least one launch")
    for _ in range(warmup):
        launch()
    timer = driver.EventTimer()
    samples = []
    for _ in range(repetitions):
        flush.fill_byte(0, stream)
        samples.append(timer.time(launch, stream) * 1e-3)
    return {"median_seconds": float(np.median(samples)), "min_seconds": float(min(samples)),
            "repetitions": repetitions, "method": "CUDA events around the launch, L2 flushed, median after warm-up"}
