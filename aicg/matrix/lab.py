"""The matrix family's lab: realisations timed on this node's GPU into its matrix profile.

`doit primitives` (family=matrix) compiles every realisation the space tries
(aicg/matrix/space.toml's `tried`, of each template this GPU runs; bfloat16,
F.linear's layout), checks each on one tile against float64, then validates
and times it at each shape of aicg/matrix/lab.toml (the fused shapes with
bias + GELU + residual), and writes hwdb/<gpu>.matrix.json, which the planner
calibrates its matrix prior with (aicg/matrix/calibration.py). Every case runs
in a worker process of its own (aicg/matrix/worker.py): a kernel that faults
or hangs fails that case and the lab goes on. Only cases that passed
validation in this run become records.

The profile is written after every shape, so a run stopped by its budget (or a
lost node) leaves a usable one, its provenance saying what part was measured;
the next run keeps the records measured on the same GPU, driver and kernel
headers and measures what is left.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import functools
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import digest, nvrtc, tomlfile
from ..errors import CompileError
from . import build, calibration, space
from .problem import Problem
from .space import Epilogue, Realisation
from .templates import RULES, GpuLimits

LAB_FILE = Path(__file__).with_name("lab.toml")
FUSED = Epilogue("gelu_erf", bias=True, residual=True)
# The one-tile check each realisation passes before it is timed (the decode kernel's tile is 16 rows).
TILE = {"wgmma": (128, 128, 64), "mma": (128, 128, 64), "gemv": (16, 128, 64)}
METHOD = "aicg/matrix/lab.py"


@dataclass(frozen=True)
class Settings:
    repetitions: int
    shapes: tuple[tuple[int, int, int], ...]
    fused_shapes: tuple[tuple[int, int, int], ...]
    digest: str


def _shapes(doc: tomlfile.Table, key: str) -> tuple[tuple[int, int, int], ...]:
    found = doc.get(key, list)
    if not all(isinstance(s, list) and len(s) == 3 and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                           for d in s) for s in found):
        raise doc.error(key, "an array of [M, N, K], each a positive integer", found)
    return tuple(tuple(s) for s in found)


@functools.cache
def settings(path: Path = LAB_FILE) -> Settings:
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    repetitions = doc.get("repetitions", int)
    if repetitions < 1:
        raise doc.error("repetitions", "a positive integer", repetitions)
    found = Settings(repetitions, _shapes(doc, "shapes"), _shapes(doc, "fused_shapes"),
                     digest.of_bytes(Path(path).read_bytes()))
    doc.done()
    return found


def realisations(compute_capability: tuple[int, int], limits: GpuLimits) -> list[Realisation]:
    """The space's tried settings of every template this GPU runs, plain and fused, bfloat16, F.linear's
    layout; those the GPU cannot run (shared memory, registers) left out."""
    found = []
    for name, tpl in space.templates().items():
        if not tpl.runs_on(compute_capability) or "k" not in tpl.a_layouts or "k" not in tpl.b_layouts:
            continue
        for epilogue in (Epilogue(), FUSED):
            for knobs in tpl.tried:
                real = space.realisation(name, "bfloat16", "k", "k", epilogue, **knobs)
                if not RULES[name].violations(real, limits) and real not in found:
                    found.append(real)
    return found


def cases(reals: list[Realisation], lab: Settings) -> list[tuple[Realisation, Problem]]:
    """(realisation, problem) in the order measured: shape by shape, every realisation that computes it."""
    found = []
    for shapes, fused in ((lab.shapes, False), (lab.fused_shapes, True)):
        for shape in shapes:
            for real in reals:
                if (real.epilogue == FUSED) != fused:
                    continue
                problem = Problem(*shape, real.dtype, real.a_major, real.b_major, real.epilogue)
                if not RULES[real.template].unsupported(real, problem):
                    found.append((real, problem))
    return found


def header_digests(kernels_dir: Path) -> dict[str, str]:
    """What the lab's kernels are made of: the matrix headers and those they include."""
    found = {}
    for tpl in space.templates().values():
        found.update(nvrtc.include_closure(tpl.header, kernels_dir))
    return {name: digest.of_bytes(data) for name, data in sorted(found.items())}


def _compile(real_dict: dict, arch: str, kernels_dir: str) -> dict:
    real = Realisation.from_dict(real_dict)
    try:
        built = build.compile_realisation(real, arch, Path(kernels_dir))
    except CompileError as err:
        return {"name": real.name, "problems": [str(err).strip().splitlines()[-1][:300]]}
    return {"name": real.name, "cubin": built.cubin, "problems": build.healthy(built)}


def compile_all(reals: list[Realisation], arch: str, kernels_dir: Path) -> dict[str, dict]:
    """name -> {cubin, problems}: NVRTC in processes of their own (spawned: the caller may hold a
    CUDA context)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(min(len(reals), os.cpu_count() or 1) or 1,
                                                mp_context=context) as pool:
        futures = [pool.submit(_compile, r.as_dict(), arch, str(kernels_dir)) for r in reals]
        return {f.result()["name"]: f.result() for f in futures}


@dataclass
class Node:
    """The GPU measured: what the profile's provenance says of it, and its limits."""
    name: str
    compute_capability: tuple[int, int]
    limits: GpuLimits
    driver: str
    clocks: Callable[[], str]    # its clocks now, in words

    @property
    def arch(self) -> str:
        return RULES["mma"].arch(tuple(self.compute_capability))


