"""How the benchmark's L2 flush changes a timed call: a memset against a read.

    python tests/bench/flush_check.py [--repetitions 20] [--json out.json]

A memset of twice the L2 leaves the L2 full of dirty lines, which the timed
call writes back as its own accesses evict them; a read of the same buffer
leaves clean lines. Times the Triton peers of row sum and softmax and a copy
of the same input, under each flush, alternating the two round by round so
that clock drift falls on both. Prints median µs and the difference.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics

import torch

import peers   # tests/bench, beside this script
from test_memory_bound import device_seconds, l2_flush

CASES = [(op, dtype, shape) for op in ("row_sum", "softmax", "copy")
         for dtype in ("bfloat16", "float32") for shape in ((4096, 32768), (32768, 4096))]


def call_for(op: str, x: torch.Tensor):
    if op == "copy":
        y = torch.empty_like(x)
        return lambda: y.copy_(x)
    warps = peers.triton_warp_counts(x.shape[-1])
    return lambda: peers.triton_call(op, warps[len(warps) // 2])(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    flushes = {mode: l2_flush(mode) for mode in ("write", "read")}
    results = []
    print(f"{'case':34} {'memset µs':>10} {'read µs':>10} {'memset - read':>14}")
    for op, dtype, shape in CASES:
        x = torch.randn(shape, device="cuda").to(getattr(torch, dtype))
        fn = call_for(op, x)
        for _ in range(3):
            fn()
        seconds = {mode: [] for mode in flushes}
        for _ in range(args.repetitions):
            for mode, flush in flushes.items():
                seconds[mode].append(device_seconds(fn, flush))
        median = {mode: statistics.median(s) for mode, s in seconds.items()}
        results.append({"op": op, "dtype": dtype, "shape": list(shape), "median_seconds": median,
                        "seconds": seconds})
        print(f"{op + ' ' + dtype + ' ' + 'x'.join(map(str, shape)):34} {median['write'] * 1e6:10.1f} "
              f"{median['read'] * 1e6:10.1f} {(median['write'] - median['read']) * 1e6:14.1f}", flush=True)
        del x, fn
        torch.cuda.empty_cache()
    if args.json:
        meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size}
        with open(args.json, "w") as f:
            json.dump({**meta, "cases": results}, f, indent=1)


if __name__ == "__main__":
    main()
