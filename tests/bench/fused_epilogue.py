"""Where a fused epilogue's time goes, on the GPU node: the fused case (8192 x 4096 x 4096 bf16,
F.linear weights) on a few wgmma schedules, each with the epilogue built up a term at a time
(nothing, + bias, + residual, + GELU erf, or GELU tanh instead), every kernel validated against
float64 before it is timed; cuBLAS without and with its bias epilogue, eager PyTorch and
torch.compile (default and max-autotune) beside them, timed alike (CUDA events, L2 evicted by a
read, the median).

    python tests/bench/fused_epilogue.py --json fused.json [--m 8192] [--reps 20] [--schedules 0,5]

--schedules picks schedules by their index in SCHEDULES (default: all), --epilogues likewise in
EPILOGUES, --no-peers leaves the peers out and --no-max-autotune torch.compile's max-autotune (its
autotuning takes minutes). --kernels DIR (repeatable) builds each kernel with
that directory's headers, each in turn: an earlier commit's kernels/ timed beside the checkout's. --fitted-gelu
times each GELU(erf) kernel a second time with epilogue.cuh's fitted evaluation (ACT_GELU_ERF_FITTED, which no
realisation names yet), validated against the same float64 reference and bound. --profile times each validated kernel once more,
one repetition after the warm-up, between cuProfilerStart and cuProfilerStop: Nsight Compute then
sees that kernel's launches alone (a few of them, no other kernel's):

    ncu --profile-from-start off -k aicg_matmul --section WarpStateStats --section ComputeWorkloadAnalysis \
        python tests/bench/fused_epilogue.py --json f.json --schedules 0 --epilogues 0,2,3 --no-peers --profile
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from aicg.matrix import build, codegen, space, worker  # noqa: E402
from aicg.matrix.problem import Problem  # noqa: E402
from aicg.matrix.space import Epilogue  # noqa: E402
from aicg.runtime import driver  # noqa: E402
from gelu_fit import fitted_source  # noqa: E402

N, K = 4096, 4096
COMMON = dict(cluster_m=1, raster="m", group=8, split_k=1)
SCHEDULES = (dict(block_m=128, block_n=256, stages=3, schedule="cooperative", store="staged"),
             dict(block_m=128, block_n=256, stages=4, schedule="cooperative", store="direct"),
             dict(block_m=128, block_n=128, stages=4, schedule="pingpong", store="staged"),
             dict(block_m=64, block_n=256, stages=4, schedule="pingpong", store="staged"),
             dict(block_m=128, block_n=256, stages=3, cluster_m=2, schedule="cooperative", store="staged"),
             # pingpong tiles sharing B across a 2-CTA cluster: a CTA's share of the operands a
             # slice is then the cooperative 128 x 256 tile's, and the epilogues still overlap
             dict(block_m=64, block_n=256, stages=4, cluster_m=2, schedule="pingpong", store="staged"),
             dict(block_m=128, block_n=128, stages=4, cluster_m=2, schedule="pingpong", store="staged"),
             dict(block_m=128, block_n=128, stages=5, cluster_m=2, schedule="pingpong", store="staged"),
             dict(block_m=128, block_n=192, stages=3, schedule="cooperative", store="staged"),
             # the sums handed to the producer warpgroup's other warps, which finish them during the next K loop
             dict(block_m=128, block_n=256, stages=3, schedule="cooperative", store="handoff"),
             dict(block_m=256, block_n=128, stages=3, schedule="cooperative", store="handoff"),
             dict(block_m=128, block_n=192, stages=4, schedule="cooperative", store="handoff"),
             dict(block_m=128, block_n=256, stages=3, cluster_m=2, schedule="cooperative", store="handoff"))
EPILOGUES = (Epilogue(), Epilogue(bias=True), Epilogue(bias=True, residual=True),
             Epilogue("gelu_erf", bias=True, residual=True), Epilogue("gelu_tanh", bias=True, residual=True))


def profiled_launch(real, cubin: bytes, problem: Problem) -> None:
    """A validated kernel's launches of one more timed repetition (and its warm-up), alone between
    cuProfilerStart and cuProfilerStop."""
    from cuda.bindings import driver as cu
    cu.cuProfilerStart()
    try:
        worker.run_case(real.as_dict(), cubin, problem.as_dict(), validate=False, repetitions=1)
    finally:
        cu.cuProfilerStop()


def compiled(real, kernels_dir, fitted: bool) -> bytes:
    """The realisation's cubin; `fitted`: with GELU(erf) evaluated by epilogue.cuh's fitted formula."""
    arch = build.arch_for(real, (9, 0))
    if not fitted:
        return build.compile_realisation(real, arch, kernels_dir).cubin
    return build.compile_source(real, fitted_source(codegen.source(real)), f"{real.name}.fitted.cu",
                                build.headers(real, kernels_dir), arch).cubin


def kernels(out: dict, m: int, reps: int, path: str, schedules, epilogues, profile: bool, kernel_dirs,
            fitted_gelu: bool = False) -> None:
    for schedule in schedules:
        knobs = {**COMMON, **schedule}
        for epilogue in epilogues:
            real = space.realisation("wgmma", "bfloat16", "k", "k", epilogue, **knobs)
            problem = Problem(m, N, K, "bfloat16", "k", "k", epilogue)
            evaluations = (False, True) if fitted_gelu and epilogue.activation == "gelu_erf" else (False,)
            for kernels_dir, fitted in ((d, f) for d in kernel_dirs for f in evaluations):
                found = {"realisation": real.name, **({"kernels": str(kernels_dir)} if len(kernel_dirs) > 1 else {}),
                         **({"gelu": "fitted"} if fitted else {})}
                try:
                    cubin = compiled(real, kernels_dir, fitted)
                    r = worker.run_case(real.as_dict(), cubin, problem.as_dict(), validate=True, repetitions=reps)
                except Exception as err:   # reported, and the others go on
                    found["error"] = repr(err)[:500]
                else:
                    timing = r.get("timing", {})
                    if profile and r.get("validation", {}).get("status") == "passed":
                        profiled_launch(real, cubin, problem)
                    found.update(validation=r.get("validation", {}).get("status"),
                                 us=timing.get("median_seconds", 0) * 1e6, tflops=timing.get("tflops"))
                out["aicg"].append(found)
                print(found, flush=True)
                Path(path).write_text(json.dumps(out, indent=1))


def peers(out: dict, m: int, reps: int, path: str, max_autotune: bool = True) -> None:
    """matmul_bench's peers of the fused case (the same tensors, flush, events and median), and plain cuBLAS."""
    from matmul_bench import FUSED_EPILOGUE, Peers
    timer = Peers(reps, use_compile=True, flush="read", max_autotune=max_autotune)
    found = [timer.matmul(Problem(m, N, K, "bfloat16", "k", "k"))]
    found += timer.fused(Problem(m, N, K, "bfloat16", "k", "k", FUSED_EPILOGUE))
    for peer in found:
        out["peers"].append({**peer, **({"us": peer["seconds"] * 1e6} if "seconds" in peer else {})})
        print(out["peers"][-1], flush=True)
    Path(path).write_text(json.dumps(out, indent=1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--m", type=int, default=8192)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--schedules", help="indices into SCHEDULES, comma-separated")
    p.add_argument("--epilogues", help="indices into EPILOGUES, comma-separated")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--no-max-autotune", action="store_true", help="the peers without torch.compile's max-autotune")
    p.add_argument("--fitted-gelu", action="store_true", help="each GELU(erf) kernel also with the fitted evaluation")
    p.add_argument("--profile", action="store_true", help="one more timed run of each valid kernel inside a profiler range")
    p.add_argument("--kernels", action="append", type=Path,
                   help="build each kernel with the headers of this directory (given more than once: with each, "
                        "one after the other; default: the checkout's kernels/)")
    args = p.parse_args(argv)

    def picked(items, indices):
        return [items[int(i)] for i in indices.split(",")] if indices else list(items)
    driver.use_primary_context()
    out = {"problem": f"{args.m}x{N}x{K} bfloat16 kk", "aicg": [], "peers": []}
    kernels(out, args.m, args.reps, args.json, picked(SCHEDULES, args.schedules), picked(EPILOGUES, args.epilogues),
            args.profile, args.kernels or [build.KERNELS_DIR], args.fitted_gelu)
    if not args.no_peers:
        peers(out, args.m, args.reps, args.json, not args.no_max_autotune)


if __name__ == "__main__":
    main()
