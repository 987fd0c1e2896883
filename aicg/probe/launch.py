"""Kernel launch overhead: plain launches and launches replayed from a CUDA graph.

An almost empty kernel (kernels/probes/launch.cu; its one store sits behind
a condition no launch meets) is timed four ways: device events around one
launch (what a kernel timed alone pays for being launched: the plan's
launch cost); BATCH launches back to back between two events (the rate a
host thread can issue through cuda-python, host-bound); the host's own cost
per cuLaunchKernel call over that batch; a launch-and-synchronise round trip.
The same BATCH launches captured once into a CUDA graph and replayed give the
per-kernel cost inside a graph.

Read by the planner: `launch_overhead` is the fixed cost every candidate's
predicted time starts from; it decides how much small shapes gain from
fewer, larger launches.
"""
from __future__ import annotations

import time

from ..runtime import driver
from .figures import ProbeResult, figure

NAME = "launch"
SOURCES = (("launch.cu", ("sm_80", "sm_90")),)
FIGURES = {"launch_overhead": "s", "launch_back_to_back": "s", "launch_host_seconds": "s",
           "launch_round_trip": "s", "graph_launch_overhead": "s"}

BATCH = 2000
REPETITIONS = 7


def _graph_of(launch_batch, stream):
    cu = driver._cu()
    driver.check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    launch_batch(stream)
    graph = driver.check(cu.cuStreamEndCapture(stream))
    return graph, driver.check(cu.cuGraphInstantiate(graph, 0))


def run(gpu) -> ProbeResult:
    cu = driver._cu()
    result = ProbeResult()
    kernel = gpu.kernel("launch.cu", "empty")
    sink = gpu.buffer(64)
    args = [(0, "int"), (sink.ptr, "ptr")]

    def batch(stream=0):
        for _ in range(BATCH):
            kernel.launch(1, 32, args, stream)

    device, host, round_trip, alone = [], [], [], []
    batch()
    gpu.synchronize()
    for _ in range(REPETITIONS):
        alone.append(sorted(gpu.time_ms(lambda: kernel.launch(1, 32, args)) * 1e-3 for _ in range(50))[25])
        start = time.perf_counter()
        device.append(gpu.time_ms(batch) * 1e-3 / BATCH)
        host.append((time.perf_counter() - start) / BATCH)
        trips = []
        for _ in range(50):
            start = time.perf_counter()
            kernel.launch(1, 32, args)
            gpu.synchronize()
            trips.append(time.perf_counter() - start)
        round_trip.append(sorted(trips)[len(trips) // 2])
    result.figures += [
        figure("launch_overhead", alone, "s", "device events around one launch of a 1-block no-op kernel, "
               "median of 50"),
        figure("launch_back_to_back", device, "s", f"{BATCH} back-to-back launches of a 1-block no-op kernel "
               "between two device events, per launch (host-bound where the host issues slower)"),
        figure("launch_host_seconds", host, "s", f"host time per cuLaunchKernel call over {BATCH} calls "
               "(cuda-python bindings included)"),
        figure("launch_round_trip", round_trip, "s", "one launch then cuCtxSynchronize, host clock, median of 50"),
    ]

    stream = driver.check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    graph, executable = _graph_of(batch, stream)
    try:
        replay = lambda: driver.check(cu.cuGraphLaunch(executable, stream))  # noqa: E731
        replay()
        driver.check(cu.cuStreamSynchronize(stream))
        samples = [gpu.timer.time(replay, stream) * 1e-3 / BATCH for _ in range(REPETITIONS)]
    finally:
        driver.check(cu.cuGraphExecDestroy(executable))
        driver.check(cu.cuGraphDestroy(graph))
        driver.check(cu.cuStreamDestroy(stream))
    result.figures.append(figure("graph_launch_overhead", samples, "s",
                                 f"{BATCH} launches of the no-op kernel captured in one CUDA graph; event time "
                                 "of a replay, per kernel"))
    gpu.release(sink)
    return result
