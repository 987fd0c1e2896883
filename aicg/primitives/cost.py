"""What a measurement of the lab costs in wall-clock seconds, before it runs.

A budgeted lab run (aicg/primitives/budget.py) sizes its rounds by it, and
the replay of a recorded profile (aicg/primitives/replay.py) advances its
clock by it. One realisation at one row length costs:

- at each launch the lab times there (lab.launches: the full launch and the
  few-row ones), WARMUP + REPETITIONS launches of the kernel
  (validate/check.py's timing) and a fixed host cost per launch shape
  (buffers, the L2 flush, events, the drift runs and their float64
  comparison at that length), HOST_SECONDS_PER_LAUNCH_SHAPE;
- once per realisation, its compile: COMPILE_CPU_SECONDS of one CPU,
  spread over the node's compile workers.

The constants come from the H200 (docs/lab.md): the launches of the recorded
profile (hwdb/nvidia-h200.realisation.json, 3578 realisations, 47868
records) add up to 101 s, 809 s at eight launches each; a full run of the
lab took about 21 minutes with its compiles (docs/lab.md); compiling one
realisation took 0.33 s of one CPU (NVRTC 13.0, measured on a development
machine); the rest, 377 s over 47868 launch shapes, is the host's 7.9 ms
each.
"""
from __future__ import annotations

import os

from ..validate import check
from . import lab

LAUNCHES_PER_SHAPE = check.WARMUP + lab.REPETITIONS
HOST_SECONDS_PER_LAUNCH_SHAPE = 7.9e-3
COMPILE_CPU_SECONDS = 0.33


def compile_workers() -> int:
    """The compile workers of this node (lab.compile_all's default)."""
    return os.cpu_count() or 1


def compile_seconds(realisations: int, workers: int) -> float:
    """Wall-clock seconds to compile `realisations` realisations on `workers` CPUs."""
    return realisations * COMPILE_CPU_SECONDS / max(1, workers)


def measure_seconds(launch_seconds) -> float:
    """Wall-clock seconds to measure one realisation at one row length, from the seconds of one
    launch at each of the lab's launch shapes there."""
    return sum(HOST_SECONDS_PER_LAUNCH_SHAPE + LAUNCHES_PER_SHAPE * s for s in launch_seconds)
