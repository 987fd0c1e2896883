"""The probes, in the order `doit probe` runs them.

Each probe is a module of this package with:
  NAME     the probe's name (`doit probe:<NAME>`)
  SOURCES  ((file in kernels/probes/, (arch, ...)), ...): what CI compiles, for which targets
  FIGURES  {fact name: unit}: every figure the probe may write to the hwdb
  run(gpu: ProbeGPU) -> ProbeResult
Its doc string says what it measures, how it defeats dead-code elimination,
and which planner input reads its figures.
"""
from __future__ import annotations

import importlib

ORDER = ("attributes", "dram", "working_set", "latency", "stride", "banks", "tensor_cores", "async_copy",
         "launch", "atomics")


def probe(name: str):
    if name not in ORDER:
        raise KeyError(f"unknown probe {name!r}; known: {', '.join(ORDER)}")
    return importlib.import_module(f"{__package__}.{name}")


def all_probes() -> list:
    return [probe(name) for name in ORDER]
