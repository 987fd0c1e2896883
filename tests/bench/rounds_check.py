"""Time one operator of a built instance round by round, as the benchmark times a round (L2 flushed
by a read, a GPU sleep, device events around one call), to see whether a case's slow rounds belong to
the kernel or to the run around it.

    python tests/bench/rounds_check.py [build/<instance>] [--op row_sum] [--shapes 32768x4096] [--rounds 30]

Without an instance, the default profile's for this machine's GPU (`doit build target=auto`).

For each shape, twice: torch.cuda.empty_cache(), a fresh input and a float64 sum of another (as the
benchmark's validation leaves the allocator), then the instance's kernel on the fresh input, on it
again, and PyTorch eager; then once more with eager first on a fresh input and the kernel after it.
Each round is printed as `us@ms since the series began`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aicg  # noqa: E402
import peers  # noqa: E402
from test_memory_bound import default_instance, device_seconds, draw_inputs, l2_flush, this_gpu  # noqa: E402


def series(fn, flush, rounds: int) -> str:
    begin, times = time.perf_counter(), []
    for _ in range(rounds):
        seconds = device_seconds(fn, flush)
        times.append(f"{seconds * 1e6:.0f}@{(time.perf_counter() - begin) * 1e3:.0f}ms")
    return " ".join(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("instance", type=Path, nargs="?")
    parser.add_argument("--op", default="row_sum")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--shapes", default="32768x4096,4096x32768")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    instance = aicg.load(args.instance or default_instance(this_gpu()))
    kernel, flush = getattr(instance, args.op), l2_flush("read")

    def fresh(shape):
        torch.cuda.empty_cache()
        return draw_inputs(args.op, args.dtype, shape)

    def show(label, fn):
        print(label, series(fn, flush, args.rounds), flush=True)

    for shape in (tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")):
        for trial in range(2):
            x, inputs = fresh(shape)
            torch.randn(shape, device="cuda").double().sum(-1)
            show(f"{shape} {trial} aicg, fresh input:", lambda: kernel(x, *inputs))
            show(f"{shape} {trial} aicg, again:", lambda: kernel(x, *inputs))
            show(f"{shape} {trial} eager:", lambda: peers.EAGER[args.op](x, *inputs))
        x, inputs = fresh(shape)
        show(f"{shape} eager first:", lambda: peers.EAGER[args.op](x, *inputs))
        show(f"{shape} aicg after:", lambda: kernel(x, *inputs))
    print("kernels:", instance.ops[args.op].chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