def _kept(path: Path, node: Node, headers: dict, lab: Settings) -> list[dict]:
    """The records of the profile at `path` that this run would measure alike: the same GPU, driver,
    kernel headers and lab settings (an unreadable profile keeps nothing)."""
    try:
        found = calibration.load(path)
    except Exception:
        return []
    if found is None:
        return []
    p = found.provenance
    same = (p.get("device"), p.get("driver"), p.get("kernels"), p.get("lab")) == \
        (node.name, node.driver, headers, lab.digest)
    return list(found.records) if same else []


def _record(real: Realisation, problem: Problem, seconds: float) -> dict:
    return {"realisation": real.as_dict(), "m": problem.m, "n": problem.n, "k": problem.k, "seconds": seconds}


def measure(node: Node, path: Path, kernels_dir: Path, budget_seconds: float | None, runner, say=print,
            compiler=compile_all, lab: Settings | None = None) -> dict:
    """Measure into the profile at `path`; {"profile", "records", "measured", "failed", "left"}.
    `runner.run(real, cubin, problem, validate=True, repetitions=N)` validates and times one case
    (aicg/matrix/worker.py's Runner on a GPU node)."""
    started = time.monotonic()
    lab = lab or settings()
    headers = header_digests(kernels_dir)
    records = _kept(path, node, headers, lab)
    done = {(r["m"], r["n"], r["k"], Realisation.from_dict(r["realisation"])) for r in records}
    reals = realisations(node.compute_capability, node.limits)
    todo = [(real, problem) for real, problem in cases(reals, lab)
            if (problem.m, problem.n, problem.k, real) not in done]
    say(f"  matrix: {len(reals)} realisations for {node.arch}, {len(records)} records kept from an earlier run, "
        f"{len(todo)} cases to measure")
    needed = list(dict.fromkeys(real for real, _ in todo))
    built = compiler(needed, node.arch, kernels_dir) if needed else {}
    failed: dict[str, str] = {}
    for real in needed:
        b = built.get(real.name, {"problems": ["not compiled"]})
        if b["problems"]:
            failed[real.name] = "; ".join(b["problems"])
            continue
        m, n, k = TILE[real.template]
        result = runner.run(real, b["cubin"], Problem(m, n, k, real.dtype, real.a_major, real.b_major, real.epilogue),
                            validate=True, repetitions=0)
        if result.get("validation", {}).get("status") != "passed":
            failed[real.name] = _why(result)
    before = node.clocks()
    measured, left, shape = 0, [], None
    for i, (real, problem) in enumerate(todo):
        if budget_seconds is not None and time.monotonic() - started > budget_seconds:
            left = todo[i:]
            break
        if (problem.m, problem.n, problem.k, problem.epilogue) != shape:
            if shape is not None and records:   # a profile of no record is no profile: nothing is written
                _save(path, node, headers, lab, records, before, len(todo) - i)
            shape = (problem.m, problem.n, problem.k, problem.epilogue)
        if real.name in failed:
            continue
        result = runner.run(real, built[real.name]["cubin"], problem, validate=True, repetitions=lab.repetitions)
        if "timing" in result and result.get("validation", {}).get("status") == "passed":
            records.append(_record(real, problem, result["timing"]["median_seconds"]))
            measured += 1
        else:
            failed[real.name] = _why(result)
    if records:
        _save(path, node, headers, lab, records, before, len(left))
    say(f"  matrix: {measured} cases measured, {len(records)} records in {path}"
        + (f"; {len(failed)} realisations failed: " + "; ".join(f"{n}: {w}" for n, w in sorted(failed.items()))
           if failed else "")
        + (f"; budget spent with {len(left)} cases left (`doit primitives family=matrix` again measures them)"
           if left else ""))
    return {"profile": str(path) if records else None, "records": len(records), "measured": measured,
            "failed": failed, "left": len(left)}


def _why(result: dict) -> str:
    if "fault" in result:
        return f"fault: {result['fault']}"
    if "error" in result:
        return f"error: {str(result['error']).strip().splitlines()[-1][:200]}"
    return f"validation {result.get('validation', {}).get('status', 'not run')}"


def _save(path: Path, node: Node, headers: dict, lab: Settings, records: list[dict], before: str, left: int) -> None:
    method = (f"{METHOD}: each realisation checked on one tile, then at each shape of aicg/matrix/lab.toml "
              f"validated against float64 and timed (CUDA events, the L2 evicted by a read, median of {lab.repetitions}), in a "
              f"worker process of its own")
    if left:
        method = f"partial: {left} cases left when the budget ran out; " + method
    provenance = {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "driver": node.driver,
                  "clocks": f"before: {before}; after: {node.clocks()}", "method": method,
                  "repetitions": lab.repetitions, "device": node.name, "arch": node.arch, "kernels": headers,
                  "lab": lab.digest}
    calibration.save(path, provenance, records)
