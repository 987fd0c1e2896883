"""Time to the first result of a shape an instance was not tuned for, beside Triton's first call.

    python tests/bench/first_call.py [build/<instance>] [--json out.json]

Each case is a new (operator, dtype, row length) the instance's workload does not hold. The
instance is copied to a fresh directory first, so its JIT cache is empty: the first call plans,
compiles (NVRTC), validates on the device against float64 and launches, as a user's would
(`aicg.load(path)`, tune="explicit": no timing of alternatives before answering); or, where the
predicted best must be compiled and a kernel the instance carries runs the shape, runs the carried
one while the best compiles on a thread. `aicg_settled` is then the time from the first call to the
end of the first call that ran the best (the compile waited for, the next call validating it). The Triton
peer (tests/bench/peers.py) is called for the same shape with an empty TRITON_CACHE_DIR: its
first call compiles the kernel for that block size. Both times run from the call to the result
being on the host side of a synchronize, in one process, on this machine's GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-first-call-")

import torch  # noqa: E402

import aicg  # noqa: E402
import peers  # noqa: E402  (tests/bench, beside this script)
from test_memory_bound import default_instance, this_gpu  # noqa: E402

# Row lengths outside every shipped profile's workload, awkward ones included.
COLUMNS = (1000, 3000, 5120, 12288, 50257)
ROWS = 512
DTYPES = ("float32", "bfloat16")


def inputs(op: str, cols: int, dtype):
    x = torch.randn(ROWS, cols, device="cuda", dtype=dtype)
    extra = [torch.rand(cols, device="cuda", dtype=dtype) + 0.5 for _ in peers.INPUTS[op]]
    return x, extra


def seconds_to_result(call) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance", nargs="?")
    parser.add_argument("--json")
    args = parser.parse_args()
    built = Path(args.instance or default_instance(this_gpu()))
    fresh = Path(tempfile.mkdtemp(prefix="aicg-first-call-")) / built.name
    shutil.copytree(built, fresh, ignore=shutil.ignore_patterns("jit"))
    inst = aicg.load(fresh)
    torch.zeros(1, device="cuda")   # the CUDA context is not the kernel's cost
    cases = []
    for op in [op for op in peers.INPUTS if op in inst.ops]:
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            for cols in COLUMNS:
                x, extra = inputs(op, cols, dtype)
                operator = getattr(inst, op)
                case = {"op": op, "dtype": dtype_name, "shape": [ROWS, cols]}
                seen = len(inst.jit_events)
                try:
                    began = time.perf_counter()
                    case["aicg_first"] = seconds_to_result(lambda: operator(x, *extra))
                    if any("compiling" in e for e in inst.jit_events[seen:]):
                        inst.jit.wait()
                        case["aicg_switch"] = seconds_to_result(lambda: operator(x, *extra))
                    case["aicg_settled"] = time.perf_counter() - began
                    case["aicg_second"] = seconds_to_result(lambda: operator(x, *extra))
                    case["aicg_steps"] = inst.jit_events[seen:]   # what the first call compiled and validated
                    got = operator(x, *extra).double()
                    want, scale = peers.reference(op, x, *extra)
                    case["aicg_error_over_scale"] = float(((got - want).abs() / (scale + 1e-30)).max())
                except Exception as err:   # one case's failure must not hide the others
                    case["aicg_error"] = f"{type(err).__name__}: {err}"
                try:
                    triton_call = peers.triton_call(op, peers.triton_warp_counts(cols)[1])
                    case["triton_first"] = seconds_to_result(lambda: triton_call(x, *extra))
                    case["triton_second"] = seconds_to_result(lambda: triton_call(x, *extra))
                except Exception as err:
                    case["triton_error"] = f"{type(err).__name__}: {err}"
                cases.append(case)
                print(json.dumps(case), flush=True)
    firsts = [c["aicg_first"] for c in cases if "aicg_first" in c]
    settled = [c["aicg_settled"] for c in cases if "aicg_settled" in c]
    tritons = [c["triton_first"] for c in cases if "triton_first" in c]
    summary = {"cases": len(cases), "aicg_failed": sum("aicg_error" in c for c in cases),
               "aicg_first_median": statistics.median(firsts) if firsts else None,
               "aicg_first_worst": max(firsts, default=None),
               "aicg_answered_while_compiling": sum("aicg_switch" in c for c in cases),
               "aicg_settled_median": statistics.median(settled) if settled else None,
               "aicg_settled_worst": max(settled, default=None),
               "triton_first_median": statistics.median(tritons) if tritons else None,
               "triton_first_worst": max(tritons, default=None)}
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                               "date": time.strftime("%Y-%m-%d"), "instance": built.name,
                                               "summary": summary, "cases": cases}, indent=1))
    sys.exit(1 if summary["aicg_failed"] else 0)


if __name__ == "__main__":
    main()
