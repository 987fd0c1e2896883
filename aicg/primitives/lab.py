"""Measuring the realisations of the row primitives on the GPU of this node.

Every kernel family is a realisation of its operator's primitive (a row
reduction as one thread, a warp tree or a block tree per row; softmax online
or in two passes; variance by Welford or in two passes; 4- or 16-byte
accesses; a row held in registers between sweeps or read again; exact or
fast exp). The lab runs every parameter combination the GPU can run (rules
aside: legality is the profile's business, the lab measures what is) over a
grid of row lengths, per dtype, with the same kernels the build compiles:

- time: device events around one launch over ROW_ELEMENTS elements, L2
  flushed before each repetition (aicg/validate/check.py's timing), median;
  and the same around launches of FEW_ROWS rows (one row's latency, one
  wave), where a launch costs what the full one does not show;
- drift: the largest |y - ref| / scale against a float64 reference on
  DRIFT_ROWS rows of fresh normal inputs (scale per operator, ops.py; an
  element equal to its reference has none, whatever its scale);
- bit stability: two runs and a launch split in two give identical bits.

Cubins are compiled in worker processes of the host (NVRTC needs no GPU and
holds the GIL) before anything runs on the device. A measurement depends on
the cubin, the GPU, the driver and the method alone, so a realisation whose
cubin an earlier run of the same method measured on the same GPU and driver
(the profile's, or an interrupted run's) is not measured again: a kernel
edit re-measures only the realisations whose code it changed. A record whose
drift is not finite is measured again all the same: it is a kernel writing
outside its output, or a draw the drift once mis-measured (see largest_error).
"""
from __future__ import annotations

import functools
import json
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import cas, cli_progress, codegen, digest, nvrtc, occupancy, plan, plan_inputs
from ..dtypes import DTYPES
from ..ops import OPERATORS
from ..runtime import driver
from ..validate import check

COLS = (64, 512, 4096, 32768)
# Rows of one and of TINY_ROW elements as well, for realisations that give a row one thread: a
# thread serving several rows holds tiny rows element by element (kernels/row_access.cuh), a code
# path the longer rows never take, and a thread per row of one element makes the most launches
# of the fewest bytes. Elsewhere a tiny row is the long rows' code with idle lanes, as modelled.
TINY_COLS = (1, plan_inputs.TINY_ROW)
ROW_ELEMENTS = 1 << 26        # per timed launch: 256 MiB of float32, several times the L2
FEW_ROWS = (1, 128)           # launches of a single row and of about one wave, timed besides the full one
DRIFT_ROWS = 64
REPETITIONS = 5
DTYPES_MEASURED = ("float32", "bfloat16")


@dataclass(frozen=True)
class Config:
    op: str
    family: str
    dtype: str
    params: dict

    @functools.cached_property
    def id(self) -> str:
        return plan.candidate_id(self.family, self.dtype, self.params)


def configurations(ruleset, hw: dict, dtypes=DTYPES_MEASURED) -> list[Config]:
    return [Config(family.op, family.name, dtype, p) for family in ruleset.families.values() for dtype in dtypes
            for p in plan.runnable_params(family, dtype, hw)]


def row_lengths(config: Config) -> tuple[int, ...]:
    """The row lengths the lab measures a realisation at."""
    one_thread = codegen.lanes_per_row(config.params["topology"], config.params["threads"]) == 1
    return (TINY_COLS if one_thread else ()) + COLS


