"""Matrix kernels for shapes outside the workload: `inst.tune()`'s part for inst.matmul and inst.linear.

A call at a shape the build did not plan runs at once the packaged kernel
estimated fastest there (aicg/matrix/dispatch.py, aicg/matrix/estimate.py):
nothing stalls the caller. `inst.tune()` then plans each such shape as the
build would, from what the instance carries in source/ (its profile, rule
sets, hwdb entry, matrix profile and kernel headers): of the realisations the
calibrated prior ranks first there (TUNED_CANDIDATES), it compiles those the
instance does not carry (NVRTC), validates each on the device as the build
does (the awkward problems and this shape, in a worker process:
aicg/matrix/validation.py), times them and the kernel running now at the
shape, and keeps the fastest valid one for that shape.

Cubins and their outcomes are kept in <instance>/jit/matrix/ under their
compile key (the validation per GPU), and the choice per GPU, class and shape
with its times; each record is signed where a signing key is configured and
read only when signed with it. A later process neither compiles, validates
nor times them again. Without the target GPU nothing is validated, nothing is
chosen, and the calls keep their packaged kernels.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import digest, jit_cache, trust
from .problem import Problem
from .space import Realisation

# What planning, compiling and validating import is loaded when tune() first needs it, not with
# every instance (aicg.load stays as quick as before).

TUNED_CANDIDATES = 3     # the calibrated prior's first realisations compiled, validated and timed at a shape
COMPILE_KEY = re.compile(r"[0-9a-f]{16,128}")   # digest.of_value's hex: a record's key names files, nothing else
log = logging.getLogger("aicg.jit")


class MatrixJitError(RuntimeError):
    pass


@dataclass(frozen=True)
class Kernel:
    """A kernel to run at a shape: packaged (`cubin` None: the instance's own) or compiled by the JIT."""
    candidate: str
    realisation: Realisation
    cubin: bytes | None = None


@dataclass
class MatrixJit:
    instance_dir: Path
    packaged: dict[str, dict]            # candidate id -> its manifest entry (realisation, cubin, resources)
    gpu: str                             # the target's name (the manifest's): choices are kept per GPU
    signing_key: bytes | None = None
    events: list[dict] = field(default_factory=list)
    _planned: tuple | None = None

    @property
    def source(self) -> Path:
        return self.instance_dir / "source"

    @property
    def cache_dir(self) -> Path:
        return self.instance_dir / "jit" / "matrix"

    @staticmethod
    def carried_by(instance_dir: Path) -> bool:
        """Whether the instance carries what the matrix JIT plans with (source/ with the matrix rule set)."""
        source = Path(instance_dir) / "source"
        return (source / "profile.toml").is_file() and (source / "rulesets" / "matrix.toml").is_file()

    def available(self) -> bool:
        return self.carried_by(self.instance_dir)

    def planned(self):
        """(the matrix build as the instance's snapshot plans it, the planning inputs)."""
        if self._planned is None:
            from .. import planning
            from . import steps
            if not self.available():
                raise MatrixJitError(f"{self.source}: no planning snapshot of the matrix family; rebuild the "
                                     f"instance to tune shapes outside its workload")
            inputs = planning.load(self.source / "rulesets", self.source / "profile.toml", self.source / "hwdb")
            matrix = steps.load(self.source / "rulesets", inputs.rules, inputs.prof, inputs.hardware,
                                self.source / "hwdb")
            self._planned = (matrix, inputs)
        return self._planned

    def ranked(self, class_name: str, problem: Problem) -> list:
        """The realisations the build would plan at `problem` for the class, predicted fastest first."""
        from . import plan, prior
        matrix, inputs = self.planned()
        workload = next((c for c in matrix.classes if c.name == class_name), None)
        if workload is None:
            raise MatrixJitError(f"{self.source / 'profile.toml'}: no matrix class {class_name}")
        cls = dataclasses.replace(workload, shapes=((problem.m, problem.n, problem.k),))
        planned = plan.plan_class(cls, matrix.semantics, matrix.legalities[class_name], prior.values(matrix.inputs),
                                  matrix.limits, inputs.prof.preservation.tolerance[cls.dtype][0], TUNED_CANDIDATES,
                                  matrix.calibration)
        return sorted(planned.candidates, key=lambda c: (c.predicted_seconds[0], c.tried, c.id))[:TUNED_CANDIDATES]

    # --- records ------------------------------------------------------------------------------------

    @property
    def cache(self) -> jit_cache.CubinCache:
        return jit_cache.CubinCache(self.cache_dir, self.signing_key)

    def _read(self, path: Path) -> dict | None:
        return self.cache.read_record(path)

    def _write(self, path: Path, record: dict) -> None:
        self.cache.write_record(path, record)

    def _choice_path(self, class_name: str, problem: Problem, gpu: str) -> Path:
        key = digest.of_value({"class": class_name, "shape": [problem.m, problem.n, problem.k], "gpu": gpu})
        return self.cache_dir / f"choice-{key}.json"

    def compiled(self, real: Realisation) -> tuple[bytes, dict]:
        """(cubin, record) of `real`, from the cache or compiled now; the record holds ptxas's report and
        the validation per GPU."""
        from .. import nvrtc, toolchain
        from . import build, codegen, space
        _, inputs = self.planned()
        source = codegen.source(real)
        headers = nvrtc.include_closure(space.templates()[real.template].header, self.source / "kernels")
        arch = build.arch_for(real, tuple(inputs.hardware.compute_capability))
        key = digest.of_value({"source": source, "headers": {n: digest.of_bytes(b) for n, b in headers.items()},
                               "arch": arch, "options": list(nvrtc.OPTIONS), "toolchain": toolchain.identity()})
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        began = time.perf_counter()
        built = build.compile_source(real, source, f"{real.name}.cu", headers, arch)
        meta = self.cache.put(key, built.cubin, {"realisation": real.as_dict(), "report": built.report,
                                                 "compile_seconds": time.perf_counter() - began})
        self.events.append({"op": "matmul", "candidate": f"matmul.{real.name}", "compiled": True,
                            "seconds": meta["compile_seconds"]})
        return built.cubin, meta

    # --- at run time ----------------------------------------------------------------------------------

    def choice(self, class_name: str, problem: Problem) -> Kernel | None:
        """The kernel tune() chose at this shape for the target GPU, or None (none, or a record that
        does not check out: a packaged kernel the manifest lacks, a compiled one whose record, cubin
        or validation on this GPU does not hold)."""
        record = self._read(self._choice_path(class_name, problem, self.gpu)) if self.available() else None
        if record is None:
            return None
        candidate, origin, key = record.get("candidate"), record.get("origin"), record.get("key")
        if origin == "packaged":
            entry = self.packaged.get(candidate)
            return Kernel(candidate, Realisation.from_dict(entry["realisation"])) if entry else None
        if origin != "jit" or not isinstance(key, str) or not COMPILE_KEY.fullmatch(key):
            log.warning("aicg: %s is not a choice this JIT writes; the shape keeps its packaged kernel",
                        self._choice_path(class_name, problem, self.gpu))
            return None
        cached = self.cache.get(key)     # a cubin that does not check out is said so in the log
        if cached is None or cached[1]["validation"].get(self.gpu) != "passed":
            return None
        cubin, meta = cached
        real = Realisation.from_dict(meta["realisation"])
        return Kernel(f"matmul.{real.name}", real, cubin) if f"matmul.{real.name}" == candidate else None

    def tune(self, class_name: str, problem: Problem, running: Kernel) -> dict:
        """Plan, compile, validate and time at `problem`, beside `running` (the kernel its calls run
        now); keep the fastest valid one as the shape's choice. Returns what happened."""
        from . import validation
        _, inputs = self.planned()
        hardware, repetitions = inputs.hardware, inputs.prof.timing_repetitions
        if hardware.name != self.gpu:
            raise MatrixJitError(f"{self.source}: plans for {hardware.name}, but the instance was built for {self.gpu}")
        shape = (problem.m, problem.n, problem.k)
        tried: dict[str, dict] = {}
        entries = {running.candidate: running.realisation}
        for cand in self.ranked(class_name, problem):
            entries.setdefault(cand.id, cand.real)
        began = time.perf_counter()
        for cand_id, real in entries.items():
            if cand_id in self.packaged:
                cubin = trust.packaged_cubin(self.instance_dir, self.packaged[cand_id], MatrixJitError)
                report, meta = self.packaged[cand_id]["resources"], None
            else:
                cubin, meta = self.compiled(real)
                report = meta["report"]
            outcome = validation.validate_on_device(real, cubin, report, hardware, [shape], repetitions)
            if meta is not None and outcome["status"] in ("passed", "failed"):
                self.cache.keep_outcome(meta, hardware.name, outcome["status"])
            seconds = outcome["timings"][0]["median_seconds"] if outcome["status"] == "passed" else None
            tried[cand_id] = {"status": outcome["status"], "reason": outcome.get("reason"), "seconds": seconds,
                              "origin": "packaged" if meta is None else "jit", "key": meta and meta["key"],
                              "realisation": real.as_dict()}
        timed = {c: t for c, t in tried.items() if t["seconds"] is not None}
        event = {"op": "matmul", "class": class_name, "shape": list(shape), "seconds": time.perf_counter() - began,
                 "tried": {c: {k: t[k] for k in ("status", "reason", "seconds")} for c, t in tried.items()}}
        if timed:
            fastest = min(timed, key=lambda c: (timed[c]["seconds"], c))
            best = timed[fastest]
            self._write(self._choice_path(class_name, problem, hardware.name),
                        {"candidate": fastest, "origin": best["origin"], "key": best["key"],
                         "realisation": best["realisation"], "timed": {c: t["seconds"] for c, t in timed.items()}})
            event["chosen"] = fastest
        self.events.append(event)
        return event
