"""Host time per call of an instance's operators, beside PyTorch eager's, on the GPU.

    python tests/bench/host_time.py [build/<instance>] [--shape 1x4096] [--dtype float32] [--calls 200]

Without an instance, the default profile's for this machine's GPU (`doit build target=auto`).

Calls are queued back to back behind a GPU sleep (test_memory_bound.host_seconds), so that none
waits for the device: the time is the host's alone (Python, argument checks, allocating the
output, the launch). The median of five rounds is printed per operator. The aicg imported is the
first on sys.path, so that two checkouts can be compared in one session (PYTHONPATH=checkout).
"""
from __future__ import annotations

import argparse
import statistics

import torch

import aicg
import peers   # tests/bench, beside this script
from test_memory_bound import default_instance, host_seconds, this_gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance", nargs="?")
    parser.add_argument("--shape", default="1x4096")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    rows, cols = (int(n) for n in args.shape.split("x"))
    dtype = getattr(torch, args.dtype)
    inst = aicg.load(args.instance or default_instance(this_gpu()))
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    print(f"aicg from {aicg.__file__}; {args.dtype} {rows}x{cols}, {args.calls} calls a round, median of 5")
    for op, kinds in peers.INPUTS.items():
        if op not in inst.ops:
            continue
        inputs = [torch.randn(rows, cols, device="cuda", dtype=dtype) if kind == "matrix"
                  else torch.rand(cols, device="cuda", dtype=dtype) + 0.5 for kind in kinds]
        ours, theirs = (lambda: getattr(inst, op)(x, *inputs)), (lambda: peers.EAGER[op](x, *inputs))
        ours(), theirs()   # first calls: kernel lookup, module load, the JIT for a new shape
        times = [statistics.median(host_seconds(fn, args.calls) for _ in range(5)) for fn in (ours, theirs)]
        print(f"{op:18s} aicg {times[0] * 1e6:6.1f} us   eager {times[1] * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
