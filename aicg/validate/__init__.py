"""Validation: a kernel is never trusted until checked on the target hardware.

Without a GPU of the target's kind a candidate is recorded as unvalidated
(its result is not a fact, so it is never cached); with one, it is checked
against float64 and timed (see check.py).
"""
from __future__ import annotations

from ..hw import Hardware
from ..runtime import driver
from ..semantics import accuracy


# Sizes off every block and vector width, and many rows of a short length
# (tiny rows, several to a thread, not filling the last block's rows); then
# rows lying apart in a wider matrix (rows, cols, row stride): a stride that
# keeps packs aligned, one that allows no packs, and tiny rows apart.
AWKWARD_SHAPES = ((3, 1), (2051, 3), (5, 7), (37, 1000), (9, 4097), (3001, 33),
                  (37, 1000, 1024), (9, 4096, 4099), (1027, 2, 5))


def settings(prof, dtype: str, timed_shapes, checked_shapes=(), longest_row: int | None = None) -> dict:
    """How a profile asks `dtype` kernels to be checked: its preservation, trials and timing, on the
    awkward shapes, the timed shapes and `checked_shapes`, their rows cut to `longest_row` (the
    longest a kernel's order keeps the bound on: it is never run on longer ones)."""
    shapes = AWKWARD_SHAPES + tuple(timed_shapes) + tuple(checked_shapes)
    return {"tolerance": prof.preservation.tolerance[dtype],
            "deterministic": prof.preservation.axes["deterministic"],
            "bitwise": prof.preservation.axes["order"] == "reference",
            "check_shapes": accuracy.clip_shapes(shapes, longest_row),
            "timed_shapes": tuple(timed_shapes), "trials": prof.validation_trials,
            "repetitions": prof.timing_repetitions}


def local_device_state():
    """What this machine can validate on: part of a validation step's freshness, not its key."""
    dev = driver.probe_device()
    return None if dev is None else [dev.name, list(dev.compute_capability), dev.sm_count]


def validate_on_device(cubin: bytes, hardware: Hardware, op: str, dtype: str, params: dict, *,
                       tolerance, deterministic: bool, bitwise: bool, check_shapes, timed_shapes, trials: int,
                       repetitions: int) -> dict:
    """check.run's report, run in a worker process (isolated.py): a kernel that faults or never
    finishes fails, with `fault` saying what happened, and the caller's process is unharmed."""
    dev = driver.probe_device()
    reason = _not_the_target(dev, hardware)
    if reason:
        return {"status": "unvalidated", "reason": reason}
    from . import isolated
    # msgpack carries tuples as lists: check_here turns them back
    reply = isolated.worker.call("aicg.validate:check_here", kwargs={
        "cubin": cubin, "op": op, "dtype": dtype, "params": params, "tolerance": tolerance,
        "deterministic": deterministic, "bitwise": bitwise, "check_shapes": check_shapes,
        "timed_shapes": timed_shapes, "trials": trials, "repetitions": repetitions,
        "peak_bytes_per_second": hardware.fact("dram_bandwidth")})
    if "fault" in reply:
        return {"status": "failed", "device": dev.name, "fault": reply["fault"], "checks": [], "timings": [],
                "implausibly_fast": []}
    return reply["result"]


def check_here(cubin: bytes, op: str, dtype: str, params: dict, tolerance, deterministic: bool, bitwise: bool,
               check_shapes, timed_shapes, trials: int, repetitions: int, peak_bytes_per_second: float) -> dict:
    """check.run on this process's GPU (the worker's side of validate_on_device)."""
    from . import check
    return check.run(cubin, op, dtype, params, tolerance=tuple(tolerance), deterministic=deterministic,
                     bitwise=bitwise, check_shapes=[tuple(s) for s in check_shapes],
                     timed_shapes=[tuple(s) for s in timed_shapes], trials=trials, repetitions=repetitions,
                     device=driver.probe_device(), peak_bytes_per_second=peak_bytes_per_second)


def _not_the_target(dev, hardware: Hardware) -> str | None:
    """Why this machine's GPU cannot stand for the target; None where it can."""
    if dev is None:
        return "no GPU on this machine"
    if dev.name != hardware.name or dev.compute_capability != hardware.compute_capability:
        return (f"this machine's GPU is {dev.name} (sm_{dev.compute_capability[0]}{dev.compute_capability[1]}), "
                f"not the target {hardware.name}")
    return None


def time_on_device(kernels: list[tuple[bytes, dict]], hardware: Hardware, op: str, dtype: str, shape,
                   repetitions: int) -> list[float] | None:
    """Median seconds of each (cubin, params) at `shape` on this machine's GPU; None unless it is the target."""
    dev = driver.probe_device()
    if _not_the_target(dev, hardware):
        return None
    from . import check
    return check.time_kernels(kernels, op, dtype, shape, repetitions, dev)


def same_bits_on_device(kernels: list[tuple[bytes, dict]], hardware: Hardware, op: str, dtype: str,
                        shapes) -> list[bool] | None:
    """check.same_bits on this machine's GPU; None unless it is the target."""
    if _not_the_target(driver.probe_device(), hardware):
        return None
    from . import check
    return check.same_bits(kernels, op, dtype, shapes)


def why_failed(report: dict) -> str:
    """What a failed validation report found first, in a line ("" for a pass or no verdict)."""
    if report["status"] != "failed":
        return report.get("reason", "") if report["status"] == "unvalidated" else ""
    if report.get("fault"):
        return f"the kernel faulted: {report['fault']}"
    for c in report.get("checks", []):
        if c["passed"]:
            continue
        found = [f"{c['unwritten']} outputs unwritten"] if c.get("unwritten") else []
        if not c.get("within_bound", True) or c.get("bitwise_reference_order") is False:
            found.append(f"error {c['worst_error_over_bound']:.3g}x the bound (max |y - ref| {c['max_abs_error']:.3g})")
        found += [what for key, what in (("input_intact", "input overwritten"),
                                         ("output_bounds_kept", "wrote outside its output"),
                                         ("repeatable", "bits differ between runs"),
                                         ("fresh_output", "a second input gave a wrong output")) if c.get(key) is False]
        return f"{c['shape'][0]}x{c['shape'][1]} trial {c['trial']}: {', '.join(found) or 'check failed'}"
    if report.get("implausibly_fast"):
        return f"implausibly fast at {report['implausibly_fast']} (faster than the memory system)"
    return "failed"
