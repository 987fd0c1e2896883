"""An instance's backward kernels, made on first use and validated before their first launch.

The instance's planning snapshot (source/: profile, rule sets, hwdb entry) decides what is legal
(aicg/backward/space.py) and how strictly a kernel is checked; the templates are aicg's own
(kernels/backward/, which an instance does not carry). For an (operator, dtype, row length), the
candidates of the ladder that are legal and keep the profile's bound are tried in order:

- compiled with NVRTC for the target, or taken from the instance's cache
  (jit/backward/<compile key>.cubin, its digest checked on every read); one that spills is passed over;
  where the GPU present can time them, the candidates to be timed compile together on threads;
- validated on the device against float64 (aicg/backward/check.py, in a worker process), once per
  GPU, on the build's awkward shapes and the shape that first needed it; the outcome is kept beside
  the cubin, so later processes skip it; one that fails is passed over;
- the first two valid candidates of each kind the ladder offers (a kind: the families of a
  candidate, e.g. the norms' gradients in one pass or in two) are timed at the shape (in the
  worker, every launch a training step makes, weights' gradients included; rows cut to
  TIMED_ELEMENTS) and the fastest serves every later call of the shape class; the choice is kept
  per GPU and shape class (jit/backward/choice-<key>.json, with the times), so it is timed once;
  a single valid candidate serves untimed. Where
  this machine's GPU is not the target, a kernel stays unvalidated and serves only an instance
  loaded with allow_unvalidated=True, and nothing is timed.

With a signing key (aicg/trust.py) every record is signed beside it, and one without a good
signature is made again. Every compilation and validation is reported with its time (`events`,
and the "aicg.jit" logger).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import digest, jit_cache, nvrtc
from ..runtime.jit import rows_class
from . import build, check
from . import space as space_mod
from .space import Candidate, Decision, Space

log = logging.getLogger("aicg.jit")

VALIDATION_ROWS = 256   # rows of the shape that first needed a kernel, checked beside the awkward shapes
TIMED_PER_KIND = 2      # the first valid candidates of each kind (the norms' one-pass and two-pass forms) timed
TIMED_ELEMENTS = 1 << 27   # at most this many elements a timed matrix (a training step's 32768 x 4096)


def kind(candidate: Candidate) -> tuple:
    """Candidates of one kind share their families; their rungs differ only in parameters."""
    return candidate.rows_family, candidate.columns_family


@dataclass(frozen=True)
class Chosen:
    candidate: Candidate
    cubin: bytes
    origin: str          # "jit cache" or "compiled"
    validation: str      # "passed" or "unvalidated"


@dataclass
class BackwardJit:
    instance_dir: Path
    planning: object                       # aicg.planning.Planning of the instance's snapshot
    signing_key: bytes | None = None
    allow_unvalidated: bool = False
    space: Space | None = None
    events: list[dict] = field(default_factory=list)
    _decisions: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.space is None:
            self.space = space_mod.load(space_mod.SPACE_FILE, self.planning.rules)

    @property
    def cache_dir(self) -> Path:
        return Path(self.instance_dir) / "jit" / "backward"

    def decision(self, op: str, dtype: str) -> Decision:
        if (op, dtype) not in self._decisions:
            prof = self.planning.prof
            self._decisions[(op, dtype)] = space_mod.decide(self.space, self.planning.rules, prof.preservation,
                                                            prof.choice, op, dtype)
        return self._decisions[(op, dtype)]

    def kernel_for(self, op: str, dtype: str, rows: int, cols: int) -> Chosen | str:
        """The kernels for `op` in `dtype` on rows of `cols` (the column sums over `rows` rows), or
        why there are none: no legal family, no candidate keeping the bound, or every one rejected."""
        decision = self.decision(op, dtype)
        if not decision.legal:
            return f"no legal backward family: {decision.why_not()}"
        prof = self.planning.prof
        rtol = prof.preservation.tolerance[dtype][0]
        found, passed_over = space_mod.candidates(self.space, decision, rtol,
                                                  self.planning.rules.rounding.failure_probability, rows, cols,
                                                  self._max_cluster_blocks())
        rejected = list(passed_over)
        choice_path = self._choice_path(op, dtype, rows, cols, found)
        choice = self.cache.read_record(choice_path)
        if choice is not None:     # timed here before: that candidate first, nothing timed again
            found = sorted(found, key=lambda c: c.id != choice.get("candidate"))
        firsts: list[Chosen] = []   # the first usable candidates of each kind
        wanted = TIMED_PER_KIND * len({kind(c) for c in found})
        if choice is None and check.can_time(self.planning.hardware):
            self._compile_ahead(found)
        for candidate in found:
            if sum(kind(c.candidate) == kind(candidate) for c in firsts) == TIMED_PER_KIND:
                continue
            chosen = self.kernels_of(candidate, rows, cols, rejected)
            if chosen is None:
                continue
            if isinstance(chosen, str):     # why this machine can validate none of them
                return firsts[0] if firsts else chosen
            firsts.append(chosen)
            if choice is not None or chosen.validation != "passed" or len(firsts) == wanted:
                break
        if not firsts:
            return "every candidate was passed over: " + ("; ".join(rejected) or "none serves these rows")
        return firsts[0] if len(firsts) == 1 else self._fastest(firsts, rows, cols, choice_path)

    def _compile_ahead(self, found: list[Candidate]) -> None:
        """Start compiling, on threads, the first TIMED_PER_KIND candidates of each kind that the cache
        lacks, so that their compiles overlap the validation of the first (each is then taken from
        nvrtc's compile_ahead by its compile)."""
        arch, per_kind = self.planning.hardware.arch, {}
        programs = []
        for candidate in found:
            per_kind[kind(candidate)] = per_kind.get(kind(candidate), 0) + 1
            if per_kind[kind(candidate)] <= TIMED_PER_KIND and \
                    not self.cache.cubin_path(build.compile_key(self.space, candidate, arch)).exists():
                programs.append(build.program(self.space, candidate, arch))
        if len(programs) > 1:
            nvrtc.compile_ahead(programs, workers=len(programs))

    def _fastest(self, chosen: list[Chosen], rows: int, cols: int, choice_path: Path) -> Chosen:
        """The fastest of `chosen` timed at the shape (rows cut to TIMED_ELEMENTS), kept as the
        choice for the shape class; the first where this GPU cannot time them."""
        began = time.perf_counter()
        timed_shape = (max(1, min(rows, TIMED_ELEMENTS // cols)), cols)
        seconds = check.time_on_device([(c.cubin, c.candidate) for c in chosen], self.planning.hardware,
                                       timed_shape, self.planning.prof.timing_repetitions)
        if seconds is None:
            return chosen[0]
        timed = {c.candidate.id: s for c, s in zip(chosen, seconds)}
        fastest = min(chosen, key=lambda c: timed[c.candidate.id])
        self.cache.write_record(choice_path, {"candidate": fastest.candidate.id, "timed": timed})
        first = chosen[0].candidate
        self.events.append({"op": first.op, "dtype": first.dtype, "shape": [rows, cols],
                            "timed_shape": list(timed_shape), "chosen": fastest.candidate.id, "timed": timed,
                            "seconds": time.perf_counter() - began})
        log.info("aicg: timed %s at %dx%d in %.2f s: %s", ", ".join(timed), *timed_shape,
                 self.events[-1]["seconds"], fastest.candidate.id)
        return fastest

    def _choice_path(self, op: str, dtype: str, rows: int, cols: int, found: list[Candidate]) -> Path:
        """Where the timed choice for a shape class lives: keyed by the GPU and what the ladder
        offered, so a changed ladder or rule set times again."""
        key = digest.of_value({"op": op, "dtype": dtype, "shape": [rows_class(rows), cols],
                               "gpu": self.planning.hardware.name, "offered": [c.id for c in found]})
        return self.cache_dir / f"choice-{key}.json"

    def candidates(self, op: str, dtype: str, rows: int, cols: int) -> list[Candidate]:
        """The legal candidates keeping the bound at the shape, in the order kernel_for tries them."""
        decision = self.decision(op, dtype)
        if not decision.legal:
            return []
        return space_mod.candidates(self.space, decision, self.planning.prof.preservation.tolerance[dtype][0],
                                    self.planning.rules.rounding.failure_probability, rows, cols,
                                    self._max_cluster_blocks())[0]

    def _max_cluster_blocks(self) -> int:
        """The most blocks the target puts in a cluster (1 where it has none), as the forward plan reads it."""
        return int(self.planning.hw_facts["max_cluster_blocks"])

    def kernels_of(self, candidate: Candidate, rows: int, cols: int,
                   rejected: list[str] | None = None) -> Chosen | str | None:
        """The candidate as kernels to run; None where it is passed over (why, in `rejected`); why
        none can serve, where this machine cannot validate it (nor any other)."""
        rejected = [] if rejected is None else rejected
        hardware = self.planning.hardware
        cubin, meta, origin = self._cached_or_compiled(candidate)
        unhealthy = build.unhealthy(candidate, meta["resources"])
        if unhealthy:
            rejected.append(f"{candidate.id}: {'; '.join(unhealthy)}")
            return None
        status = meta["validation"].get(hardware.name)
        if status is None:
            began = time.perf_counter()
            prof = self.planning.prof
            tolerance = prof.preservation.tolerance[candidate.dtype]
            shapes = check.check_shapes(self.space, candidate, tolerance[0],
                                        self.planning.rules.rounding.failure_probability,
                                        (min(rows, VALIDATION_ROWS), cols))
            report = check.validate_on_device(cubin, candidate, hardware, tolerance=tolerance,
                                              deterministic=prof.preservation.axes["deterministic"],
                                              check_shapes=shapes, trials=prof.validation_trials)
            status, reason = report["status"], check.why_failed(report)
            if status in ("passed", "failed"):     # "unvalidated" (not the target GPU) is no outcome to keep
                self.cache.keep_outcome(meta, hardware.name, status)
            self.events.append({"op": candidate.op, "dtype": candidate.dtype, "shape": [rows, cols],
                                "candidate": candidate.id, "validated": status,
                                "seconds": time.perf_counter() - began, **({"reason": reason} if reason else {})})
            log.info("aicg: validated %s for %dx%d: %s in %.2f s%s", candidate.id, rows, cols, status,
                     self.events[-1]["seconds"], f" ({reason})" if reason else "")
            if status == "unvalidated" and not self.allow_unvalidated:
                return (f"{candidate.id} is not validated: {reason} (an instance loaded with allow_unvalidated=True "
                        f"runs it anyway)")
        if status == "failed":
            rejected.append(f"{candidate.id}: failed its validation on this GPU")
            return None
        return Chosen(candidate, cubin, origin, status)

    # --- the cache -------------------------------------------------------------------------

    @property
    def cache(self) -> jit_cache.CubinCache:
        return jit_cache.CubinCache(self.cache_dir, self.signing_key)

    def _cached_or_compiled(self, candidate: Candidate) -> tuple[bytes, dict, str]:
        arch = self.planning.hardware.arch
        key = build.compile_key(self.space, candidate, arch)
        cached = self.cache.get(key, tables=("validation", "resources"))
        if cached is not None:
            return (*cached, "jit cache")
        began = time.perf_counter()
        cubin, resources, _ = build.compile_candidate(self.space, candidate, arch)
        seconds = time.perf_counter() - began
        meta = self.cache.put(key, cubin, {"candidate": candidate.as_record(), "id": candidate.id, "arch": arch,
                                           "resources": resources, "compile_seconds": seconds})
        self.events.append({"op": candidate.op, "dtype": candidate.dtype, "candidate": candidate.id, "compiled": True,
                            "seconds": seconds})
        log.info("aicg: compiled %s in %.2f s", candidate.id, seconds)
        return cubin, meta, "compiled"
