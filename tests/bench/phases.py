"""Where a candidate's row time goes: SM cycles between the marks of kernels/phases.cuh, read by
block 0's first and last threads, for the row that block serves.

    python tests/bench/phases.py [--shape 1x4096] [--launches 25] [--flush memset|none] [--kernels DIR] [--target auto] CANDIDATE_ID...

Each candidate is compiled with AICG_PHASES defined (the marks compiled in; without it they are
nothing), launched on the operator's timing inputs (the L2 flushed by a memset of twice its size
before each launch, unless --flush none), and the median over the launches of each step's cycles
is printed: from the kernel's start to the row set up (a held row's loads issued), then each sweep,
reduction and write, in the order the kernel reaches them. A mark's clock is read where the thread
reaches it, so a sweep's cycles include waiting for its loads, and a write's only issuing its stores.
The marks' code can move registers about: compare candidates with each other, not with their
uninstrumented times. Compiled for --target (default auto: this machine's GPU's hwdb entry).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))   # check_candidates, beside this script

from aicg import codegen  # noqa: E402
from aicg import target as targets  # noqa: E402
from aicg.dtypes import DTYPES  # noqa: E402
from aicg.ops import OPERATORS  # noqa: E402
from aicg.runtime import driver  # noqa: E402
from aicg.semantics import ruleset  # noqa: E402
from aicg.validate import check  # noqa: E402
from check_candidates import build, hardware_for, params_of  # noqa: E402

MARKS = 32   # AICG_PHASES: the marks kept a thread
NAMES = {0: "start", 1: "set-up", 2: "sweep", 3: "reduction", 4: "write"}
THREADS = ("first", "last")


def instrumented_source(candidate: str, family, dtype: str, params: dict) -> str:
    return f"#define AICG_PHASES {MARKS}\n" + codegen.source(candidate, family, dtype, params)


def steps(clocks: np.ndarray, kinds: np.ndarray) -> list[tuple[str, int]]:
    """(what each step ends, its cycles) for one thread's marks, the start excluded; the marks end
    where the clocks do (zeroed before the launch)."""
    count = next((k for k in range(1, len(clocks)) if clocks[k] == 0), len(clocks))
    return [(NAMES.get(int(kinds[k]), str(kinds[k])), int(clocks[k] - clocks[k - 1])) for k in range(1, count)]


def measure(candidate: str, shape: tuple[int, int], launches: int, flush: str, kernels_dir: Path,
            rules, hardware, device) -> tuple[dict, dict[str, list[list[tuple[str, int]]]]]:
    """(the compiler's report with the marks, each thread's steps in every launch)."""
    rows, cols = shape
    family_name, dtype, params = params_of(candidate)
    family = rules.families[family_name]
    op = OPERATORS[family.op]
    cubin, report = build(candidate, kernels_dir, rules, hardware, instrumented_source(candidate, family, dtype, params))
    kernel = driver.Kernel(cubin, codegen.ENTRY)
    buffers = check.Buffers(op, DTYPES[dtype], rows, cols)
    runs: dict[str, list] = {who: [] for who in THREADS}
    try:
        with driver.Buffer(2 * device.l2_bytes) as l2:
            buffers.upload(check.timing_inputs(op, DTYPES[dtype], rows, cols, np.random.default_rng()))
            for _ in range(launches):
                kernel.zero_global("aicg_phase_clocks")
                if flush == "memset":
                    l2.fill_byte(0)
                buffers.launch(kernel, params)
                driver.synchronize()
                clocks = kernel.read_global("aicg_phase_clocks", np.int64, 2 * MARKS).reshape(2, MARKS)
                kinds = kernel.read_global("aicg_phase_kinds", np.int32, 2 * MARKS).reshape(2, MARKS)
                for i, who in enumerate(THREADS):
                    runs[who].append(steps(clocks[i], kinds[i]))
    finally:
        buffers.free()
        kernel.unload()
    return report, runs


def medians(runs: list[list[tuple[str, int]]]) -> tuple[list[str], list[int], int]:
    """The steps of the first launch, the median cycles of each over the launches that took the
    same steps, and how many launches took other steps."""
    names = [name for name, _ in runs[0]]
    same = [r for r in runs if [name for name, _ in r] == names]
    return names, [int(statistics.median(r[k][1] for r in same)) for k in range(len(names))], len(runs) - len(same)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", nargs="+")
    parser.add_argument("--shape", default="1x4096")
    parser.add_argument("--launches", type=int, default=25)
    parser.add_argument("--flush", choices=("memset", "none"), default="memset")
    parser.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    parser.add_argument("--target", default=targets.AUTO)
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split("x"))
    rules = ruleset.load(ROOT / "rulesets")
    device = driver.probe_device()
    if device is None:
        raise SystemExit("no CUDA device here: the marks are read on the GPU")
    hardware = hardware_for(args.target)
    for candidate in args.candidates:
        report, runs = measure(candidate, shape, args.launches, args.flush, args.kernels, rules, hardware, device)
        print(f"{candidate} {shape[0]}x{shape[1]} ({report['registers']} registers with the marks), "
              f"median SM cycles of {args.launches} launches:")
        for who in THREADS:
            names, cycles, other = medians(runs[who])
            print(f"  {who} thread: " + " ".join(f"{n} +{c}" for n, c in zip(names, cycles)) + f" = {sum(cycles)}"
                  + (f" ({other} launches took other steps)" if other else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