def launches(cols: int) -> tuple[int, ...]:
    """The row counts the lab times rows of `cols` at: FEW_ROWS, and the full launch of
    ROW_ELEMENTS elements (its most rows)."""
    full = max(1, ROW_ELEMENTS // cols)
    return tuple(sorted({*(n for n in FEW_ROWS if n < full), full}))


def kernel_digests(ruleset, kernels_dir) -> dict[str, str]:
    """The digest of every header the families' kernels include: what the profile measured."""
    headers: dict[str, bytes] = {}
    for family in ruleset.families.values():
        headers.update(nvrtc.include_closure(family.header, kernels_dir))
    return {name: digest.of_bytes(data) for name, data in sorted(headers.items())}


def _compile(job: tuple) -> tuple[str, bytes]:
    config_id, source, headers, arch, params, registers_per_sm = job
    return config_id, occupancy.compile_candidate(source, f"{config_id}.cu", headers, arch, params, registers_per_sm)[0]


def _stored_cubin(store: cas.Store | None, key: str) -> bytes | None:
    entry = store.get_action(key) if store else None
    outputs = store.fetch_outputs(entry) if entry else None
    return outputs["cubin"] if outputs else None


def compile_all(configs: list[Config], ruleset, kernels_dir, arch: str, registers_per_sm: int,
                workers: int | None = None, store: cas.Store | None = None) -> dict[str, bytes]:
    """Cubins by config id, built as the build builds them (aicg/occupancy.py), in worker processes
    (NVRTC holds the GIL); with a store, taken from it where compiled before and kept in it."""
    jobs, cubins = {}, {}
    closures: dict[str, tuple[dict, dict]] = {}   # header -> (its include closure, their digests): read once
    for c in configs:
        family = ruleset.families[c.family]
        if family.header not in closures:
            headers = nvrtc.include_closure(family.header, kernels_dir)
            closures[family.header] = headers, {name: digest.of_bytes(data) for name, data in sorted(headers.items())}
        headers, header_digests = closures[family.header]
        source = codegen.source(c.id, family, c.dtype, c.params)
        job = (c.id, source, headers, arch, c.params, registers_per_sm)
        # a run stopped at its time limit compiles none again
        key = occupancy.compile_key(source, header_digests, arch, c.params, registers_per_sm)
        stored = _stored_cubin(store, key)
        if stored is None:
            jobs[c.id] = (job, key)
        else:
            cubins[c.id] = stored
    if jobs:
        # forkserver: the caller may hold a CUDA context and threads, which a plain fork would copy
        bar = cli_progress.Bar(len(jobs), "compiling realisations", unit="kernel")
        compiled = {}
        with ProcessPoolExecutor(workers or os.cpu_count(), mp_context=multiprocessing.get_context("forkserver")) as pool:
            for config_id, cubin in pool.map(_compile, [job for job, _ in jobs.values()], chunksize=8):
                compiled[config_id] = cubin
                bar.advance()
        bar.close()
        for config_id, cubin in compiled.items():
            if store:
                store.put_action(cas.ActionEntry(jobs[config_id][1], f"lab-compile:{config_id}",
                                                 {"cubin": store.put_blob(cubin)}))
        cubins.update(compiled)
    return cubins


def _drift(kernel, buffers: check.Buffers, params: dict, inputs, ref, scale, dtype) -> tuple[float, bool]:
    """(the largest error against float64 relative to the scale, bit stability); a realisation
    that writes outside its output drifts without bound."""
    buffers.wrote_outside = False
    first = buffers.run_poisoned(kernel, params)
    again = buffers.run_poisoned(kernel, params)
    split = buffers.run_poisoned(kernel, params, split=(buffers.rows + 1) // 2)
    y = dtype.decode(first).astype(np.float64).reshape(ref.shape)
    drift = math.inf if buffers.wrote_outside else largest_error(y, ref, scale)
    return drift, first.tobytes() == again.tobytes() == split.tobytes()


def largest_error(y: np.ndarray, ref: np.ndarray, scale: np.ndarray) -> float:
    """The largest |y - ref| / scale; infinite where y is NaN (a poisoned element left) or off a
    reference of zero scale. An element equal to its reference has no error even where its scale
    is zero: rmsnorm's scale is |ref|, and a draw of normal floats holds an exact zero about once
    in eight draws of 64 x 32768 (numpy 2.5, float32), whose 0/0 made every realisation sharing
    that draw read an infinite drift (rmsnorm float32 on 2026-12-01, bfloat16 on 2026-12-03)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.where(y == ref, 0.0, np.abs(y - ref) / scale)
    return float(np.nanmax(np.where(np.isnan(err), np.inf, err)))


def method(device: str, driver_version: str) -> dict:
    """What makes two lab runs' records of one cubin at one row length comparable: the launches,
    the repetitions, the GPU. The row lengths are not part of it: each record names its own, so
    a run that adds row lengths keeps the records of the others."""
    return {"few_rows": list(FEW_ROWS), "row_elements": ROW_ELEMENTS,
            "repetitions": REPETITIONS, "drift_rows": DRIFT_ROWS, "device": device, "driver": driver_version}


def same_method(recorded: dict | None, run_method: dict) -> bool:
    """Whether records kept under `recorded` (a profile's or an interrupted run's method) are this
    run's; earlier runs listed their row lengths in it."""
    return recorded is not None and {k: v for k, v in recorded.items() if k != "cols"} == run_method


def cubin_digests(cubins: dict[str, bytes]) -> dict[str, str]:
    return {config_id: digest.of_bytes(cubin) for config_id, cubin in sorted(cubins.items())}


@dataclass
class Measured:
    """What one run of the lab measured: records, and per config id the digest of the cubin
    measured and the date it was measured on."""
    cubins: dict[str, str]
    records: list[dict]
    measured_on: dict[str, str]

    def as_json(self) -> dict:
        return {"cubins": self.cubins, "records": self.records, "measured_on": self.measured_on}


NOTHING = Measured({}, [], {})


def checkpoint(path: Path, run_method: dict, measured: Measured) -> None:
    """Keep what a run has measured so far: a run stopped midway resumes from it."""
    cas.write_atomic(Path(path), json.dumps({"method": run_method, **measured.as_json()}).encode())


def resume(path: Path, run_method: dict) -> Measured:
    """What an interrupted run of the same method kept at `path`; nothing if there is no such run."""
    path = Path(path)
    if not path.is_file():
        return NOTHING
    try:
        kept = json.loads(path.read_text())
    except json.JSONDecodeError:
        return NOTHING
    if not same_method(kept.get("method"), run_method) or not {"cubins", "records", "measured_on"} <= set(kept):
        return NOTHING
    return Measured(kept["cubins"], kept["records"], kept["measured_on"])


def reusable(cubins: dict[str, str], sources: list[Measured]) -> Measured:
    """What the sources (earlier runs of this method, the first winning) measured on the cubins
    of `cubins` (digest by config id): their records, kept rather than measured again, each row
    length of a realisation from the first source that measured it with a finite drift."""
    taken = Measured({}, [], {})
    have: set[tuple[str, int]] = set()
    for source in sources:
        same = {config_id for config_id, d in source.cubins.items() if cubins.get(config_id) == d}
        records = [r for r in source.records if r["id"] in same and (r["id"], r["cols"]) not in have
                   and math.isfinite(r["drift"])]
        taken.records += records
        have |= {(r["id"], r["cols"]) for r in records}
        for config_id in same:
            taken.cubins.setdefault(config_id, cubins[config_id])
            taken.measured_on.setdefault(config_id, source.measured_on[config_id])
    return taken


def measure(configs: list[Config], cubins: dict[str, bytes], l2_bytes: int, progress=print,
            keep=None, lengths: dict[str, tuple[int, ...]] | None = None, stop=None) -> list[dict]:
    """One record per (config, row length, row count: FEW_ROWS and the full launch): seconds, bytes
    moved, drift, bit stability; at each config's `lengths` (by id; row_lengths() by default).
    Operators and dtypes are measured in the order of their first config in `configs`, and their
    configs in the order given. `keep(records so far)` runs after each operator and dtype; where
    `stop()` is true before a config, the configs left are not measured (a budget spent)."""
    rng = np.random.default_rng()
    records = []
    lengths = {c.id: (lengths or {}).get(c.id, row_lengths(c)) for c in configs}
    bar = cli_progress.Bar(sum(len(n) for n in lengths.values()), "measuring", unit="item")
    progress = cli_progress.lines_through(bar, progress)
    by_case: dict[tuple, list[Config]] = {}
    for c in configs:
        by_case.setdefault((c.op, c.dtype), []).append(c)
    with driver.Buffer(2 * l2_bytes) as flush:
        for (op_name, dtype_name), group in by_case.items():   # in the order given: the most urgent first
            if stop is not None and stop():
                break
            op, dtype = OPERATORS[op_name], DTYPES[dtype_name]
            drift_cases = {}
            for cols in sorted({n for c in group for n in lengths[c.id]}):
                # one draw and one float64 reference per row length, shared by the realisations
                small = check.Buffers(op, dtype, DRIFT_ROWS, cols)
                inputs = check.draw(op, dtype, DRIFT_ROWS, cols, 0, rng)
                wide = {n: dtype.decode(a).astype(np.float64).reshape(a.shape) for n, a in inputs.items()}
                drift_cases[cols] = (small, inputs, *op.reference(**wide, **dict(op.scalars)))
            for c in group:
                if stop is not None and stop():
                    break
                kernel = driver.Kernel(cubins[c.id], codegen.ENTRY)
                try:
                    for cols in lengths[c.id]:
                        small, inputs, ref, scale = drift_cases[cols]
                        # uploaded again for each realisation: an input left altered on the device
                        # (once every rmsnorm float32 realisation at 32768 columns read inf drift)
                        # must not pass to the next
                        small.upload(inputs)
                        drift, stable = _drift(kernel, small, c.params, inputs, ref, scale, dtype)
                        for rows in launches(cols):
                            timing = check.time_shape(kernel, op, dtype, c.params, (rows, cols), REPETITIONS,
                                                      flush, rng)
                            records.append({"id": c.id, "family": c.family, "dtype": c.dtype, "params": c.params,
                                            "rows": rows, "cols": cols, "seconds": timing["median_seconds"],
                                            "bytes": timing["bytes"], "drift": drift, "bit_stable": stable})
                        bar.advance(now=f"{c.id} at {cols}")
                finally:
                    kernel.unload()
            for small, *_ in drift_cases.values():
                small.free()
            check.release_timing_buffers()
            ids = {c.id for c in group}
            mine = [r for r in records if r["id"] in ids]
            for cols in sorted({r["cols"] for r in mine}):
                full = max(r["rows"] for r in mine if r["cols"] == cols)
                at_full = [r for r in mine if r["cols"] == cols and r["rows"] == full]
                best = min(at_full, key=lambda r: r["seconds"])
                progress(f"  {op_name:9s} {dtype_name:8s} cols {cols:5d}: {len(at_full):3d} realisations, best "
                         f"{best['bytes'] / best['seconds'] / 1e12:.2f} TB/s ({best['id']})")
            if keep is not None:
                keep(records)
    bar.close()
    return records
