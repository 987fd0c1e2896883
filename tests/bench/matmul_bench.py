"""The matrix family on the GPU node, in one call: compile every realisation tried, validate
each against float64 on a single tile, ragged shapes and the timed shapes, time the valid
ones against cuBLAS (torch.matmul, F.linear with its bias epilogue) and, with --compile,
torch.compile (default and mode="max-autotune"); print a compact table last and write the full JSON.

    python tests/bench/matmul_bench.py --json matmul.json [--quick] [--compile]
        [--stages tiny,ragged,square,fused,grid] [--squares 4096,8192] [--square-layouts k,mn]
        [--grid-m 1,16,128,1024,4096,16384]
        [--grid-nk 6144x4096,4096x4096,28672x4096,4096x14336] [--only SUBSTRING,...]
        [--grid-all] [--grid-ranked N] [--grid-pool planned|tried] [--budget SECONDS] [--reps N] [--jobs N] [--flush read|write]

--only keeps the realisations whose name contains any of the comma-separated
substrings (e.g. `--only _staged,pingpong,gemv` for the staged and pingpong
realisations and the decode kernel); --grid-all times every valid K-major
realisation left on every grid shape instead of the best two of the square
stage (split-K ones only where the tiles alone leave SMs idle).

Stages, in order (each reports and goes on when a kernel fails to compile, faults, hangs
or computes a wrong result: every case runs in a worker process of its own, see
aicg/matrix/worker.py):
  tiny    every realisation on one tile (128 x 128 x 64; 16 x 128 x 64 for the decode
          kernel); a wrong output prints which rows and columns are wrong and a map of
          8 x 8 blocks (. right, x wrong, n unwritten)
  ragged  M, N, K off every tile and vector size, leading dimensions padded with NaN
  square  bf16 4096^3 and 8192^3, both B layouts, against torch.matmul
  fused   8192 x 4096 x 4096 bf16 with bias + GELU (erf) + residual, against eager
          PyTorch, F.linear with its bias (cuBLASLt epilogue) and torch.compile
  grid    M x (N, K) of Llama-3-8B's projections (F.linear weights), the best square
          realisations (or, with --grid-all, every one) and the first --grid-ranked (4) as
          the GPU's calibrated matrix prior ranks them at that shape out of the space's tried
          settings and as many out of the settings the planner ranks (what a build there chooses
          from, compiled as needed; --grid-pool tried: the tried ones alone), with the decode
          kernel's first where M <= 16 (without an hwdb entry: every tried decode realisation there);
          each case's ratio to cuBLAS printed as it comes, the decode rows against the copy
          bandwidth measured in this run
Before each timed call the L2 is evicted, for aicg's kernels and the peers alike, by a read of
twice its size (--flush read, the default: clean lines, as the layer before leaves them) or by
a memset (--flush write: dirty lines, which a read-only kernel such as the decode GEMV then
writes back as its reads evict them: up to as many bytes as a 32 MB weight has).
The target is the GPU present (its compute capability picks the realisations). Every
case's result is appended to the JSON as it comes, so a run stopped midway keeps what
it measured.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aicg.errors import CompileError  # noqa: E402
from aicg.matrix import build, space  # noqa: E402
from aicg.matrix.problem import Problem  # noqa: E402
from aicg.matrix.space import Epilogue, Realisation  # noqa: E402
from aicg.matrix.templates import RULES, GpuLimits  # noqa: E402

TINY = {"wgmma": (128, 128, 64), "mma": (128, 128, 64), "gemv": (16, 128, 64)}
# (m, n, k): off every tile (64..256) and vector (8 elements); K past one 64-wide slice and not
# a multiple of 8 (its operands then get padded leading dimensions, padding NaN).
RAGGED = ((1, 7, 64), (7, 129, 1000), (127, 1000, 129), (129, 127, 4097), (1000, 1000, 1000), (4097, 264, 136),
          (1, 4097, 1000), (16, 1000, 4096), (3, 520, 8))
SQUARES = (4096, 8192)
FUSED = (8192, 4096, 4096)
GRID_M = (1, 16, 128, 1024, 4096, 16384)
GRID_NK = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
FUSED_EPILOGUE = Epilogue("gelu_erf", bias=True, residual=True)
# A launch not done within this many seconds is a hang: the case fails and the worker restarts.
# A single tile takes microseconds; the largest grid problem milliseconds.
HANG_SECONDS = {"tiny": 5.0, "ragged": 10.0, "default": 20.0}


def padded(n: int) -> int:
    return -(-n // 8) * 8


def ragged_problem(real: Realisation, m: int, n: int, k: int) -> Problem:
    """`real`'s layouts and epilogue at (m, n, k), every leading dimension padded to 8 elements
    (and one more vector where it was whole, so padding is always read past if ignored)."""
    base = Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue)
    lda = padded(base.a_stored[1]) + (8 if base.a_stored[1] % 8 == 0 else 0)
    ldb = padded(base.b_stored[1])
    return Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue, lda=lda, ldb=ldb,
                   ldc=n + 3, ldr=n + 5)


def realisations(compute_capability, limits: GpuLimits) -> list[Realisation]:
    """The realisations this run tries: each template's tried settings over layouts, dtypes and
    epilogues enough that every combination is exercised once; those the GPU cannot run left out."""
    tpls = space.templates()
    found = []

    def add(template, dtype, a, b, epilogue, knobs):
        real = space.realisation(template, dtype, a, b, epilogue, **knobs)
        if tpls[template].runs_on(compute_capability) and not RULES[template].violations(real, limits) \
                and real not in found:
            found.append(real)
    plain = Epilogue()
    for template in ("wgmma", "mma"):
        tried = tpls[template].tried
        for i, knobs in enumerate(tried):
            if template == "mma" and not knobs["aligned"]:
                continue
            add(template, "bfloat16", "k", "k", plain, knobs)
            add(template, "bfloat16", "k", "mn", plain, knobs)
        add(template, "bfloat16", "mn", "k", plain, tried[0])
        add(template, "bfloat16", "mn", "mn", plain, tried[0])
        add(template, "float16", "k", "mn", Epilogue("gelu_tanh", bias=True), tried[0])
        add(template, "bfloat16", "k", "k", Epilogue("silu", residual=True), tried[0])
        add(template, "bfloat16", "k", "k", FUSED_EPILOGUE, tried[0])
    add("wgmma", "bfloat16", "k", "k", FUSED_EPILOGUE, tpls["wgmma"].tried[1])
    add("wgmma", "bfloat16", "k", "k", Epilogue("gelu_tanh", bias=True, residual=True), tpls["wgmma"].tried[1])
    # the fused case on every setting that does not split K (it has tiles enough), and the staged
    # epilogue and the pingpong schedule over every layout, dtype and epilogue once
    for knobs in tpls["wgmma"].tried:
        if knobs["split_k"] == 1:
            add("wgmma", "bfloat16", "k", "k", FUSED_EPILOGUE, knobs)
    for knobs in [k for k in tpls["wgmma"].tried if k["store"] == "staged"][:1] + \
            [k for k in tpls["wgmma"].tried if k["schedule"] == "pingpong"][:1] + \
            [k for k in tpls["wgmma"].tried if k["split_k"] > 1][:1]:
        add("wgmma", "bfloat16", "mn", "k", plain, knobs)
        add("wgmma", "bfloat16", "mn", "mn", plain, knobs)
        add("wgmma", "float16", "k", "mn", Epilogue("gelu_tanh", bias=True), knobs)
        add("wgmma", "bfloat16", "k", "k", Epilogue("silu", residual=True), knobs)
        add("wgmma", "bfloat16", "k", "k", FUSED_EPILOGUE, knobs)
    unaligned = [k for k in tpls["mma"].tried if not k["aligned"]]
    for knobs in unaligned:
        add("mma", "bfloat16", "k", "k", plain, knobs)
        add("mma", "float16", "mn", "mn", Epilogue("gelu_erf", bias=True, residual=True), knobs)
    for knobs in tpls["gemv"].tried:
        add("gemv", "bfloat16", "k", "k", plain, knobs)
    for knobs in [tpls["gemv"].tried[0]] + [k for k in tpls["gemv"].tried if k.get("ring")][:1]:
        add("gemv", "float16", "k", "k", Epilogue("gelu_tanh", bias=True, residual=True), knobs)
        add("gemv", "bfloat16", "k", "k", FUSED_EPILOGUE, knobs)
    return found


def selected(name: str, only: str) -> bool:
    """Whether --only keeps the realisation `name`: no filter, or a name containing any of its
    comma-separated substrings."""
    wanted = [w for w in only.split(",") if w]
    return not wanted or any(w in name for w in wanted)


def _compile(real_dict: dict, arch: str) -> dict:
    real = Realisation.from_dict(real_dict)
    start = time.monotonic()
    try:
        built = build.compile_realisation(real, arch)
    except CompileError as err:
        return {"name": real.name, "error": str(err)[-4000:], "seconds": time.monotonic() - start}
    return {"name": real.name, "cubin": built.cubin, "report": built.report, "problems": build.healthy(built),
            "seconds": time.monotonic() - start}


def compile_all(reals: list[Realisation], arch: str, jobs: int) -> dict[str, dict]:
    """name -> {cubin, report, problems} or {error}; NVRTC in `jobs` processes (spawned: this
    process has a CUDA context)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [pool.submit(_compile, r.as_dict(), arch) for r in reals]
        return {f.result()["name"]: f.result() for f in futures}


