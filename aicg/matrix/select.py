"""Choosing the matrix kernels of each class: per workload shape, the fastest valid candidate.

A candidate counts as valid only where its validation record holds checks
that all passed and timings that are positive finite numbers, whatever its
status says; one that failed is never chosen. A pass from an unsigned remote
store is "unverified" (aicg/trust.py), used only where nothing trusted passed
at that shape, and marked so. Where nothing was validated (a build on a
machine without the target GPU, and no record of it), each shape gets the
best *predicted* candidate, marked unvalidated: the runtime refuses it unless
asked not to.

The class's `chosen` kernel, for reports, is the one that serves the most
shapes of the dispatch table.
"""
from __future__ import annotations

import math

UNSIGNED_EVIDENCE = "its validation came from an unsigned remote store, which is not trusted without a signing key"
RANK = {"passed": 0, "unverified": 1, "unvalidated": 2}


def status_of(result: dict) -> tuple[str, str | None]:
    """(status, reason) of a validation record: a pass must hold passing checks and valid timings."""
    status, reason = result.get("status"), result.get("reason")
    if status != "passed":
        return (status if status in ("failed", "unvalidated") else "failed"), reason
    checks, timings = result.get("checks") or [], result.get("timings") or []
    if not checks or not all(c.get("passed") is True for c in checks):
        return "failed", "its validation record holds no passing checks"
    if not timings or not all(isinstance(t.get("median_seconds"), (int, float)) and 0 < t["median_seconds"] < math.inf
                              for t in timings):
        return "failed", "its validation record holds no valid timings"
    return "passed", reason


def _portable(seconds: float | None) -> float | None:
    """Seconds to 9 significant digits (as the row families' selection writes them)."""
    return None if seconds is None else float(f"{seconds:.9g}")


def _row(cand: dict, shapes, result: dict, report: dict, untrusted: bool) -> dict:
    status, reason = status_of(result)
    if status == "passed" and untrusted:
        status, reason = "unverified", UNSIGNED_EVIDENCE
    timed = {tuple(t["shape"]): t["median_seconds"] for t in result.get("timings") or []} \
        if status in ("passed", "unverified") else {}
    return {"id": cand["id"], "family": cand["family"], "template": cand["template"], "tried": cand["tried"],
            "status": status,
            "reason": reason, "predicted_seconds": [_portable(t) for t in cand["predicted_seconds"]],
            "measured_seconds": [_portable(timed.get(tuple(s))) for s in shapes],
            "validated_on": result.get("device") if status in ("passed", "unverified") else None,
            "resources": report.get("resources"), "report_problems": report.get("problems", [])}


def select_class(plan: dict, results: dict, reports: dict, untrusted: set) -> dict:
    """plan: one class of the plan's record; results/reports: candidate id -> validation / compile record."""
    shapes = [tuple(s) for s in plan["shapes"]]
    rows = [_row(c, shapes, results[c["id"]], reports[c["id"]], c["id"] in untrusted) for c in plan["candidates"]]
    dispatch = []
    for i, shape in enumerate(shapes):
        ranked = []
        for r in rows:
            if r["status"] in ("passed", "unverified") and r["measured_seconds"][i] is not None:
                ranked.append(((RANK[r["status"]], r["measured_seconds"][i], r["tried"], r["id"]), r))
            elif r["status"] == "unvalidated" and r["predicted_seconds"][i] is not None:
                ranked.append(((RANK["unvalidated"], r["predicted_seconds"][i], r["tried"], r["id"]), r))
        best = min(ranked, key=lambda e: e[0]) if ranked else None
        if best is None:
            dispatch.append({"m": shape[0], "n": shape[1], "k": shape[2], "candidate": None, "status": None,
                             "measured_seconds": None, "predicted_seconds": None})
            continue
        r = best[1]
        dispatch.append({"m": shape[0], "n": shape[1], "k": shape[2], "candidate": r["id"], "status": r["status"],
                         "measured_seconds": r["measured_seconds"][i], "predicted_seconds": r["predicted_seconds"][i]})
    counts: dict[str, int] = {}
    for d in dispatch:
        if d["candidate"]:
            counts[d["candidate"]] = counts.get(d["candidate"], 0) + 1
    by_id = {r["id"]: r for r in rows}
    chosen = min(counts, key=lambda c: (RANK[by_id[c]["status"]], -counts[c], c)) if counts else None
    status = by_id[chosen]["status"] if chosen else None
    basis = {"passed": "fastest measured of the valid candidates at each shape",
             "unverified": "fastest measured by an unsigned remote store; not verified",
             "unvalidated": "best predicted at each shape; not validated on the target",
             None: "no candidate passed validation" if rows else "no legal candidate"}[status]
    missing = [list(s) for s, d in zip(shapes, dispatch) if d["candidate"] is None]
    return {"name": plan["name"], "chosen": chosen, "status": status, "basis": basis, "candidates": rows,
            "dispatch": dispatch, "shapes_without_kernel": missing}


def select(plan_record: dict, results: dict, reports: dict, untrusted: set = frozenset()) -> dict:
    return {"classes": {c["name"]: select_class(c, results, reports, untrusted) for c in plan_record["classes"]}}
