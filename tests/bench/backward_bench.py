"""The backward kernels (aicg/backward/) against PyTorch's, on the GPU node: for each operator,
dtype and shape, the median time of one backward (the input's gradient, and a norm's weight and
bias gradients) by the kernels, by PyTorch eager's autograd and by torch.compile's (Inductor),
each with the L2 flushed before it; the kernels' error against float64 autograd beside eager's;
what the kernels compiled and validated, with times. Writes JSON and prints a table.

    python tests/bench/backward_bench.py --json backward.json [--ops softmax,log_softmax,rmsnorm,layernorm]
        [--dtypes bfloat16] [--shapes 32768x4096,4096x32768] [--reps 20] [--variants aicg,eager,inductor]
        [--candidates] [--work build/backward-bench]

The kernels are planned with the default profile's preservation for this machine's GPU (its
hwdb entry, as `doit build target=auto` finds it), compiled on first use and validated on the
device before they are timed; their cache is kept in --work, so a second run validates nothing.
--candidates times every candidate the ladder offers a shape, not only the one the JIT takes.
A case that fails is recorded with its error and the others go on. The defaults take about two
minutes on an H100 (Inductor's compiles are most of it); run float32 or more shapes as a second call.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aicg import planning as planning_mod  # noqa: E402
from aicg.backward import runtime  # noqa: E402
from aicg.backward.jit import BackwardJit, Chosen  # noqa: E402
from aicg.backward.ops import BY_FORWARD  # noqa: E402

OPS = ("softmax", "log_softmax", "rmsnorm", "layernorm")
VARIANTS = ("aicg", "eager", "inductor")
EPS = 1e-5
WARMUP = 3


def forward(name: str, x, w, b):
    """The operator as PyTorch computes it, differentiable."""
    cols = x.shape[-1]
    if name == "softmax":
        return torch.softmax(x, -1)
    if name == "log_softmax":
        return torch.log_softmax(x, -1)
    if name == "rmsnorm":
        return F.rms_norm(x, (cols,), w, EPS)
    return F.layer_norm(x, (cols,), w, b, EPS)


def leaves_of(name: str, x, w, b) -> tuple:
    return {"softmax": (x,), "log_softmax": (x,), "rmsnorm": (x, w), "layernorm": (x, w, b)}[name]


def make_inputs(rows: int, cols: int, dtype, seed: int = 0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, cols, device="cuda", generator=generator) * 2 + 1).to(dtype).requires_grad_()
    w = (torch.rand(cols, device="cuda", generator=generator) + 0.5).to(dtype).requires_grad_()
    b = torch.randn(cols, device="cuda", generator=generator).to(dtype).requires_grad_()
    g = torch.randn(rows, cols, device="cuda", generator=generator).to(dtype)
    return x, w, b, g


def median_ms(work, reps: int, flush: torch.Tensor) -> float:
    """Median device time of `work()` in milliseconds, after warm-up, the L2 flushed before each."""
    for _ in range(WARMUP):
        work()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        flush.zero_()
        start.record()
        work()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def relative_error(found: tuple, expected: tuple) -> float:
    """The worst normwise relative error over the gradients."""
    return max(float((f.double() - e).norm() / e.norm().clamp_min(1e-30)) for f, e in zip(found, expected))


def moved_bytes(name: str, rows: int, cols: int, size: int) -> int:
    """What a backward moves at the least: g and the saved matrix read, dx written, w read."""
    return (3 * rows * cols + (cols if name in ("rmsnorm", "layernorm") else 0)) * size


def bench_case(name: str, dtype, rows: int, cols: int, variants, reps: int, flush, jit: BackwardJit,
               every_candidate: bool) -> dict:
    dtype_name = str(dtype).rsplit(".", 1)[-1]
    case = {"op": name, "dtype": dtype_name, "shape": [rows, cols], "bytes": moved_bytes(name, rows, cols, dtype.itemsize)}
    x, w, b, g = make_inputs(rows, cols, dtype)
    leaves = leaves_of(name, x, w, b)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    expected = torch.autograd.grad(forward(name, xd, wd, bd), leaves_of(name, xd, wd, bd), g.double())
    y = forward(name, x, w, b)
    op = BY_FORWARD[name]
    saved = y.detach() if op.saved == "y" else x.detach()
    timings = case.setdefault("ms", {})
    errors = case.setdefault("error", {})
    failures = case.setdefault("failed", {})

    def attempt(variant: str, run) -> None:
        try:
            found = run()
            if found is not None:
                timings[variant] = found
        except Exception:
            failures[variant] = traceback.format_exc(limit=3)

    def eager() -> float:
        errors["eager"] = relative_error(torch.autograd.grad(y, leaves, g, retain_graph=True), expected)
        return median_ms(lambda: torch.autograd.grad(y, leaves, g, retain_graph=True), reps, flush)

    def inductor() -> float:
        torch._dynamo.reset()
        compiled = torch.compile(lambda *t: forward(name, *t), dynamic=False)
        began = time.perf_counter()
        yc = compiled(x, w, b)
        grads = torch.autograd.grad(yc, leaves, g, retain_graph=True)
        torch.cuda.synchronize()
        case["inductor_compile_seconds"] = time.perf_counter() - began
        errors["inductor"] = relative_error(grads, expected)
        return median_ms(lambda: torch.autograd.grad(yc, leaves, g, retain_graph=True), reps, flush)

    def kernels(candidate=None):
        def run() -> float | None:
            if candidate is None:
                chosen = jit.kernel_for(op.name, dtype_name, rows, cols)
            else:
                chosen = jit.kernels_of(candidate, rows, cols)
            if not isinstance(chosen, Chosen):
                failures[f"aicg {candidate.id}" if candidate else "aicg"] = f"declined: {chosen}"
                return None
            loaded = runtime.load(chosen, x.device.index or 0)
            call = lambda: runtime.launch(jit.space, chosen.candidate, loaded, g, saved, w.detach(), eps=EPS,
                                          weight_grads=True)
            found = tuple(t for t in call() if t is not None)
            label = "aicg" if candidate is None else f"aicg {chosen.candidate.id}"
            errors[label] = relative_error(found, expected)
            case.setdefault("candidates", {})[label] = chosen.candidate.id
            return median_ms(call, reps, flush)
        return run

    if "aicg" in variants:
        attempt("aicg", kernels())
        if every_candidate:
            for candidate in jit.candidates(op.name, dtype_name, rows, cols):
                attempt(f"aicg {candidate.id}", kernels(candidate))
    if "eager" in variants:
        attempt("eager", eager)
    if "inductor" in variants:
        attempt("inductor", inductor)
    case["gb_per_s"] = {k: case["bytes"] / (ms * 1e-3) / 1e9 for k, ms in timings.items()}
    return case


def table(cases: list[dict]) -> str:
    lines = [f"{'op':12s} {'dtype':9s} {'shape':>12s} {'aicg us':>9s} {'eager us':>9s} {'inductor us':>11s} "
             f"{'vs eager':>8s} {'vs ind.':>8s} {'err aicg':>9s} {'err eager':>9s}"]
    for c in cases:
        ms = c["ms"]
        us = {k: ms[k] * 1e3 for k in ms}
        ratio = lambda k: f"{ms[k] / ms['aicg']:.2f}x" if k in ms and "aicg" in ms else "-"
        cell = lambda k, width: f"{us[k]:{width}.1f}" if k in us else f"{'-':>{width}s}"
        err = lambda k: f"{c['error'][k]:9.2e}" if k in c["error"] else f"{'-':>9s}"
        lines.append(f"{c['op']:12s} {c['dtype']:9s} {'x'.join(map(str, c['shape'])):>12s} {cell('aicg', 9)} "
                     f"{cell('eager', 9)} {cell('inductor', 11)} {ratio('eager'):>8s} {ratio('inductor'):>8s} "
                     f"{err('aicg')} {err('eager')}")
        for variant, why in c["failed"].items():
            lines.append(f"    {variant}: {why.strip().splitlines()[-1]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--shapes", default="32768x4096,4096x32768")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--candidates", action="store_true", help="time every candidate the ladder offers a shape")
    parser.add_argument("--profile", type=Path, default=ROOT / "rulesets/profiles/default.toml")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "backward-bench")
    args = parser.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"--ops: {unknown[0]!r} is not one of {', '.join(OPS)}")
    variants = set(args.variants.split(","))
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",") if s]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",") if d]

    began = time.perf_counter()
    planned = planning_mod.load(ROOT / "rulesets", args.profile, ROOT / "hwdb", target="auto")
    jit = BackwardJit(args.work, planned)
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda")
    cases = []
    for name in ops:
        for dtype in dtypes:
            for rows, cols in shapes:
                try:
                    cases.append(bench_case(name, dtype, rows, cols, variants, args.reps, flush, jit, args.candidates))
                except Exception:
                    cases.append({"op": name, "dtype": str(dtype).rsplit(".", 1)[-1], "shape": [rows, cols],
                                  "ms": {}, "error": {}, "failed": {"case": traceback.format_exc(limit=5)}})
                torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(0), "target": planned.hardware.target,
              "profile": str(args.profile.relative_to(ROOT)) if args.profile.is_relative_to(ROOT) else str(args.profile),
              "torch": torch.__version__, "reps": args.reps,
              "method": "CUDA events around one backward, L2 flushed before each, median after warm-up",
              "cases": cases, "jit_events": jit.events, "seconds": time.perf_counter() - began}
    args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"{result['device']} ({result['target']}), torch {torch.__version__}, {result['seconds']:.0f} s")
    print(table(cases))


if __name__ == "__main__":
    main()
