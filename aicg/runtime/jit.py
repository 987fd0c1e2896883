"""Kernels for shapes an instance was not tuned for, made on first use.

An instance carries a snapshot of what planned it (source/: the profile, the
rule sets, the target's hwdb entry and realisation profile, the kernel
headers). For a shape outside its workload, the JIT plans that operator and
dtype for that one shape with those inputs: the same legality, preservation
and prior as the build. Going down the predicted fastest candidates, it
takes those that

- the instance already carries (a packaged cubin: nothing to compile), or
- are in the instance's JIT cache (jit/<compile key>.cubin, its digest
  checked on every read; a damaged entry is compiled again), or
- NVRTC compiles with the build's source and options; one that spills is
  passed over where the lab has not measured it (the lab times the same cubin,
  so a measured candidate's prediction holds what its spill costs).

Asked to answer at once (`background`: no timing now), where the predicted
fastest has to be compiled and a kernel the instance carries can run the
shape, the JIT answers with the carried one (the first of them in the
prior's order; where the prior ranks none of them, the instance's kernel for
its nearest tuned shape, as long as its order keeps the bound on these rows)
and compiles the predicted fastest on a thread of its own;
the caller asks again once that thread has finished (JitKernel.pending), and
the compiled kernel is then validated and runs from that call on. A first
call then waits for no compiler.

A kernel it compiled is validated on the device against float64 before its
first launch (the build's checks, on rows its order keeps the bound on); the outcome is kept beside the cubin, per
GPU, so later processes skip it. On the target GPU the first
TIMED_CANDIDATES usable ones (and the best one the lab has not measured yet,
see timing_order) are then timed at the shape and the fastest
runs (the prior ranks, the device decides, as in the build); the choice is
kept per GPU and shape class (jit/choice-<key>.json, with the times). Every
compilation, validation and timing is reported with its time: `events`, and
the "aicg.jit" logger. With a signing key (aicg/trust.py), every record is
signed beside it, and a record without a good signature is made again: a
validation outcome is never read from a file anyone could have written.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import codegen, digest, jit_cache, nvrtc, occupancy, planning, trust

log = logging.getLogger("aicg.jit")

VALIDATION_ROWS = 256   # at most this many rows of the new shape checked, besides the build's awkward shapes
# ... and at most this many elements, beyond what one block and a ragged one need: the float64
# reference on the host costs most of a first call at long rows (64 rows of 50257 float32
# elements: about 0.9 s of host time for the two trials' four comparisons).
VALIDATION_ELEMENTS = 1 << 19
TIMED_CANDIDATES = 3    # usable candidates timed at a new shape before one is chosen
TIMED_ELEMENTS = 1 << 26   # at most this many elements per timed launch: the inputs and output are allocated again


def timing_order(ranked: list) -> list:
    """The prior's order, except that candidates the lab has not measured (predicted by the model
    alone, not comparable with the lab's calibrated predictions: see plan.plan_op) come after the
    first TIMED_CANDIDATES measured ones, so the best of them is timed besides those, not instead."""
    if not unmeasured_besides(ranked):
        return ranked
    measured = [c for c in ranked if not c.modelled]
    return measured[:TIMED_CANDIDATES] + [c for c in ranked if c.modelled] + measured[TIMED_CANDIDATES:]


def unmeasured_besides(ranked: list) -> bool:
    """Whether some candidates were ranked by the lab's measurements and others by the model alone."""
    return len({c.modelled for c in ranked}) == 2


class JitError(RuntimeError):
    pass


@dataclass(frozen=True)
class JitKernel:
    candidate: str
    params: dict
    cubin: bytes
    origin: str              # "packaged", "jit cache" or "compiled"
    validation: str          # "passed", "failed", "unvalidated" ("packaged": the build's)
    timed: bool | None = None   # chosen by timing (now or earlier); False: the prior's pick, not timed yet
    # answering for the predicted fastest, which this thread compiles: ask again once it has finished
    pending: threading.Thread | None = field(default=None, compare=False)


def _spills(resources: dict) -> bool | None:
    """None: NVRTC gave no report (aicg/nvrtc.py), and the kernel is tried."""
    if not resources.get("reported", True):
        return None
    return bool(resources["spill_store_bytes"] + resources["spill_load_bytes"])


