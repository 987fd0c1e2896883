"""aicg's memory-bound kernels against their peers, on the GPU.

    AICG_INSTANCE=build/<instance>,build/<instance> AICG_BENCH_JSON=bench.json \\
        python -m pytest -m gpu tests/bench/test_memory_bound.py -k acceptance

AICG_INSTANCE names one instance or several (comma-separated); each operator
runs in the first that has it. Without it, the default profile's instance for
this machine's GPU (`doit build target=auto`: build/h200-tolerance on an H200,
build/h100-sxm-default on an H100; aicg/target.py names them). It runs on any
GPU that hwdb/ has an entry for, and skips on an instance built for another.

pytest-benchmark is the harness; its clock is the device's: every round
flushes the L2, queues a 0.2 ms GPU sleep (the host's launch work happens
while it runs, so it stays out of the figure), records a CUDA event, calls,
records another, and the clock advances by the elapsed device time between
the two events. A case's contenders are timed interleaved: the first of its
tests to run times every round of every selected contender, each round all
of them once, in an order turned on by one each round (interleave.py), and
each contender's test then reports its own rounds. The flush reads a buffer twice the L2's size
(AICG_BENCH_FLUSH=read, the default), so the L2 holds clean lines when the
timed call starts; AICG_BENCH_FLUSH=write flushes by a memset, as runs
before 2026-12-03 did, which leaves the memset's dirty lines for the timed
call to write back (tests/bench/flush_check.py measures the difference).
The host's own time per call is measured apart (calls queued back to back,
no synchronisation) and reported beside it.

Each case (operator, dtype, shape) runs aicg (through `aicg.load`, after a
validation in the same run: fresh random inputs, a NaN-poisoned output, every
element within the instance's tolerance of a float64 result), PyTorch eager,
`torch.compile`, the hand-written Triton peer (best of a few warp counts; see
peers.py) and a copy of the input's bytes. The table printed at the end (and
written to $AICG_BENCH_JSON) gives each as time, TB/s of the bytes the
operator must move, and aicg's ratio to it; the JSON keeps every round's time
as well. Nothing here asserts a time.

Two suites: `acceptance` (32768x4096 and 4096x32768, torch.compile for that
static shape) and `grid` (row lengths 1..65536, row counts 1..4M, one
dynamic-shape torch.compile per operator and dtype).
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from aicg import target as targets

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import aicg  # noqa: E402

import bench_table  # noqa: E402
import interleave  # noqa: E402
from l2 import l2_flush  # noqa: E402,F401  (flush_check.py and rounds_check.py take it from here too)
import peers  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILE = REPO / "rulesets/profiles/default.toml"
pytestmark = pytest.mark.gpu

OPS = ("softmax", "log_softmax", "row_sum", "row_max", "rmsnorm", "layernorm", "bias_gelu_residual",
       "residual_rmsnorm")
ACCEPTANCE_DTYPES = ("float32", "bfloat16")    # the acceptance; the grid adds float16
GRID_DTYPES = ("float32", "bfloat16", "float16")
ACCEPTANCE = ((32768, 4096), (4096, 32768))
GRID_COLS = (1, 32, 128, 1000, 4096, 16384, 65536)
GRID = tuple((min(1 << 22, max(1, (1 << 25) // c)), c) for c in GRID_COLS) + ((1, 4096), (132, 4096), (1, 65536))
CONTENDERS = ("aicg", "eager", "compile", "triton", "copy")
ROUNDS, WARMUP = 20, 3

CASES = [(suite, op, dtype, shape)
         for suite, shapes, dtypes in (("acceptance", ACCEPTANCE, ACCEPTANCE_DTYPES), ("grid", GRID, GRID_DTYPES))
         for op in OPS for dtype in dtypes for shape in shapes]

# (suite, op, dtype, shape) -> {contender: seconds, "bytes": moved, "validation": ...}; conftest.py prints it.
RESULTS: dict[tuple, dict] = {}


class DeviceClock:
    """A clock for pytest-benchmark that advances only by device time measured with events."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = DeviceClock()


def default_instance(hardware) -> Path:
    """Where `doit build target=auto` puts the default profile's instance for `hardware`'s GPU."""
    return Path("build") / targets.instance_of(DEFAULT_PROFILE, hardware.target)