class Recorder:
    """The JSON report, rewritten after every case; the table's rows."""

    def __init__(self, path: str | None, header: dict):
        self.path, self.data, self.rows = path, {**header, "cases": [], "peers": [], "summary": {}}, []

    def case(self, stage: str, result: dict) -> dict:
        self.data["cases"].append({"stage": stage, **result})
        self.save()
        return result

    def peer(self, stage: str, result: dict) -> None:
        self.data["peers"].append({"stage": stage, **result})
        self.save()

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


def verdict(result: dict) -> str:
    if "fault" in result:
        return "FAULT"
    if "error" in result:
        return "ERROR"
    if "skipped" in result:
        return "n/a"
    return "ok" if result.get("validation", {}).get("status") == "passed" else "WRONG"


def print_failure(result: dict) -> None:
    """What a failed case found, mismatch map included."""
    if "fault" in result:
        print(f"      fault: {result['fault']}", flush=True)
        return
    if "error" in result:
        print("      error: " + result["error"].strip().splitlines()[-1][:300], flush=True)
        return
    for c in result.get("validation", {}).get("checks", []):
        if c.get("passed"):
            continue
        flags = [k for k in ("guards_intact", "padding_intact", "inputs_intact", "repeatable") if c.get(k) is False]
        print(f"      trial {c['trial']}: worst error {c['worst_error_over_bound']:.3g}x the bound, "
              f"unwritten {c['unwritten']}" + (f", not {', '.join(flags)}" if flags else ""), flush=True)
        mismatch = c.get("mismatch")
        if mismatch:
            print(f"      wrong {mismatch['wrong']} of {mismatch['checked']} checked; rows {mismatch['rows']}; "
                  f"columns {mismatch['columns']}", flush=True)
            if mismatch["unwritten"]:
                print(f"      unwritten rows {mismatch['unwritten_rows']}; columns {mismatch['unwritten_columns']}")
            for row, col, got, want in mismatch["examples"]:
                print(f"        C[{row},{col}] = {got:.6g}, expected {want:.6g}")
            for line in mismatch.get("map", []):
                print("        " + line)
        break


