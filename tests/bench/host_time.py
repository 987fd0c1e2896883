"""Host time per call of an instance's operators, beside PyTorch eager's, on the GPU.

    python tests/bench/host_time.py [build/<instance>] [--shape 1x4096] [--dtype float32] [--calls 200]

Without an instance, the default profile's for this machine's GPU (`doit build target=auto`).

Calls are queued back to back behind a GPU sleep (test_memory_bound.host_seconds), so that none
waits for the device: the time is the host's alone (Python, argument checks, allocating the
output, the launch). Each operator is called directly (`inst.rmsnorm(x, w)`: an eager call) and
through its PyTorch operator (`torch.ops.<namespace>.rmsnorm`: how a compiled graph calls it);
where the instance has matrix kernels, `inst.linear` at its first class's first shape beside
F.linear. The median of five rounds is printed per operator. The aicg imported is the first on
sys.path, so that two checkouts can be compared in one session (PYTHONPATH=checkout).
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
        registered = getattr(getattr(torch.ops, inst.namespace), op).default
        calls = (lambda: getattr(inst, op)(x, *inputs)), (lambda: registered(x, *inputs)), \
            (lambda: peers.EAGER[op](x, *inputs))
        report(op, calls, args.calls)
    matrix = getattr(inst, "matrix", None)
    plain = [c for c in (matrix.classes.values() if matrix is not None else ()) if c.key[1:3] == ("k", "k")
             and c.key[3].name == "plain"]   # F.linear's layouts, no epilogue
    if plain:
        m, n, k = plain[0].entry["shapes"][0]
        dtype = getattr(torch, plain[0].key[0])
        a, w = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(n, k, device="cuda", dtype=dtype)
        registered = getattr(torch.ops, inst.namespace).linear.default
        report(f"linear {m}x{n}x{k}", ((lambda: inst.linear(a, w)), (lambda: registered(a, w)),
                                       (lambda: torch.nn.functional.linear(a, w))), args.calls)


def report(name: str, calls, count: int) -> None:
    """Host microseconds a call of (the instance's operator called directly, through its PyTorch
    operator, eager PyTorch's), each called once first (kernel lookup, module load, a JIT compile)."""
    with torch.no_grad():
        for fn in calls:
            fn()
        times = [statistics.median(host_seconds(fn, count) for _ in range(5)) for fn in calls]
    print(f"{name:18s} aicg {times[0] * 1e6:6.1f} us   its torch.ops operator {times[1] * 1e6:6.1f} us   "
          f"eager {times[2] * 1e6:6.1f} us", flush=True)


if __name__ == "__main__":
    main()