def this_gpu():
    """The hardware record of this machine's GPU, for the scripts beside this file (the tests use the
    device_target fixture); exits saying why where there is none."""
    hardware, reason = targets.gpu_target(REPO / "hwdb", targets.present_device())
    if hardware is None:
        raise SystemExit(reason)
    return hardware


def instance_paths(device_target) -> list[Path]:
    """AICG_INSTANCE's instances, or the default profile's for this GPU."""
    named = os.environ.get("AICG_INSTANCE")
    return [Path(p) for p in named.split(",")] if named else [default_instance(device_target)]


def built_for_another_gpu(manifest: dict, device_target) -> str | None:
    """What the instance was built for, where that is not this machine's GPU; None where it is."""
    built_for = manifest["target"]
    if (built_for["name"], tuple(built_for["compute_capability"])) == (device_target.name,
                                                                       device_target.compute_capability):
        return None
    return built_for["name"]


@pytest.fixture(scope="module")
def instances(device_target):
    paths = instance_paths(device_target)
    missing = [str(p) for p in paths if not (p / "manifest.json").is_file()]
    if missing:
        pytest.skip(f"no instance at {', '.join(missing)} (`doit build target=auto` builds the default one)")
    for p in paths:
        other = built_for_another_gpu(json.loads((p / "manifest.json").read_text()), device_target)
        if other:
            pytest.skip(f"{p} was built for {other}, not this machine's {device_target.name}: "
                        f"build it with `doit build target=auto`")
    return [aicg.load(p, tune="first call") for p in paths]   # a grid shape is timed as a tuned one


FLUSH = os.environ.get("AICG_BENCH_FLUSH", "read")


@pytest.fixture(scope="module")
def flush():
    return l2_flush(FLUSH)


_inputs: dict[tuple, tuple] = {}
_timed: dict[tuple, tuple[dict, dict]] = {}   # the case being timed -> (its calls, its rounds)


def inputs_for(op: str, dtype: str, shape) -> tuple:
    """The case's inputs, drawn once and shared by its contenders (the last case's are freed, with the
    calls that held them)."""
    key = (op, dtype, shape)
    if key not in _inputs:
        _inputs.clear()
        _timed.clear()
        torch.cuda.empty_cache()
        _inputs[key] = draw_inputs(op, dtype, shape)
    return _inputs[key]


def draw_inputs(op: str, dtype: str, shape) -> tuple:
    """(x, the operator's other inputs): random matrices of `shape`, per-column vectors in [0.5, 1.5)."""
    t = getattr(torch, dtype)
    x = torch.randn(shape, device="cuda").to(t)
    return x, [torch.randn(shape, device="cuda").to(t) if kind == "matrix"
               else torch.rand(shape[-1], device="cuda").add(0.5).to(t) for kind in peers.INPUTS[op]]


SLEEP_CYCLES = 400_000   # about 0.2 ms at 2 GHz (longer at a slower clock: it only hides more host work)


