"""Time an instance's kernels against PyTorch eager, torch.compile and a copy.

    python tests/bench/compare_torch.py build/<instance> [results.json]

Every contender runs on the same inputs in the same process, timed the same
way: CUDA events around the call, the L2 flushed before each repetition,
median of REPS after warm-up. Each aicg output is checked against eager
PyTorch before it is timed. Prints a table; writes the numbers as JSON.
"""
from __future__ import annotations

import datetime
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import aicg

REPS, WARMUP = 30, 5
EPS = 1e-5

EAGER = {
    "softmax": lambda x: torch.softmax(x, -1),
    "row_sum": lambda x: x.sum(-1),
    "row_max": lambda x: x.amax(-1),
    "rmsnorm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
    "layernorm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, EPS),
}
VECTORS = {"rmsnorm": 1, "layernorm": 2}


def median_seconds(fn, flush) -> float:
    for _ in range(WARMUP):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(REPS):
        flush.zero_()
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(samples)


def main(instance_dir: str, out_path: str | None) -> None:
    inst = aicg.load(instance_dir)
    manifest = inst.manifest
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")
    rows = []
    for name, k in sorted(manifest["kernels"].items()):
        op, dtype = k["op"], getattr(torch, k["dtype"])
        compiled = torch.compile(EAGER[op], dynamic=False)
        for shape in manifest["workload"][op]["shapes"]:
            x = torch.randn(shape, device="cuda").to(dtype)
            vec = [torch.rand(shape[-1], device="cuda").add(0.5).to(dtype) for _ in range(VECTORS.get(op, 0))]
            ours = getattr(inst, op)
            ref, got = EAGER[op](x, *vec).double(), ours(x, *vec).double()
            scale = x.double().abs().sum(-1) if op == "row_sum" else ref.abs() + 1
            tol = 1e-5 if k["dtype"] == "float32" else 2e-2
            assert bool(((got - ref).abs() <= tol * scale).all()), f"{name} {shape}: output differs from PyTorch"
            copy_out = torch.empty_like(x)
            moved = (x.numel() + ref.numel() + sum(v.numel() for v in vec)) * x.element_size()
            times = {
                "aicg": median_seconds(lambda: ours(x, *vec), flush),
                "eager": median_seconds(lambda: EAGER[op](x, *vec), flush),
                "compile": median_seconds(lambda: compiled(x, *vec), flush),
                "copy": median_seconds(lambda: copy_out.copy_(x), flush),
            }
            copy_bytes = 2 * x.numel() * x.element_size()
            rows.append({"kernel": name, "candidate": k["candidate"], "shape": shape, "bytes": moved,
                         "seconds": times, "aicg_bytes_per_second": moved / times["aicg"],
                         "copy_bytes_per_second": copy_bytes / times["copy"]})
            r = rows[-1]
            print(f"{name:20s} {str(shape):15s} aicg {times['aicg']*1e6:8.1f} us {r['aicg_bytes_per_second']/1e12:5.2f} TB/s"
                  f" | x eager {times['eager']/times['aicg']:5.2f} | x compile {times['compile']/times['aicg']:5.2f}"
                  f" | copy {r['copy_bytes_per_second']/1e12:5.2f} TB/s | {k['candidate']}", flush=True)
    result = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "instance": manifest["instance"], "rows": rows,
              "method": f"CUDA events, L2 flushed, median of {REPS} after {WARMUP} warm-up"}
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