def _spill_unseen(cand, resources: dict) -> bool:
    """Whether nothing has measured what the candidate's spill costs. The lab measured the cubin the
    JIT compiles (same source and options), so a measured candidate's prediction includes its spill;
    one the model alone ranks could be chosen without timing. (Passing over every spill left the
    H200's one-element rows to slower kernels: layernorm bfloat16 4194304x1 36.5 us, its lab-best
    thread_rows8 candidates spilling 4-16 bytes.)"""
    return bool(_spills(resources)) and cand.modelled


def validation_shape(params: dict, rows: int, cols: int) -> tuple[int, int]:
    """The new shape as the JIT validates it: its row length whole, and rows enough for a full block
    and a ragged one, then as many more as VALIDATION_ELEMENTS allows (up to VALIDATION_ROWS). The
    row count only changes how many blocks run; the awkward shapes try ragged counts at other lengths."""
    topology = params["topology"]
    if topology in codegen.PREFETCHED or topology == codegen.FLAT or codegen.blocks_per_row(topology) > 1:
        a_block = 1
    else:
        a_block = (params["threads"] // codegen.lanes_per_row(topology, params["threads"])
                   * codegen.rows_per_thread(topology))
    return min(rows, max(a_block + 1, min(VALIDATION_ROWS, VALIDATION_ELEMENTS // max(cols, 1)))), cols


def rows_class(rows: int) -> int:
    """Row counts plan alike within a factor of two: the nearest power of two."""
    return 1 << max(0, round(math.log2(max(1, rows))))


@dataclass
class Jit:
    instance_dir: Path
    packaged: dict[str, dict]          # candidate id -> its dispatch entry (cubin path, digest, params)
    signing_key: bytes | None = None   # records are signed with it and read only when signed with it
    events: list[dict] = field(default_factory=list)
    _planning: planning.Planning | None = None
    _compiling: dict[str, threading.Thread] = field(default_factory=dict)   # compile key -> its thread
    _inputs: dict[str, tuple] = field(default_factory=dict)   # candidate id -> _compile_inputs, read once

    @property
    def cache(self) -> jit_cache.CubinCache:
        return jit_cache.CubinCache(self.cache_dir, self.signing_key)

    def _read_record(self, path: Path) -> dict | None:
        return self.cache.read_record(path)

    def _write_record(self, path: Path, record: dict) -> None:
        self.cache.write_record(path, record)

    @property
    def source(self) -> Path:
        return self.instance_dir / "source"

    @property
    def cache_dir(self) -> Path:
        return self.instance_dir / "jit"

    def available(self) -> bool:
        return (self.source / "profile.toml").is_file()

    def planning(self) -> planning.Planning:
        if self._planning is None:
            if not self.available():
                raise JitError(f"{self.source}: no planning snapshot; rebuild the instance to use shapes "
                               "outside its workload")
            self._planning = planning.load(self.source / "rulesets", self.source / "profile.toml",
                                           self.source / "hwdb")
        return self._planning

    def kernel_for(self, op: str, dtype: str, rows: int, cols: int, validate=None, timer=None,
                   background: bool = False, nearest: dict | None = None) -> JitKernel:
        """The kernel for a new shape. `validate(cubin, params, shape) -> {"status", "reason"}` runs
        where a device is (None: leave a compiled kernel unvalidated); a kernel is validated once per GPU, on the
        build's awkward shapes and the first shape that needed it. `timer([(cubin, params)], shape) ->
        [seconds] or None` times the first TIMED_CANDIDATES usable candidates at the shape, and the
        fastest is chosen (the prior only ranks them); the choice is kept per GPU and shape class.
        `background` (without a timer): where the predicted fastest must be compiled, answer with the
        first carried candidate and compile it on a thread (the module's docstring); where none of
        the ranked candidates is carried, with `nearest`, a carried kernel that keeps the bound at
        these rows (a dispatch entry: the instance's kernel for its nearest tuned shape)."""
        shape = (rows_class(rows), cols)
        planned = self.planning()
        ranked = timing_order(planned.best_for_shape(op, dtype, shape))
        timed_count = TIMED_CANDIDATES + unmeasured_besides(ranked)
        choice_path = self._choice_path(op, dtype, shape, ranked, planned.hardware.name)
        choice = self._read_record(choice_path)
        if choice is not None:
            chosen = choice.get("candidate")
            ranked = [c for c in ranked if c.id == chosen] + [c for c in ranked if c.id != chosen]
        elif background and timer is None:
            answer = self._answer_while_compiling(ranked, planned, op, dtype, rows, cols, nearest)
            if answer is not None:
                return self._note(op, dtype, (rows, cols), answer)
        usable, tried = [], []
        for cand in ranked:
            made = self._usable(cand, planned, op, dtype, rows, cols, validate)
            if made is None:
                tried.append(cand.id)
                continue
            usable.append(made)
            if (choice is not None or timer is None or made.validation != "passed"
                    or len(usable) == timed_count):
                break
        if not usable:
            raise JitError(f"no kernel for {op} {dtype} at {rows}x{cols}: every legal candidate was rejected "
                           f"({', '.join(tried) or 'none legal'})")
        if choice is not None:
            return self._note(op, dtype, (rows, cols), dataclasses.replace(usable[0], timed=True))
        if timer is None:   # the caller asked for no timing now: the prior's first valid pick
            return self._note(op, dtype, (rows, cols), dataclasses.replace(usable[0], timed=False))
        if len(usable) == 1:
            return self._note(op, dtype, (rows, cols), usable[0])
        began = time.perf_counter()
        timed_shape = (max(1, min(rows, TIMED_ELEMENTS // cols)), cols)
        seconds = timer([(k.cubin, k.params) for k in usable], timed_shape)
        if seconds is None:       # not the target GPU: the prior's order stands
            return self._note(op, dtype, (rows, cols), usable[0])
        timed = {k.candidate: s for k, s in zip(usable, seconds)}
        fastest = min(usable, key=lambda k: timed[k.candidate])
        self._write_record(choice_path, {"candidate": fastest.candidate, "timed": timed})
        self.events.append({"op": op, "dtype": dtype, "shape": [rows, cols], "timed_shape": list(timed_shape),
                            "chosen": fastest.candidate, "timed": timed, "seconds": time.perf_counter() - began})
        log.info("aicg: timed %s at %dx%d in %.2f s: %s", ", ".join(timed), *timed_shape,
                 self.events[-1]["seconds"], fastest.candidate)
        return self._note(op, dtype, (rows, cols), dataclasses.replace(fastest, timed=True))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the kernels compiling on threads of their own (`background`); whether all have
        finished. The shapes they serve switch to them on their next call."""
        for thread in list(self._compiling.values()):
            thread.join(timeout)
        return not any(t.is_alive() for t in self._compiling.values())

    def _answer_while_compiling(self, ranked, planned, op, dtype, rows, cols,
                                nearest: dict | None = None) -> JitKernel | None:
        """The first carried candidate (else `nearest`, a carried dispatch entry that keeps the bound
        here), with the predicted fastest compiling on a thread, where that one has to be compiled;
        None where it need not be or nothing carried can answer."""
        if not ranked or ranked[0].id in self.packaged:
            return None
        first = ranked[0]
        *_, key = self._compile_inputs(first, planned)
        if key not in self._compiling and self.cache.record_path(key).exists():
            return None    # compiled before (the caller's path checks it): no compiler to wait for
        carried = next((c for c in ranked if c.id in self.packaged), None)
        if carried is None and nearest is None:
            return None
        answering = carried.id if carried is not None else nearest["candidate"]
        thread = self._compiling.get(key)
        if thread is None:
            def compile_first():
                try:
                    self._cached_or_compiled(first, planned)
                except Exception as err:    # asked again, the JIT compiles it in the caller and says why
                    log.warning("aicg: compiling %s on its own thread failed: %s", first.id, err)
            thread = threading.Thread(target=compile_first, name=f"aicg-jit {first.id}", daemon=True)
            self._compiling[key] = thread
            thread.start()
            self.events.append({"op": op, "dtype": dtype, "shape": [rows, cols], "answered_with": answering,
                                "compiling": first.id})
            log.info("aicg: %s %s at %dx%d runs %s while %s compiles", op, dtype, rows, cols, answering, first.id)
        if not thread.is_alive():
            return None    # finished since: the caller's path takes the compiled kernel from the cache
        if carried is not None:
            made = self._usable(carried, planned, op, dtype, rows, cols, None)
        else:   # validated by the build, like every carried kernel; its bound checked by the caller
            made = JitKernel(nearest["candidate"], nearest["params"],
                             trust.packaged_cubin(self.instance_dir, nearest, JitError), "packaged", "passed")
        return dataclasses.replace(made, timed=False, pending=thread)

    def _choice_path(self, op: str, dtype: str, shape, ranked, gpu: str) -> Path:
        """Where the timed choice for a shape class lives: keyed by what was ranked, so a changed plan times again."""
        key = digest.of_value({"op": op, "dtype": dtype, "shape": list(shape), "gpu": gpu,
                               "ranked": [c.id for c in ranked]})
        return self.cache_dir / f"choice-{key}.json"

    def _usable(self, cand, planned, op, dtype, rows, cols, validate) -> JitKernel | None:
        """The candidate as a kernel to run, or None where it spills unmeasured or failed validation on this GPU."""
        if cand.id in self.packaged:
            cubin = trust.packaged_cubin(self.instance_dir, self.packaged[cand.id], JitError)
            return JitKernel(cand.id, cand.params, cubin, "packaged", "passed")
        # a kernel compiled now is validated next: the validator may get ready meanwhile
        cubin, meta, origin = self._cached_or_compiled(cand, planned, getattr(validate, "prepare", None))
        if _spill_unseen(cand, meta["resources"]):
            return None
        status = meta["validation"].get(planned.hardware.name)
        if status is None and validate is not None:
            began = time.perf_counter()
            report = validate(cubin, cand.params, validation_shape(cand.params, rows, cols))
            status = report["status"]
            if status in ("passed", "failed"):    # "unvalidated" (not the target GPU) is no outcome to keep
                self.cache.keep_outcome(meta, planned.hardware.name, status)
            self.events.append({"op": op, "dtype": dtype, "shape": [rows, cols], "candidate": cand.id,
                                "validated": status, "seconds": time.perf_counter() - began,
                                **({"reason": report["reason"]} if report.get("reason") else {})})
            log.info("aicg: validated %s for %dx%d: %s in %.2f s%s", cand.id, rows, cols, status,
                     self.events[-1]["seconds"], f" ({report['reason']})" if report.get("reason") else "")
        if status == "failed":
            return None
        return JitKernel(cand.id, cand.params, cubin, origin, status or "unvalidated")

    def _note(self, op, dtype, shape, kernel: JitKernel) -> JitKernel:
        log.debug("aicg: %s %s %dx%d -> %s (%s)", op, dtype, *shape, kernel.candidate, kernel.origin)
        return kernel

    def _compile_inputs(self, cand, planned) -> tuple[str, dict[str, bytes], str, str]:
        """(source, headers, arch, compile key) of a candidate: the snapshot's headers read and
        hashed once a process, not at each question about the candidate."""
        if cand.id not in self._inputs:
            self._inputs[cand.id] = self._read_compile_inputs(cand, planned)
        return self._inputs[cand.id]

    def _read_compile_inputs(self, cand, planned) -> tuple[str, dict[str, bytes], str, str]:
        family = planned.rules.families[cand.family]
        source = codegen.source(cand.id, family, cand.dtype, cand.params)
        headers = nvrtc.include_closure(family.header, self.source / "kernels")
        arch = planned.hardware.arch
        key = occupancy.compile_key(source, {name: digest.of_bytes(data) for name, data in headers.items()}, arch,
                                    cand.params, planned.hardware.fact("registers_per_sm"))
        return source, headers, arch, key

    def _cached_or_compiled(self, cand, planned, before_compiling=None):
        """(cubin, metadata, origin); the metadata holds ptxas's resource report. `before_compiling()`
        is called where the kernel is not in the cache, before NVRTC runs."""
        source, headers, arch, key = self._compile_inputs(cand, planned)
        cached = self.cache.get(key)
        if cached is not None:
            return (*cached, "jit cache")
        if before_compiling is not None:
            before_compiling()
        began = time.perf_counter()
        cubin, resources, _log = occupancy.compile_candidate(source, f"src/{cand.id}.cu", headers, arch, cand.params,
                                                             planned.hardware.fact("registers_per_sm"),
                                                             concurrent=True)   # a caller waits on it
        seconds = time.perf_counter() - began
        meta = self.cache.put(key, cubin, {"candidate": cand.id, "params": cand.params, "resources": resources,
                                           "compile_seconds": seconds})
        self.events.append({"op": cand.op, "dtype": cand.dtype, "candidate": cand.id, "compiled": True,
                            "seconds": seconds, "spilled": _spills(resources)})
        log.info("aicg: compiled %s in %.2f s", cand.id, seconds)
        return cubin, meta, "compiled"