def device_seconds(fn, flush) -> float:
    flush()
    torch.cuda._sleep(SLEEP_CYCLES)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def host_seconds(fn, calls: int = 20) -> float:
    """Host time per call, calls queued back to back behind a GPU sleep (so none waits for the device)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(50 * SLEEP_CYCLES)
    begin = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = (time.perf_counter() - begin) / calls
    torch.cuda.synchronize()
    return seconds


def within_tolerance(op, dtype, x, inputs, y, rtol, atol) -> tuple[bool, float]:
    """(every element within atol + rtol * scale of the float64 result, the worst error in units of that bound)."""
    ref, scale = peers.reference(op, x, *inputs)
    bound = atol + rtol * scale
    excess = ((y.double() - ref).abs() / bound)
    worst = float(excess.nan_to_num(nan=math.inf).max())
    return worst <= 1.0, worst


def tolerance(instance, dtype) -> tuple[float, float]:
    tol = instance.manifest["preservation"]["tolerance"][dtype]
    return tol["rtol"], tol["atol"]


def moved_bytes(op, dtype, shape) -> int:
    rows, cols = shape
    size = getattr(torch, dtype).itemsize
    out = rows if op in peers.ROW_OUTPUT else rows * cols
    read = sum(rows * cols if kind == "matrix" else cols for kind in peers.INPUTS[op])
    return (rows * cols + read + out) * size


def contender_call(instance, contender, suite, op, dtype, shape, x, inputs, flush):
    if contender == "aicg":
        kernel = getattr(instance, op)
        return lambda: kernel(x, *inputs)
    if contender == "eager":
        return lambda: peers.EAGER[op](x, *inputs)
    if contender == "compile":
        fn = peers.compiled(op, dynamic=suite == "grid")
        return lambda: fn(x, *inputs)
    if contender == "copy":
        y = torch.empty_like(x)
        return lambda: y.copy_(x)
    # triton: the best of its warp counts, each timed briefly first
    calls = [peers.triton_call(op, w) for w in peers.triton_warp_counts(shape[-1])]
    for call in calls:
        call(x, *inputs)
    best = min(calls, key=lambda call: sorted(device_seconds(lambda: call(x, *inputs), flush) for _ in range(5))[2])
    return lambda: best(x, *inputs)


def case_rounds(session, instance, case: tuple, x, inputs, flush, record) -> tuple[dict, dict]:
    """The case's calls and every round of them, timed interleaved once per case; aicg's not where its
    validation in this run failed (its test, a case's first, validates before asking)."""
    if case not in _timed:
        _timed.clear()
        suite, op, dtype, shape = case
        names = [c for c in interleave.selected(session.items, case, CONTENDERS)
                 if c != "aicg" or record.get("aicg_validation", {}).get("passed", True)]
        calls = {c: contender_call(instance, c, suite, op, dtype, shape, x, inputs, flush) for c in names}
        for fn in calls.values():
            for _ in range(WARMUP):
                fn()
        _timed[case] = calls, interleave.rounds(calls, ROUNDS, lambda fn: device_seconds(fn, flush))
    return _timed[case]


@pytest.mark.benchmark(timer=CLOCK, disable_gc=True, warmup=False)
@pytest.mark.parametrize("contender", CONTENDERS)
@pytest.mark.parametrize("suite, op, dtype, shape", CASES,
                         ids=[f"{s}-{o}-{d}-{r}x{c}" for s, o, d, (r, c) in CASES])
def test_memory_bound(request, benchmark, instances, flush, suite, op, dtype, shape, contender):
    instance = next((i for i in instances if op in i.ops and dtype in i.ops[op].entries), None)
    if instance is None:
        pytest.skip(f"no instance has a {op} kernel for {dtype}")
    x, inputs = inputs_for(op, dtype, shape)
    record = RESULTS.setdefault((suite, op, dtype, shape), {"bytes": moved_bytes(op, dtype, shape)})
    if contender in ("aicg", "triton"):
        # Validated in this run, before timing: a fresh input, a poisoned output.
        fresh = torch.randn(shape, device="cuda").to(getattr(torch, dtype))
        if contender == "aicg":
            out = torch.full((shape[0],) if op in peers.ROW_OUTPUT else shape, math.nan, device="cuda",
                             dtype=fresh.dtype)
            seen = len(instance.jit_events)
            getattr(instance, op)(fresh, *inputs, out=out)
            record["aicg_jit"] = instance.jit_events[seen:]   # what a shape outside the workload compiled, and why
        else:
            out = peers.triton_call(op, peers.triton_warp_counts(shape[-1])[0])(fresh, *inputs)
        rtol, atol = tolerance(instance, dtype)
        ok, worst = within_tolerance(op, dtype, fresh, inputs, out, rtol, atol)
        record[f"{contender}_validation"] = {"passed": ok, "worst_error_in_bounds": worst}
        if contender == "aicg":
            assert ok, f"aicg {op} {dtype} {shape}: error {worst:.3g} times the tolerance"
    calls, rounds = case_rounds(request.session, instance, (suite, op, dtype, shape), x, inputs, flush, record)
    if contender not in rounds:
        pytest.skip(f"{contender} was not timed in this case's rounds")
    seconds = iter(rounds[contender])

    def timed():
        CLOCK.now += next(seconds)

    benchmark.pedantic(timed, rounds=ROUNDS, iterations=1)
    record[contender] = benchmark.stats.stats.median
    record[f"{contender}_rounds"] = list(benchmark.stats.stats.data)
    record[f"{contender}_host"] = host_seconds(calls[contender])
    if contender == "aicg":
        record["aicg_kernel"] = instance.ops[op].chosen.get((dtype, *shape))
    bench_table.write_json(RESULTS, l2_flush=FLUSH)