class Bench:
    def __init__(self, args):
        from aicg.matrix import device, worker
        from aicg.runtime import driver
        self.args, self.start = args, time.monotonic()
        info = driver.probe_device()
        if info is None:
            raise SystemExit("no CUDA GPU here: this benchmark runs on the GPU node")
        self.info = info
        self.limits, self.record = device.limits()
        self.cc = tuple(info.compute_capability)
        reals = [r for r in realisations(self.cc, self.limits) if selected(r.name, args.only)]
        self.arch = build.arch_for(reals[0], self.cc) if reals else f"sm_{self.cc[0]}{self.cc[1]}"
        print(f"{info.name} (sm_{self.cc[0]}{self.cc[1]}, {info.sm_count} SMs); {len(reals)} realisations for "
              f"{self.arch}; hwdb entry: {self.record.target if self.record else 'none (limits from the driver)'}",
              flush=True)
        t = time.monotonic()
        self.built = compile_all(reals, self.arch, args.jobs)
        self.reals = reals
        failed = [n for n, b in self.built.items() if "error" in b or b["problems"]]
        print(f"compiled {len(reals)} in {time.monotonic() - t:.1f} s; {len(failed)} ruled out by the compiler"
              + "".join(f"\n  {n}: " + (self.built[n].get("error", "").strip().splitlines() or [""])[-1][:200]
                        + "; ".join(self.built[n].get("problems", [])) for n in failed), flush=True)
        from aicg import digest, record
        from aicg.probe.gpu import _SMI_FIELDS
        clocks = os.popen(f"nvidia-smi --query-gpu={_SMI_FIELDS} --format=csv,noheader 2>/dev/null").read().strip()
        self.recorder = Recorder(args.json, {
            "device": {"name": info.name, "compute_capability": list(self.cc), "sm_count": info.sm_count},
            "driver": record.driver_version(), "clocks": clocks or "unknown (no nvidia-smi)",
            "kernels": {p.relative_to(ROOT / "kernels").as_posix(): digest.of_file(p)
                        for p in sorted((ROOT / "kernels/matrix").glob("*.cuh"))},
            "arch": self.arch, "hwdb": self.record.target if self.record else None, "args": vars(args),
            "compile": {n: {k: v for k, v in b.items() if k != "cubin"} for n, b in self.built.items()}})
        self.runner = worker.Runner()
        self.table = []        # (stage, problem, kernel, aicg TFLOP/s, peer, peer TFLOP/s, verdict)
        self.passed: dict[str, set] = {}   # stage -> names that passed there
        self.square_results: dict[tuple, list] = {}   # (size, B's layout) -> [(TFLOP/s, realisation)]
        self.same_bytes: dict[int, dict] = {}   # bytes moved -> a copy's timing (the decode shapes' peer)
        self._planned: list[Realisation] | None = None

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.start)

    def usable(self, real: Realisation) -> bool:
        b = self.built.get(real.name, {})
        return "cubin" in b and not b["problems"]

    def run(self, stage: str, real: Realisation, problem: Problem, repetitions: int = 0) -> dict:
        reason = RULES[real.template].unsupported(real, problem)
        if reason:
            return {"realisation": real.name, "problem": problem.name, "skipped": reason}
        result = self.runner.run(real, self.built[real.name]["cubin"], problem, repetitions=repetitions,
                                 flush=self.args.flush,
                                 hang_seconds=HANG_SECONDS.get(stage, HANG_SECONDS["default"]))
        self.recorder.case(stage, result)
        v = verdict(result)
        speed = f" {result['timing']['tflops']:.1f} TFLOP/s" if "timing" in result else ""
        print(f"  [{stage}] {problem.name:>42} {real.name}: {v}{speed}", flush=True)
        if v not in ("ok", "n/a"):
            print_failure(result)
        return result

    # ---- stages

    def tiny(self):
        print("== tiny: one tile each", flush=True)
        ok = set()
        for real in self.reals:
            if not self.usable(real):
                continue
            m, n, k = TINY[real.template]
            r = self.run("tiny", real, Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue))
            if verdict(r) == "ok":
                ok.add(real.name)
        self.passed["tiny"] = ok

    def ragged(self):
        print("== ragged shapes", flush=True)
        ok = set()
        for real in self.reals:
            if real.name not in self.passed.get("tiny", set()):
                continue
            good = True
            for m, n, k in RAGGED:
                if self.left() < 240:
                    # not a stage that ran: the later stages keep the tiny stage's pool (each of
                    # their cases is validated on its own problem all the same)
                    print("  (time budget: ragged stage cut short)")
                    return
                r = self.run("ragged", real, ragged_problem(real, m, n, k))
                good &= verdict(r) in ("ok", "n/a")
            if good:
                ok.add(real.name)
        self.passed["ragged"] = ok

    def candidates(self, template: str, a: str, b: str, epilogue: Epilogue = Epilogue(), dtype="bfloat16"):
        # those that passed the latest correctness stage that ran; where none ran, every one that
        # compiled (each timed case is validated on its own problem all the same)
        if "ragged" in self.passed:
            valid = self.passed["ragged"]
        elif "tiny" in self.passed:
            valid = self.passed["tiny"]
        else:
            valid = {r.name for r in self.reals if self.usable(r)}
        return [r for r in self.reals if r.template == template and (r.a_major, r.b_major, r.epilogue, r.dtype)
                == (a, b, epilogue, dtype) and r.name in valid]

    def square(self, peers):
        print("== square bf16", flush=True)
        self.square_results = {}
        for size in self.args.squares:
            for b_major in self.args.square_layouts:
                problem = Problem(size, size, size, "bfloat16", "k", b_major)
                peer = peers.matmul(problem)
                self.recorder.peer("square", peer)
                best = None
                for real in self.candidates("wgmma", "k", b_major) + self.candidates("mma", "k", b_major):
                    if self.left() < 150:
                        break
                    if not self.worth_timing(real, problem):
                        continue
                    r = self.run("square", real, problem, self.args.reps)
                    if "timing" in r:
                        self.square_results.setdefault((size, b_major), []).append((r["timing"]["tflops"], real))
                        if best is None or r["timing"]["tflops"] > best[0]:
                            best = (r["timing"]["tflops"], real.name)
                self.row("square", problem, best, peer)

    def fused(self, peers):
        print("== fused bias + GELU + residual", flush=True)
        m, n, k = FUSED
        problem = Problem(m, n, k, "bfloat16", "k", "k", FUSED_EPILOGUE)
        for p in peers.fused(problem):
            self.recorder.peer("fused", p)
        best = None
        reals = self.candidates("wgmma", "k", "k", FUSED_EPILOGUE) + self.candidates("mma", "k", "k", FUSED_EPILOGUE)
        for real in reals:
            if not self.worth_timing(real, problem):
                continue
            r = self.run("fused", real, problem, self.args.reps)
            if "timing" in r and (best is None or r["timing"]["tflops"] > best[0]):
                best = (r["timing"]["tflops"], real.name)
        for p in peers.fused_results:
            self.row("fused", problem, best, p)
            if best and p.get("tflops"):
                print(f"  -> {best[1]} {best[0]:.1f} TFLOP/s against {p['name']} {p['tflops']:.1f}: "
                      f"{best[0] / p['tflops']:.3f}x", flush=True)

    def grid_candidates(self) -> list[Realisation]:
        """The realisations timed on the grid's larger M: every valid one (--grid-all), else the
        best --grid-candidates of the square stage."""
        if self.args.grid_all:
            return self.candidates("wgmma", "k", "k") + self.candidates("mma", "k", "k")
        ranked = sorted(self.square_results.get((8192, "k"), []) + self.square_results.get((4096, "k"), []),
                        key=lambda t: -t[0])
        tops = []
        for _, real in ranked:
            if real not in tops:
                tops.append(real)
        return tops[:self.args.grid_candidates] or self.candidates("wgmma", "k", "k")[:1] or \
            self.candidates("mma", "k", "k")[:1]

    def predicted(self):
        """(real, problem) -> seconds by the GPU's calibrated matrix prior, as the plan ranks; None
        without an hwdb entry for the GPU present."""
        if self.record is None:
            return None
        from aicg.matrix import calibration
        return calibration.ranking_seconds(ROOT / "hwdb", self.record)

    def shape_candidates(self, problem: Problem, tops: list[Realisation], predicted) -> list[Realisation]:
        """What the grid times at `problem`: `tops`, the first --grid-ranked K-major realisations
        that take it as the calibrated prior ranks them there out of the space's tried ones that
        passed this run's checks, and (--grid-pool planned) the first --grid-ranked out of the
        planner's settings (aicg/matrix/plan.py's `settings`: what a build at that shape chooses from; the
        prior ranks some untried ones first that lose to tried ones on the device); each with the
        decode kernel's first where it takes the shape. Without a prior: `tops` and every tried
        decode realisation where M <= 16."""
        def takes(r: Realisation) -> bool:
            return RULES[r.template].unsupported(r, problem) is None and self.worth_timing(r, problem)
        tried = [r for t in ("wgmma", "mma", "gemv") for r in self.candidates(t, "k", "k") if takes(r)]
        if predicted is None:
            return list(dict.fromkeys(tops + [r for r in tried if r.template == "gemv"]))
        pools = [tried] + ([[r for r in self.planned_pool() if takes(r)]] if self.args.grid_pool == "planned" else [])
        found = list(tops)
        for pool in pools:
            ranked = sorted(pool, key=lambda r: (predicted(r, problem), r.name))
            found += ranked[:self.args.grid_ranked] + [r for r in ranked if r.template == "gemv"][:1]
        return list(dict.fromkeys(found))

    def planned_pool(self) -> list[Realisation]:
        """Every K-major bf16 realisation without an epilogue that the planner ranks and this GPU
        runs (aicg/matrix/plan.runnable_realisations)."""
        from aicg.matrix import plan
        if self._planned is None:
            self._planned = [r for t in ("wgmma", "mma", "gemv") if space.templates()[t].runs_on(self.cc)
                             for r in plan.runnable_realisations(t, "bfloat16", "k", "k", Epilogue(), self.limits)[0]]
        return self._planned

    def compile_missing(self, reals: list[Realisation]) -> None:
        """Compile those of `reals` this run has not compiled (the grid's planned candidates)."""
        missing = [r for r in dict.fromkeys(reals) if r.name not in self.built]
        if not missing:
            return
        t = time.monotonic()
        self.built.update(compile_all(missing, self.arch, self.args.jobs))
        self.recorder.data["compile"].update({r.name: {k: v for k, v in self.built[r.name].items() if k != "cubin"}
                                              for r in missing})
        print(f"  compiled {len(missing)} more planned realisations in {time.monotonic() - t:.1f} s", flush=True)

    def worth_timing(self, real: Realisation, problem: Problem) -> bool:
        """Split-K pays only where a problem's tiles leave SMs idle; elsewhere it only adds the
        partial sums' traffic (and its workspace grows with M)."""
        if real.template == "wgmma" and real.knob("split_k") > 1:
            return RULES["wgmma"].work(real, problem).tiles < self.info.sm_count
        return True

    def grid(self, peers):
        print("== LLM grid (F.linear weights)", flush=True)
        copy = peers.copy_bandwidth()
        self.recorder.peer("grid", copy)
        print(f"  copy bandwidth {copy['bytes_per_second'] / 1e12:.2f} TB/s (read + write)", flush=True)
        tops = self.grid_candidates()
        predicted = self.predicted()
        timed = {(m, n, k): self.shape_candidates(Problem(m, n, k, "bfloat16", "k", "k"), tops, predicted)
                 for n, k in self.args.grid_nk for m in self.args.grid_m}
        self.compile_missing([r for reals in timed.values() for r in reals])
        ratios = []
        for n, k in self.args.grid_nk:
            for m in self.args.grid_m:
                if self.left() < 30:
                    print("  (time budget: grid stage cut short)")
                    self.summary(ratios, copy)
                    return
                problem = Problem(m, n, k, "bfloat16", "k", "k")
                peer = peers.matmul(problem)
                self.recorder.peer("grid", peer)
                best = None
                for real in timed[(m, n, k)]:
                    if not self.worth_timing(real, problem) or not self.usable(real):
                        continue
                    r = self.run("grid", real, problem, self.args.reps)
                    if "timing" in r and (best is None or r["timing"]["tflops"] > best[0]):
                        best = (r["timing"]["tflops"], real.name, r["timing"]["median_seconds"])
                self.row("grid", problem, best, peer)
                if best and peer.get("tflops"):
                    ratios.append((m, n, k, best[0] / peer["tflops"], best[2]))
                    line = (f"  -> {problem.name}: {best[1]} {best[0]:.1f} TFLOP/s, cuBLAS {peer['tflops']:.1f}, "
                            f"ratio {best[0] / peer['tflops']:.3f}")
                    if m <= 16:
                        same = self.same_bytes_copy(peers, n * k * 2)
                        ratios[-1] += (same["seconds"],)
                        line += (f"; weight read at {n * k * 2 / best[2] / copy['bytes_per_second'] * 100:.0f}% of "
                                 f"the 1 GiB copy's bandwidth, {same['seconds'] / best[2] * 100:.0f}% of a copy "
                                 f"moving its bytes ({same['seconds'] * 1e6:.1f} us)")
                    print(line, flush=True)
        self.summary(ratios, copy)

    def same_bytes_copy(self, peers, nbytes: int) -> dict:
        """A copy moving `nbytes` (nbytes / 2 read, as many written), timed once per size."""
        if nbytes not in self.same_bytes:
            self.same_bytes[nbytes] = peers.copy_bandwidth(nbytes // 2)
            self.recorder.peer("grid", self.same_bytes[nbytes])
        return self.same_bytes[nbytes]

    def summary(self, ratios, copy):
        if not ratios:
            return
        geo = math.exp(sum(math.log(r[3]) for r in ratios) / len(ratios))
        worst = min(ratios, key=lambda r: r[3])
        # the decode goal: the weight's bytes over the time, against the copy's bandwidth (its bytes
        # read and written over its time) measured in this run
        decode = [(m, n, k, n * k * 2 / r[1] / copy["bytes_per_second"]) for m, n, k, *r in ratios if m <= 16]
        # and against a copy that moves as many bytes as the weight has (half of them read, half
        # written), timed alike: its launch and first loads cost what the kernel's do
        same = [(m, n, k, r[2] / r[1]) for m, n, k, *r in ratios if m <= 16 and len(r) > 2]
        self.recorder.data["summary"]["grid"] = {"geomean_ratio_to_cublas": geo, "worst": list(worst[:4]),
                                                 "cases": len(ratios),
                                                 "decode_weight_bandwidth_over_copy": [list(d) for d in decode],
                                                 "decode_over_same_bytes_copy": [list(d) for d in same]}
        self.recorder.save()

    def row(self, stage, problem, best, peer):
        row = {"stage": stage, "problem": problem.name, "aicg_tflops": best[0] if best else None,
               "aicg_kernel": best[1] if best else None, "peer": peer.get("name"), "peer_tflops": peer.get("tflops"),
               "peer_error": peer.get("error")}
        self.table.append(row)
        self.recorder.data.setdefault("table", []).append(row)
        self.recorder.save()
        return row

    def print_table(self):
        print("\nstage  | problem                                   | aicg TFLOP/s | peer                     | peer TFLOP/s | aicg/peer | aicg kernel")
        for r in self.table:
            a, p = r["aicg_tflops"], r["peer_tflops"]
            ratio = f"{a / p:.3f}" if a and p else "-"
            print(f"{r['stage']:6} | {r['problem']:41} | {a or 0:12.1f} | {str(r['peer'])[:24]:24} | {p or 0:12.1f} | "
                  f"{ratio:>9} | {r['aicg_kernel'] or 'none valid'}")
        s = self.recorder.data["summary"].get("grid")
        if s:
            print(f"grid: geometric mean aicg/cuBLAS {s['geomean_ratio_to_cublas']:.3f} over {s['cases']} cases; "
                  f"worst {s['worst'][3]:.3f} at {s['worst'][0]}x{s['worst'][1]}x{s['worst'][2]}")
            for m, n, k, share in s["decode_weight_bandwidth_over_copy"]:
                print(f"decode {m}x{n}x{k}: the weight read at {share * 100:.0f}% of the 1 GiB copy's bandwidth")
            for m, n, k, share in s.get("decode_over_same_bytes_copy", []):
                print(f"decode {m}x{n}x{k}: {share * 100:.0f}% of the speed of a copy moving the weight's bytes")
        counts = {}
        for c in self.recorder.data["cases"]:
            counts[verdict(c)] = counts.get(verdict(c), 0) + 1
        print("cases: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())) +
              f"; {time.monotonic() - self.start:.0f} s")


class Peers:
    """cuBLAS (torch.matmul, F.linear), eager PyTorch and torch.compile, timed as aicg's kernels are:
    CUDA events around the call, the L2 evicted before each repetition as for aicg's (a read of twice
    its size, or with flush="write" a memset: aicg/matrix/timing.py), the median."""

    def __init__(self, reps: int, use_compile: bool, flush: str = "read", max_autotune: bool = True):
        import torch
        from l2 import l2_flush   # tests/bench, beside this script: the row bench's eviction too
        self.torch, self.reps, self.use_compile, self.max_autotune = torch, reps, use_compile, max_autotune
        self.flush = l2_flush(flush)
        self.fused_results = []

    def time(self, fn) -> float:
        torch = self.torch
        for _ in range(3):
            fn()
        samples = []
        for _ in range(self.reps):
            self.flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3)
        samples.sort()
        return samples[len(samples) // 2]

    def _tensors(self, problem: Problem):
        torch = self.torch
        a = torch.randn(problem.m, problem.k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(*problem.b_stored, device="cuda", dtype=torch.bfloat16) / math.sqrt(problem.k)
        return a, b

    def matmul(self, problem: Problem) -> dict:
        try:
            a, b = self._tensors(problem)
            if problem.b_major == "k":
                name, fn = "F.linear (cuBLAS)", lambda: self.torch.nn.functional.linear(a, b)
            else:
                name, fn = "torch.matmul (cuBLAS)", lambda: self.torch.matmul(a, b)
            seconds = self.time(fn)
            out = {"name": name, "problem": problem.name, "seconds": seconds, "tflops": problem.flops / seconds / 1e12}
        except Exception as err:   # a peer that fails is reported, not fatal
            out = {"name": "cuBLAS", "problem": problem.name, "error": repr(err)}
        self.release()
        return out

    def fused(self, problem: Problem) -> list[dict]:
        torch, F = self.torch, self.torch.nn.functional
        a, w = self._tensors(problem)
        bias = torch.randn(problem.n, device="cuda", dtype=torch.bfloat16)
        residual = torch.randn(problem.m, problem.n, device="cuda", dtype=torch.bfloat16)

        def eager():
            return F.gelu(F.linear(a, w, bias)) + residual
        cases = [("eager PyTorch", eager), ("F.linear + bias only (cuBLASLt)", lambda: F.linear(a, w, bias))]
        if self.use_compile:   # Inductor's default (it fuses the epilogue after cuBLAS) and its autotuned templates
            cases.append(("torch.compile", torch.compile(eager)))
            if self.max_autotune:   # its autotuning takes minutes of a GPU node's call
                cases.append(("torch.compile max-autotune", torch.compile(eager, mode="max-autotune")))
        self.fused_results = []
        for name, fn in cases:
            try:
                seconds = self.time(fn)
                self.fused_results.append({"name": name, "problem": problem.name, "seconds": seconds,
                                           "tflops": problem.flops / seconds / 1e12})
            except Exception as err:
                self.fused_results.append({"name": name, "problem": problem.name, "error": repr(err)})
        del a, w, bias, residual
        self.release()
        return self.fused_results

    def copy_bandwidth(self, nbytes: int = 1 << 30) -> dict:
        torch = self.torch
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        seconds = self.time(lambda: dst.copy_(src))
        del src, dst
        self.release()
        return {"name": "device copy (torch)", "bytes": nbytes, "seconds": seconds,
                "bytes_per_second": 2 * nbytes / seconds}

    def release(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the full report here (rewritten after every case)")
    p.add_argument("--stages", default="tiny,ragged,square,fused,grid")
    p.add_argument("--squares", default=",".join(map(str, SQUARES)), help="the square stage's sizes")
    p.add_argument("--square-layouts", default="k,mn",
                   help="B's layouts on the square stage: k (N x K, F.linear's), mn (K x N, torch.matmul's)")
    p.add_argument("--grid-m", default=",".join(map(str, GRID_M)))
    p.add_argument("--grid-nk", default=",".join(f"{n}x{k}" for n, k in GRID_NK))
    p.add_argument("--grid-candidates", type=int, default=2, help="best square realisations timed on the grid")
    p.add_argument("--grid-ranked", type=int, default=4,
                   help="and at each grid shape, the first of the valid realisations as the GPU's calibrated prior ranks them there")
    p.add_argument("--grid-pool", choices=("planned", "tried"), default="planned",
                   help="what --grid-ranked ranks: the space's tried settings and the planner's (compiled as needed), "
                        "or the tried ones alone")
    p.add_argument("--grid-all", action="store_true",
                   help="time every valid K-major realisation on the grid (not only the best of the square stage)")
    p.add_argument("--only", default="",
                   help="only realisations whose name contains one of these comma-separated substrings")
    p.add_argument("--compile", action="store_true", help="also time torch.compile (default and mode='max-autotune') on the fused case")
    p.add_argument("--quick", action="store_true", help="tiny and ragged stages, 5 repetitions")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--flush", choices=("read", "write"), default="read",
                   help="how the L2 is evicted before each timed call, for aicg and the peers alike: a read of "
                        "twice its size (clean lines) or a memset (dirty lines the timed call writes back)")
    p.add_argument("--budget", type=float, default=450.0, help="seconds; later stages are cut short past it")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = p.parse_args(argv)
    args.grid_m = [int(x) for x in args.grid_m.split(",") if x]
    args.squares = [int(x) for x in args.squares.split(",") if x]
    args.square_layouts = [x for x in args.square_layouts.split(",") if x]
    if set(args.square_layouts) - {"k", "mn"}:
        p.error(f"--square-layouts takes k and mn, not {args.square_layouts}")
    args.grid_nk = [tuple(int(v) for v in x.split("x")) for x in args.grid_nk.split(",") if x]
    args.stages = args.stages.split(",")
    if args.quick:
        args.stages, args.reps = ["tiny", "ragged"], 5
    return args


def main(argv=None):
    args = parse(argv)
    bench = Bench(args)
    peers = None
    try:
        if "tiny" in args.stages:
            bench.tiny()
        if "ragged" in args.stages:
            bench.ragged()
        if {"square", "fused", "grid"} & set(args.stages):
            peers = Peers(args.reps, args.compile, args.flush)
        for stage in ("square", "fused", "grid"):
            if stage in args.stages:
                try:
                    getattr(bench, stage)(peers)
                except Exception:
                    traceback.print_exc()
                    print(f"  stage {stage} stopped by the error above; going on", flush=True)
    finally:
        bench.print_table()
        if args.json:
            print(f"full report: {args.json}")


if __name__ == "__main__":
    main()
