"""Host time per call of an instance's operators, beside PyTorch eager's, on the GPU.

    python tests/bench/host_time.py build/h200-tolerance [--shape 1x4096] [--dtype float32] [--calls 200]

Calls are queued back to back behind a GPU sleep, so that none waits for the device: the time is
the host's alone (Python, argument checks, allocation of the output, the launch). The median of
five rounds is printed per operator. The aicg imported is the first on sys.path, so that two
checkouts can be compared in one session (PYTHONPATH=other/checkout).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import aicg

SLEEP_CYCLES = 50_000_000   # about 25 ms at the H200's clock: longer than any round's queued calls


def host_seconds(fn, calls: int) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    begin = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = (time.perf_counter() - begin) / calls
    torch.cuda.synchronize()
    return seconds


def eager(op: str, x, w, b):
    return {"softmax": lambda: torch.softmax(x, -1), "row_sum": lambda: x.sum(-1),
            "row_max": lambda: x.amax(-1),
            "rmsnorm": lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6),
            "layernorm": lambda: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)}[op]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance")
    parser.add_argument("--shape", default="1x4096")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    rows, cols = (int(n) for n in args.shape.split("x"))
    dtype = getattr(torch, args.dtype)
    inst = aicg.load(args.instance)
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    w, b = torch.rand(cols, device="cuda", dtype=dtype) + 0.5, torch.randn(cols, device="cuda", dtype=dtype)
    print(f"aicg from {aicg.__file__}; {args.dtype} {rows}x{cols}, {args.calls} calls a round, median of 5")
    for op in ("softmax", "row_sum", "row_max", "rmsnorm", "layernorm"):
        if op not in inst.ops:
            continue
        vectors = {"rmsnorm": (w,), "layernorm": (w, b)}.get(op, ())
        call = getattr(inst, op)
        for fn in (lambda: call(x, *vectors), eager(op, x, w, b)):
            fn()   # first call: kernel lookup, module load
        ours = statistics.median(host_seconds(lambda: call(x, *vectors), args.calls) for _ in range(5))
        theirs = statistics.median(host_seconds(eager(op, x, w, b), args.calls) for _ in range(5))
        print(f"{op:10s} aicg {ours * 1e6:6.1f} us   eager {theirs * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
